package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// replica is one `gateway run` process of two sharing targets, as the
// chart runs them: one targets dir, one state namespace, a mesh between
// them; it is started again on the same addresses.
type replica struct {
	name      string
	api, mesh string // addresses
	args      []string
	proc      *gatewayProcess
	all       []*gatewayProcess // every process it ran, for their logs
}

func (r *replica) base() string { return "http://" + r.api }

// start runs the replica's process, waiting until it serves.
func (r *replica) start(t *testing.T) {
	t.Helper()
	r.proc = startGatewayProcess(t, r.args...)
	r.all = append(r.all, r.proc)
}

// logged counts the lines of every process of the replica with msg and
// each of the strings and.
func (r *replica) logged(msg string, and ...string) int {
	n := 0
	for _, p := range r.all {
		for line := range strings.Lines(p.logs.String()) {
			if strings.Contains(line, `"msg":"`+msg+`"`) && !slices.ContainsFunc(and, func(s string) bool { return !strings.Contains(line, s) }) {
				n++
			}
		}
	}
	return n
}

// kill ends the process with SIGKILL: no chance to stop cleanly.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, r.proc.cmd.Process.Signal(syscall.SIGKILL))
	_ = r.proc.wait(t, 10*time.Second)
}

// restart stops the process with SIGTERM and starts it again.
func (r *replica) restart(t *testing.T) {
	t.Helper()
	require.NoError(t, r.proc.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, r.proc.wait(t, 30*time.Second), "a clean stop")
	r.start(t)
}

// replicas starts two replicas over the targets in dir, with flags.
func replicas(t *testing.T, dir string, flags ...string) [2]*replica {
	t.Helper()
	return replicasOf(t, meshtest.NewCA(t, "replicas-ca"), dir, flags...)
}

// replicasOf is replicas whose mesh certificates ca issues (an agent
// joins them with one of its own).
func replicasOf(t *testing.T, ca *meshtest.CA, dir string, flags ...string) [2]*replica {
	t.Helper()
	state := newState(t)
	var rs [2]*replica
	for i := range rs {
		rs[i] = &replica{name: fmt.Sprintf("replica-%d", i), api: freeAddr(t), mesh: freeAddr(t)}
	}
	for i, r := range rs {
		caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), r.name, time.Now().Add(time.Hour))
		r.args = append([]string{"run", "--listen", r.api, "--targets-dir", dir, "--no-auth", "--log-level", "debug",
			"--health-interval", "1s", "--shutdown-timeout", "5s", "--step-kill-grace", "2s",
			"--mesh-listen", r.mesh, "--mesh-peers", rs[1-i].mesh, "--mesh-stall-after", "5s",
			"--mesh-ca", caFile, "--mesh-cert", certFile, "--mesh-key", keyFile}, state.flags(t)...)
		r.args = append(r.args, flags...)
	}
	for _, r := range rs {
		r.start(t)
	}
	return rs
}

// taskWatch follows a target's step pods and keeps the largest number of
// unfinished task pods it ever saw at once.
type taskWatch struct {
	max atomic.Int32
}

func watchTasks(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) *taskWatch {
	t.Helper()
	w, err := c.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: targets.StepTypeLabel + "=task"})
	require.NoError(t, err)
	tw := &taskWatch{}
	done := make(chan struct{})
	t.Cleanup(func() { w.Stop(); <-done })
	go func() {
		defer close(done)
		unfinished := map[string]bool{}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Deleted || targets.Finished(p):
				delete(unfinished, p.Name)
			default:
				unfinished[p.Name] = true
			}
			if n := int32(len(unfinished)); n > tw.max.Load() {
				tw.max.Store(n)
			}
		}
	}()
	return tw
}

