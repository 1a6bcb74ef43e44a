package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// TestCheckSandboxes runs checks with a reuse_key: many checks, one after
// another and at once, run in one warm sandbox pod, each in its own folder
// (deleted after); another key gets another sandbox; a restarted gateway
// uses the sandbox it finds; a sandbox deleted by hand is replaced, never
// reused; idle sandboxes go after the TTL.
func TestCheckSandboxes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	const ns = "sandbox"
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, ns, "{}\n", "")
	opts := gatewayOptions{resourceDir: resourceScripts(t), sandboxTTL: 10 * time.Second, retain: 2 * time.Second} // the TTL outlasts the steps below on a loaded machine, the restart included
	g := startGateway(t, dir, opts)
	g.waitTarget(t, ns, 10*time.Second, running)
	api, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)

	check := func(handle, key string) wire.View {
		t.Helper()
		versions, err := api.CheckResource(ctx, client.ResourceStep{Handle: handle, Image: "git-resource",
			Source: map[string]string{"uri": "git://x"}, ReuseKey: key})
		require.NoError(t, err, handle)
		assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions, handle)
		return g.step(t, handle)
	}
	live := func() []string {
		t.Helper()
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: steps.SandboxLabel})
		require.NoError(t, err)
		var names []string
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		return names
	}

	first := check("warm-0", "repo-x")
	sandbox := first.Pod
	require.True(t, strings.HasPrefix(sandbox, "check-"), sandbox)
	for i := 1; i < 5; i++ {
		assert.Equal(t, sandbox, check(fmt.Sprintf("warm-%d", i), "repo-x").Pod)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { assert.Equal(t, sandbox, check(fmt.Sprintf("together-%d", i), "repo-x").Pod) })
	}
	wg.Wait()
	assert.Equal(t, []string{sandbox}, live(), "nine checks, one pod")
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, sandbox, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, p.Labels, steps.HandleLabel, "a sandbox is no step's pod")
	assert.Len(t, p.Spec.Containers, 1, "no volume sidecar: checks have no volumes")
	assert.Equal(t, float64(8), metricValue(t, g, `jetway_check_sandbox_checks_total{sandbox="warm"}`))
	runs := filepath.Join(c.StepRoot(ns, sandbox), "runs")
	require.Eventually(t, func() bool {
		entries, err := os.ReadDir(runs)
		return err == nil && len(entries) == 0
	}, 10*time.Second, 50*time.Millisecond, "each check's folder, with its log, is deleted once it was kept for retain")

	other := check("other-0", "repo-y")
	assert.NotEqual(t, sandbox, other.Pod, "another key, another sandbox")

	// A restarted gateway finds the sandbox and uses it.
	addr := strings.TrimPrefix(g.base, "http://")
	g.stop()
	opts.listen = addr
	g = startGateway(t, dir, opts)
	g.waitTarget(t, ns, 10*time.Second, running)
	assert.Equal(t, sandbox, check("after-restart", "repo-x").Pod)

	// Deleted by hand: the next check gets a new sandbox.
	require.NoError(t, c.Client.CoreV1().Pods(ns).Delete(ctx, sandbox, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, sandbox, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 30*time.Second, 50*time.Millisecond)
	replaced := check("after-delete", "repo-x").Pod
	assert.NotEqual(t, sandbox, replaced)
	assert.Equal(t, replaced, check("after-delete-2", "repo-x").Pod)
	assert.Contains(t, live(), replaced)

	// Idle past the TTL, every sandbox goes.
	require.Eventually(t, func() bool { return len(live()) == 0 }, 30*time.Second, 100*time.Millisecond)
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_check_sandboxes_deleted_total{reason="idle"}`), float64(1))
	assert.Equal(t, float64(1), metricValue(t, g, `jetway_check_sandboxes_deleted_total{reason="broken"}`))

	code, _, body := g.submitStep(t, "", wire.Request{Handle: "task-reuse", Type: "task", Image: "i",
		Run: wire.Run{Path: "true"}, ReuseKey: "k"})
	assert.Equal(t, 400, code)
	assert.Contains(t, body, `"field":"reuse_key"`)
}

// TestLandingDeletesIdleSandboxes: a landing target's idle sandbox goes at
// once, so the target lands without waiting out the sandbox TTL.
func TestLandingDeletesIdleSandboxes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	const ns = "sandbox-land"
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, ns, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{resourceDir: resourceScripts(t)}) // the default TTL, ten minutes
	g.waitTarget(t, ns, 10*time.Second, running)
	api, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	_, err = api.CheckResource(ctx, client.ResourceStep{Handle: "c", Image: "git-resource",
		Source: map[string]string{"uri": "git://x"}, ReuseKey: "repo"})
	require.NoError(t, err)
	sandbox := g.step(t, "c").Pod

	g.land(t, ns)
	g.waitTarget(t, ns, 30*time.Second, inState("landed"))
	_, err = c.Client.CoreV1().Pods(ns).Get(ctx, sandbox, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the sandbox is gone: %v", err)
	assert.Equal(t, float64(1), metricValue(t, g, `jetway_check_sandboxes_deleted_total{reason="target"}`))
}

// cutAfterFrames passes a sandbox session's output on until frames
// complete frames of a run's log went through, then the first bytes of the
// next one (frames 0: of the first), and drops the exec, as a connection
// broken mid-frame does. frames is asked of next when the first bytes of a
// log arrive, so a session that never carried one (its exec refused) takes
// no turn; cut is called when it cuts. It re-muxes each frame of the log on
// its own, so where the cut falls does not depend on how the agent's reads
// chunk the log.
type cutAfterFrames struct {
	w      io.Writer
	next   func() int
	cut    func()
	drop   context.CancelFunc
	frames int
	asked  bool

	in   bytes.Buffer             // the session's output not parsed yet
	logs map[string]*bytes.Buffer // each run's log not passed on yet
}

func (c *cutAfterFrames) Write(p []byte) (int, error) {
	c.in.Write(p)
	for {
		raw := c.in.Bytes()
		if len(raw) < stepagent.HeaderSize {
			return len(p), nil
		}
		size := stepagent.HeaderSize + int(binary.BigEndian.Uint32(raw[1:5]))
		if len(raw) < size {
			return len(p), nil
		}
		f, err := stepagent.ReadFrame(&c.in)
		if err != nil {
			return 0, err
		}
		if f.Kind != stepagent.KindMux {
			if err := stepagent.WriteFrameAt(c.w, f.Kind, f.Time, f.Payload); err != nil {
				return 0, err
			}
			continue
		}
		prefix := f.Payload[:1+int(f.Payload[0])]
		if !c.asked {
			c.frames, c.asked = c.next(), true
		}
		if c.logs == nil {
			c.logs = map[string]*bytes.Buffer{}
		}
		log := c.logs[string(prefix)]
		if log == nil {
			log = &bytes.Buffer{}
			c.logs[string(prefix)] = log
		}
		log.Write(f.Payload[len(prefix):])
		for log.Len() >= stepagent.HeaderSize {
			size := stepagent.HeaderSize + int(binary.BigEndian.Uint32(log.Bytes()[1:5]))
			if log.Len() < size {
				break
			}
			if c.frames == 0 {
				part := append(bytes.Clone(prefix), log.Bytes()[:size-1]...)
				_ = stepagent.WriteFrameAt(c.w, stepagent.KindMux, f.Time, part)
				c.drop()
				c.cut()
				return 0, errors.New("cut by the test")
			}
			whole := append(bytes.Clone(prefix), log.Next(size)...)
			if err := stepagent.WriteFrameAt(c.w, stepagent.KindMux, f.Time, whole); err != nil {
				return 0, err
			}
			c.frames--
		}
	}
}

// TestCheckSurvivesABrokenSession: every sandbox session breaks after its
// first bytes; each check goes on by exec from the last complete frame it
// had, and ends once, with its answer and its whole log. A session the
// kubelet refuses before any byte (kwok may not know the new pod's exec
// yet) is not cut, so checks run until three sessions were.
func TestCheckSurvivesABrokenSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	const ns = "sandbox-cut"
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, ns, "{}\n", "")
	// The first session breaks inside the first frame of the check's log,
	// the next ones after one and two frames: checks go on from offset 0
	// and from further on.
	var sessions, cuts atomic.Int32
	next := func() int { return min(int(sessions.Add(1)-1), 2) }
	cutting := func(ctx context.Context, tg *targets.Target, pod string, cmd []string, stdin io.Reader, stdout io.Writer) error {
		ctx, drop := context.WithCancel(ctx)
		defer drop()
		cut := &cutAfterFrames{w: stdout, next: next, cut: func() { cuts.Add(1) }, drop: drop}
		return steppod.ExecPod(ctx, tg, pod, cmd, stdin, cut)
	}
	g := startGateway(t, dir, gatewayOptions{resourceDir: resourceScripts(t), execStream: cutting})
	g.waitTarget(t, ns, 10*time.Second, running)
	api, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	var pod string
	for i := 0; cuts.Load() < 3; i++ {
		require.Less(t, i, 6, "three sessions cut within six checks")
		var log strings.Builder
		handle := fmt.Sprintf("cut-%d", i)
		versions, err := api.CheckResource(ctx, client.ResourceStep{Handle: handle, Image: "git-resource",
			Source: map[string]string{"uri": "git://x"}, ReuseKey: "repo", OnEvent: func(e wire.Event) {
				if e.Type == wire.EventStderr {
					log.WriteString(e.Data)
				}
			}})
		require.NoError(t, err)
		assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions)
		assert.Equal(t, `check got {"source":{"uri":"git://x"},"version":null}`+"\n", log.String(), "the log once, whole")
		v := g.step(t, handle)
		if i == 0 {
			pod = v.Pod
		}
		assert.Equal(t, pod, v.Pod, "a broken session does not break its sandbox")
	}
	// A session kwok refused may be logged too, with its own error: count
	// the ones the test cut.
	cutLines := regexp.MustCompile(`check's session broke; going on by exec[^\n]*"error":"sandbox session: context canceled"`)
	assert.Len(t, cutLines.FindAllString(g.logs.String(), -1), 3, "once per cut session")
	assert.Contains(t, g.logs.String(), `"offset":0`)
	assert.Regexp(t, `going on by exec[^\n]*"offset":[1-9]`, g.logs.String())
}