// retrying calls f until it succeeds, it fails with an answer that will
// not change (a 4xx), or ctx ends: a replica killed answers nothing until
// it is back.
func retrying(ctx context.Context, f func() error) error {
	for {
		err := f()
		var apiErr *client.APIError
		if err == nil || errors.As(err, &apiErr) && apiErr.StatusCode < 500 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// replicaStep is one of the test's steps: how it is run, and what it
// must print.
type replicaStep struct {
	req    wire.Request
	upload string // a folder to upload as input "up"
	check  string // a check's reuse key
	want   string // its stdout
}

// TestReplicasShareTargets: two `gateway run` processes own three targets
// as the chart runs them (one targets dir, one state namespace, a mesh
// between them), limit-active-tasks 2. 200 steps of mixed types go to
// either: tasks with an input from an earlier step, tasks with an upload,
// plain tasks, and checks with a reuse_key. One replica is SIGKILLed
// mid-way and started again; then both are restarted one after the other.
// Every step ends exactly once with its whole output, every task's
// process ran once (each appends its handle to a marker file), no pod was
// deleted by a gateway that did not own it (the API servers' audit logs),
// a watch of each target never saw more than 2 unfinished task pods, and
// ?since=N gives the same events from either replica.
func TestReplicasShareTargets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	places := []struct {
		c    *cluster.Cluster
		name string
	}{{clusters[0], "rep-a"}, {clusters[0], "rep-b"}, {clusters[1], "rep-c"}}
	watches := map[string]*taskWatch{}
	for _, p := range places {
		placeTarget(ctx, t, p.c, dir, p.name, "{}\n", "")
		watches[p.name] = watchTasks(ctx, t, p.c, p.name)
	}
	markers := filepath.Join(t.TempDir(), "markers")
	rs := replicas(t, dir, "--placement-strategy", "volume-locality,limit-active-tasks", "--max-active-tasks-per-target", "2",
		"--resource-dir", resourceScripts(t), "--step-agent-image", "ghcr.io/jetway-ci/step-agent:test")
	var clients [2]*client.Client
	for i, r := range rs {
		c, err := client.New(client.Options{URL: r.base(), Retry: 50 * time.Millisecond})
		require.NoError(t, err)
		clients[i] = c
		eventually(t, 30*time.Second, func() error {
			var list []struct{ Name, State string }
			resp, err := http.Get(r.base() + "/api/v1/workers")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
				return err
			}
			running := 0
			for _, w := range list {
				if w.State == "running" {
					running++
				}
			}
			if running != 3 {
				return errorf("%s: %d of 3 targets running", r.name, running)
			}
			return nil
		})
	}

	task := func(handle, script string) wire.Request {
		req := shStep(handle, `echo "$H" >> "$M"; `+script+`; i=1; while [ $i -le 20 ]; do echo "line $i"; i=$((i+1)); done; sleep 0.3`)
		req.Run.Env = map[string]string{"H": handle, "M": markers}
		return req
	}
	lines := ""
	for i := 1; i <= 20; i++ {
		lines += fmt.Sprintf("line %d\n", i)
	}
	var seeds, rest []replicaStep
	for i := range 20 {
		req := task(fmt.Sprintf("seed-%d", i), fmt.Sprintf(`echo seed-%d > out/file`, i))
		req.Outputs = []wire.Output{{Name: "out"}}
		seeds = append(seeds, replicaStep{req: req, want: lines})
	}
	for i := range 40 {
		req := task(fmt.Sprintf("in-%d", i), `cat in/file`)
		req.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: fmt.Sprintf("seed-%d", i%20), Output: "out"}}}
		rest = append(rest, replicaStep{req: req, want: fmt.Sprintf("seed-%d\n", i%20) + lines})
	}
	for i := range 40 {
		up := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(up, "f"), fmt.Appendf(nil, "upload %d\n", i), 0o644))
		req := task(fmt.Sprintf("up-%d", i), `cat up/f`)
		req.Inputs = []wire.Input{{Name: "up", From: wire.InputSource{Upload: true}}}
		rest = append(rest, replicaStep{req: req, upload: up, want: fmt.Sprintf("upload %d\n", i) + lines})
	}
	for i := range 40 {
		rest = append(rest, replicaStep{req: task(fmt.Sprintf("plain-%d", i), "true"), want: lines})
	}
	for i := range 60 {
		rest = append(rest, replicaStep{req: wire.Request{Handle: fmt.Sprintf("check-%d", i)}, check: fmt.Sprintf("repo-%d", i%3)})
	}

	var ended atomic.Int32
	run := func(i int, s replicaStep) {
		c := clients[i%2]
		if s.check != "" {
			var versions []client.Version
			err := retrying(ctx, func() (err error) {
				versions, err = c.CheckResource(ctx, client.ResourceStep{Handle: s.req.Handle, Image: "git-resource",
					Source: map[string]string{"uri": "git://x"}, ReuseKey: s.check})
				return err
			})
			assert.NoError(t, err, s.req.Handle)
			assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions, s.req.Handle)
			ended.Add(1)
			return
		}
		var v wire.View
		assert.NoError(t, retrying(ctx, func() (err error) { v, _, err = c.SubmitStep(ctx, s.req); return err }), s.req.Handle)
		if s.upload != "" {
			err := retrying(ctx, func() error { _, err := c.UploadInput(ctx, "", s.req.Handle, "up", s.upload); return err })
			if !errors.Is(err, client.ErrConflict) { // in already: its answer was lost with a replica
				assert.NoError(t, err, s.req.Handle)
			}
		}
		assert.NoError(t, c.Follow(ctx, "", s.req.Handle, 0, func(wire.Event) error { return nil }), s.req.Handle)
		assert.NoError(t, retrying(ctx, func() (err error) { v, err = c.Step(ctx, "", s.req.Handle); return err }))
		assert.Equal(t, wire.Succeeded, v.Phase, "%s: %+v", s.req.Handle, v)
		ended.Add(1)
	}
	work := func(list []replicaStep) {
		todo := make(chan int)
		var wg sync.WaitGroup
		for range 24 {
			wg.Go(func() {
				for i := range todo {
					run(i, list[i])
				}
			})
		}
		for i := range list {
			todo <- i
		}
		close(todo)
		wg.Wait()
	}

	// The replicas die and restart while the steps run.
	var chaos sync.WaitGroup
	chaos.Go(func() {
		at := func(n int32) bool {
			for ended.Load() < n {
				if ctx.Err() != nil {
					return false
				}
				time.Sleep(50 * time.Millisecond)
			}
			return true
		}
		if !at(60) {
			return
		}
		t.Log("SIGKILL replica-0")
		rs[0].kill(t)
		time.Sleep(time.Second)
		rs[0].start(t)
		if !at(130) {
			return
		}
		t.Log("restart replica-1, then replica-0")
		rs[1].restart(t)
		rs[0].restart(t)
	})
	work(seeds)
	work(rest)
	chaos.Wait()
	all := append(seeds, rest...)
	require.Equal(t, int32(len(all)), ended.Load())

	// Each task's process ran once.
	raw, err := os.ReadFile(markers)
	require.NoError(t, err)
	ran := map[string]int{}
	for _, h := range strings.Fields(string(raw)) {
		ran[h]++
	}
	for _, s := range all {
		if s.check == "" {
			assert.Equal(t, 1, ran[s.req.Handle], "%s ran once", s.req.Handle)
		}
	}

	// The same events from either replica, each once, numbered from 0,
	// ending once; a task's whole output.
	for _, s := range all {
		var got [2][]byte
		for i, r := range rs {
			code, body, _ := call(t, http.MethodGet, r.base()+"/api/v1/steps/"+s.req.Handle+"/events", "")
			require.Equal(t, http.StatusOK, code, "%s from %s: %s", s.req.Handle, r.name, body)
			got[i] = []byte(body)
		}
		assert.Equal(t, string(got[0]), string(got[1]), "%s: the same events from either replica", s.req.Handle)
		var evs []wire.Event
		dec := json.NewDecoder(bytes.NewReader(got[0]))
		for {
			var e wire.Event
			if err := dec.Decode(&e); err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			evs = append(evs, e)
		}
		require.NotEmpty(t, evs, s.req.Handle)
		ends := 0
		for i, e := range evs {
			assert.Equal(t, i, e.N, "%s: no gap, no repeat", s.req.Handle)
			if e.Type == wire.EventExited || e.Type == wire.EventFailed {
				ends++
			}
		}
		assert.Equal(t, 1, ends, s.req.Handle)
		assert.Equal(t, wire.EventExited, evs[len(evs)-1].Type, s.req.Handle)
		if s.check == "" {
			assert.Equal(t, s.want, outputOf(evs, wire.EventStdout), s.req.Handle)
		}
		mid := len(evs) / 2
		var since [2]string
		for i, r := range rs {
			_, since[i], _ = call(t, http.MethodGet, fmt.Sprintf("%s/api/v1/steps/%s/events?since=%d", r.base(), s.req.Handle, mid), "")
		}
		assert.Equal(t, since[0], since[1], "%s: ?since=%d", s.req.Handle, mid)
	}

	// Released through either replica, each task's pod is deleted by its
	// owner.
	var released sync.WaitGroup
	for i, s := range all {
		if s.check != "" {
			continue
		}
		released.Go(func() {
			code, body, _ := call(t, http.MethodDelete, rs[i%2].base()+"/api/v1/steps/"+s.req.Handle, "")
			assert.Equal(t, http.StatusOK, code, "release %s: %s", s.req.Handle, body)
		})
	}
	released.Wait()
	for _, p := range places {
		eventually(t, 30*time.Second, func() error {
			list, err := p.c.Client.CoreV1().Pods(p.name).List(ctx, metav1.ListOptions{LabelSelector: steps.HandleLabel})
			if err != nil {
				return err
			}
			if len(list.Items) > 0 {
				return errorf("%s: %d step pods left", p.name, len(list.Items))
			}
			return nil
		})
	}

	// No pod deleted by a gateway that did not own it; none more than 2
	// unfinished task pods on a target.
	deletes := 0
	for _, c := range []*cluster.Cluster{clusters[0], clusters[1]} {
		list, err := c.PodDeletes()
		require.NoError(t, err)
		for _, d := range list {
			id, ok := strings.CutPrefix(d.UserAgent, "jetway/")
			if !ok || d.Pod == nil || !strings.HasPrefix(d.Namespace, "rep-") {
				continue
			}
			deletes++
			assert.Equal(t, d.Pod.Labels[ownership.OwnerLabel], id, "pod %s/%s deleted by %s", d.Namespace, d.Name, id)
		}
	}
	t.Logf("%d pod deletes by the replicas, each by the pod's owner", deletes)
	takeovers := rs[0].logged("step taken over") + rs[1].logged("step taken over")
	t.Logf("%d steps taken over from a replica gone", takeovers)
	assert.Positive(t, takeovers, "the kill and the restarts left steps to take over")
	assert.GreaterOrEqual(t, deletes, 140, "every task's pod, deleted by a replica")
	for name, w := range watches {
		assert.LessOrEqual(t, w.max.Load(), int32(2), "unfinished task pods on %s at once", name)
		assert.Equal(t, int32(2), w.max.Load(), "%s was used to its limit", name)
	}
}
