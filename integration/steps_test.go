package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// submitStep posts a step with token ("" for a gateway without tokens),
// once the gateway has found the steps in its targets' pods (before, it
// answers 503).
func (g *gateway) submitStep(t *testing.T, token string, req wire.Request) (int, wire.View, string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error { return g.steps.Ready() })
	body, err := json.Marshal(req)
	require.NoError(t, err)
	hreq, err := http.NewRequest(http.MethodPost, g.base+"/api/v1/steps", bytes.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		hreq.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(hreq)
	require.NoError(t, err)
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	resp.Body.Close()
	var v wire.View
	if resp.StatusCode < 300 {
		require.NoError(t, json.Unmarshal(raw.Bytes(), &v), raw.String())
	}
	return resp.StatusCode, v, raw.String()
}

// run submits a step and requires it accepted.
func (g *gateway) run(t *testing.T, req wire.Request) wire.View {
	t.Helper()
	code, v, body := g.submitStep(t, g.token, req)
	require.Equal(t, http.StatusAccepted, code, body)
	return v
}

// stepEvents follows a step's events from since to its end, within ctx.
func (g *gateway) stepEvents(ctx context.Context, t *testing.T, handle, query string, since int) []wire.Event {
	t.Helper()
	return <-g.followEvents(ctx, t, handle, query, since)
}

// followEvents follows a step's events from since to its end in the
// background, as a client does while it acts on the step.
func (g *gateway) followEvents(ctx context.Context, t *testing.T, handle, query string, since int) <-chan []wire.Event {
	t.Helper()
	out := make(chan []wire.Event, 1)
	url := fmt.Sprintf("%s/api/v1/steps/%s/events?since=%d%s", g.base, handle, since, query)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	if g.token != "" {
		req.Header.Set("Authorization", "Bearer "+g.token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	go func() {
		defer resp.Body.Close()
		var evs []wire.Event
		dec := json.NewDecoder(resp.Body)
		for {
			var e wire.Event
			if err := dec.Decode(&e); err != nil {
				assert.ErrorIs(t, err, io.EOF, "events of %s", handle)
				out <- evs
				return
			}
			evs = append(evs, e)
		}
	}()
	return out
}

// waitEvents waits until the step has n events.
func (g *gateway) waitEvents(t *testing.T, handle string, n int) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		if v := g.step(t, handle); v.Events < n {
			return errorf("%s: %d events so far", handle, v.Events)
		}
		return nil
	})
}

// step reads a step's view.
func (g *gateway) step(t *testing.T, handle string) wire.View {
	t.Helper()
	var v wire.View
	g.get(t, "/api/v1/steps/"+handle, &v)
	return v
}

// outputOf joins the data of a step's events of one type.
func outputOf(evs []wire.Event, typ string) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == typ {
			b.WriteString(e.Data)
		}
	}
	return b.String()
}

// types lists the event types, without output chunks.
func types(evs []wire.Event) []string {
	var out []string
	for i, e := range evs {
		if e.N != i {
			out = append(out, "gap at "+strconv.Itoa(i))
		}
		if e.Type != wire.EventStdout && e.Type != wire.EventStderr {
			out = append(out, e.Type)
		}
	}
	return out
}

func shStep(handle, script string) wire.Request {
	return wire.Request{Handle: handle, Type: "task", Image: "busybox:1.37",
		Run: wire.Run{Path: "sh", Args: []string{"-c", script}}}
}

// TestStepOutputAndExitStatus runs tasks on a real cluster whose output is
// checked line by line, per stream, and whose exit status is exact.
func TestStepOutputAndExitStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[0], "st-out", "team: main\n", gatewayOptions{})

	for _, code := range []int{0, 1, 42} {
		handle := "exit-" + strconv.Itoa(code)
		req := shStep(handle, fmt.Sprintf(`for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; done; printf 'no newline'; exit %d`, code))
		req.Team = "main"
		req.Run.Env = map[string]string{"GREETING": "hello from env"}
		v := g.run(t, req)
		assert.Equal(t, handle, v.Handle)

		evs := g.stepEvents(ctx, t, handle, "&team=main", 0)
		assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, types(evs))
		assert.Equal(t, "out 1\nout 2\nout 3\nno newline", outputOf(evs, wire.EventStdout))
		assert.Equal(t, "err 1\nerr 2\nerr 3\n", outputOf(evs, wire.EventStderr))
		last := evs[len(evs)-1]
		require.NotNil(t, last.ExitStatus)
		assert.Equal(t, code, *last.ExitStatus)

		var view wire.View
		g.get(t, "/api/v1/steps/"+handle+"?team=main", &view)
		want := wire.Succeeded
		if code != 0 {
			want = wire.Failed
		}
		assert.Equal(t, want, view.Phase)
		assert.Equal(t, "st-out", view.Target)
		assert.False(t, view.StartedAt.IsZero() || view.FinishedAt.Before(view.StartedAt), "%+v", view)

		eventually(t, 5*time.Second, func() error {
			pod, err := clusters[0].Client.CoreV1().Pods("st-out").Get(ctx, view.Pod, metav1.GetOptions{})
			switch {
			case err != nil:
				return err
			case pod.Labels["jetway-ci.dev/step"] != handle || pod.Labels["jetway-ci.dev/team"] != "main" ||
				pod.Labels["jetway-ci.dev/step-type"] != "task":
				return errorf("pod labels %v", pod.Labels)
			case pod.Annotations["jetway-ci.dev/step-ended"] == "":
				return errorf("pod %s not marked ended: an ended step must stop counting", pod.Name)
			}
			return nil
		})
	}
	// The environment is the step's: a variable given is seen.
	req := shStep("env", `echo "$GREETING"`)
	req.Team, req.Run.Env = "main", map[string]string{"GREETING": "hello from env"}
	g.run(t, req)
	evs := g.stepEvents(ctx, t, "env", "&team=main", 0)
	assert.Equal(t, "hello from env\n", outputOf(evs, wire.EventStdout))
	g.waitCounts(t, "st-out", counts{volumes: 4}, 5*time.Second)
}

// TestStepInputsAndOutputsAcrossClusters feeds a step from a pod's volume
// on another cluster, and a later step on the other cluster from its
// output: each input arrives whole, with its SHA-256.
func TestStepInputsAndOutputsAcrossClusters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "io-a", "tags: [a]\n", "")
	placeTarget(ctx, t, clusters[1], dir, "io-b", "tags: [b]\n", "")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "io-a", 10*time.Second, running)
	g.waitTarget(t, "io-b", 10*time.Second, running)

	// A volume on cluster B, as an earlier step would have left it.
	src := volumePod(ctx, t, clusters[1], "io-b", "artifact")
	data := fill(t, src, "vol", 256<<10)
	sum := sha256.Sum256(data)

	// A task on cluster A reads it and writes an output.
	produce := shStep("produce", `sha256sum src/out/artifact.bin | cut -d' ' -f1 > out/sum; printf 'from A' > out/note; cat out/sum`)
	produce.Tags = []string{"a"}
	produce.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Target: "io-b", Pod: "artifact", Handle: "vol"}}}
	produce.Outputs = []wire.Output{{Name: "out"}}
	g.run(t, produce)
	evs := g.stepEvents(ctx, t, "produce", "", 0)
	require.Equal(t, []string{"placed", "scheduled", "input", "started", "exited"}, types(evs), "%+v", evs)
	in := evs[2]
	assert.Equal(t, "src", in.Input)
	assert.Positive(t, in.Bytes)
	assert.Len(t, in.SHA256, 64)
	assert.Equal(t, hex.EncodeToString(sum[:])+"\n", outputOf(evs, wire.EventStdout))
	v := g.step(t, "produce")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	require.Len(t, v.Outputs, 1)
	assert.Equal(t, wire.Volume{Name: "out", Target: "io-a", Pod: v.Pod, Handle: "output-out"}, v.Outputs[0])

	// A task on cluster B uses that output.
	consume := shStep("consume", `cat in/note; echo; cat in/sum`)
	consume.Tags = []string{"b"}
	consume.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "produce", Output: "out"}}}
	g.run(t, consume)
	evs = g.stepEvents(ctx, t, "consume", "", 0)
	assert.Equal(t, []string{"placed", "scheduled", "input", "started", "exited"}, types(evs), "%+v", evs)
	assert.Equal(t, "from A\n"+hex.EncodeToString(sum[:])+"\n", outputOf(evs, wire.EventStdout))
	assert.Equal(t, "io-b", g.step(t, "consume").Target)

	// Released with DELETE: the pod goes, and its output with it.
	code, body, _ := call(t, http.MethodDelete, g.base+"/api/v1/steps/produce", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.True(t, g.step(t, "produce").Released)
	eventually(t, 10*time.Second, func() error {
		_, err := clusters[0].Client.CoreV1().Pods("io-a").Get(ctx, v.Pod, metav1.GetOptions{})
		if err == nil {
			return errorf("pod %s still there", v.Pod)
		}
		return nil
	})
	code, _, body = g.submitStep(t, "", wire.Request{Handle: "late", Type: "task", Image: "x", Run: wire.Run{Path: "true"},
		Inputs: []wire.Input{{Name: "in", From: wire.InputSource{Step: "produce", Output: "out"}}}})
	assert.Equal(t, http.StatusUnprocessableEntity, code, body)
	assert.Contains(t, body, "released")
}

// longStep prints numbered lines for a while, counts its runs in its
// output, and exits 42.
func longStep(handle string, lines int) wire.Request {
	req := shStep(handle, fmt.Sprintf(`echo run >> out/runs; i=1; while [ $i -le %d ]; do echo "line $i"; i=$((i+1)); sleep 0.05; done; exit 42`, lines))
	req.Outputs = []wire.Output{{Name: "out"}}
	return req
}

// checkLongStep checks a longStep's events: every line once, in order,
// exit 42, and one run of the process in its pod.
func checkLongStep(t *testing.T, c *cluster.Cluster, v wire.View, evs []wire.Event, lines int) {
	t.Helper()
	runs, err := os.ReadFile(filepath.Join(c.StepRoot(v.Target, v.Pod), "build", "out", "runs"))
	require.NoError(t, err)
	assert.Equal(t, "run\n", string(runs), "the process ran once")
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	assert.Equal(t, want.String(), outputOf(evs, wire.EventStdout))
	last := evs[len(evs)-1]
	require.NotNil(t, last.ExitStatus, "%+v", last)
	assert.Equal(t, 42, *last.ExitStatus)
	for i, e := range evs {
		require.Equal(t, i, e.N)
	}
}

// cutProxy forwards TCP to an API server and can cut every connection
// through it at once, as a network blip would.
type cutProxy struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, to: to}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.DialTimeout("tcp", p.to, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		var pair sync.WaitGroup
		pair.Go(func() { _, _ = io.Copy(out, in); out.Close() })
		pair.Go(func() { _, _ = io.Copy(in, out); in.Close() })
		p.wg.Go(func() {
			pair.Wait()
			p.mu.Lock()
			defer p.mu.Unlock()
			p.conns = slices.DeleteFunc(p.conns, func(c net.Conn) bool { return c == in || c == out })
		})
	}
}

// Open is how many connections are open through the proxy.
func (p *cutProxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// Close takes the proxy away: no connection is taken, and every one open
// is cut.
func (p *cutProxy) Close() {
	p.ln.Close()
	p.Cut()
}

// Cut closes every connection open through the proxy.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestStepSurvivesACutExecAndAGatewayRestart cuts every connection to the
// API server in the middle of a step, then restarts the gateway in the
// middle of another: the output is complete and in order, the exit status
// exact, and the process ran once.
func TestStepSurvivesACutExecAndAGatewayRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	proxy := startCutProxy(t, strings.TrimPrefix(clusters[0].AdminConfig().Host, "https://"))
	placeTarget(ctx, t, clusters[0], dir, "st-cut", "{}\n", "https://"+proxy.ln.Addr().String())
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "st-cut", 10*time.Second, running)

	const lines = 60
	g.run(t, longStep("cut", lines))
	cut := make(chan struct{})
	var evs []wire.Event
	done := make(chan struct{})
	go func() {
		defer close(done)
		evs = g.stepEvents(ctx, t, "cut", "", 0)
	}()
	g.waitEvents(t, "cut", 8)
	proxy.Cut()
	close(cut)
	<-done
	checkLongStep(t, clusters[0], g.step(t, "cut"), evs, lines)
	assert.Positive(t, metricValue(t, g, "jetway_step_reattaches_total"), "the exec was cut and attached again")

	// A gateway restarted mid-step picks the step up from its pod and
	// replays its events from the start.
	g.run(t, longStep("restart", lines))
	g.waitEvents(t, "restart", 8)
	g.stop()
	g = startGateway(t, dir, gatewayOptions{})
	eventually(t, 20*time.Second, func() error {
		code, body, _ := call(t, http.MethodGet, g.base+"/api/v1/steps/restart", "")
		if code != http.StatusOK {
			return errorf("%d %s", code, body)
		}
		return nil
	})
	evs = g.stepEvents(ctx, t, "restart", "", 0)
	v := g.step(t, "restart")
	assert.Equal(t, wire.Failed, v.Phase)
	checkLongStep(t, clusters[0], v, evs, lines)
	assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, types(evs))
	// ?since= picks up where a reader left off.
	tail := g.stepEvents(ctx, t, "restart", "", len(evs)-2)
	assert.Equal(t, evs[len(evs)-2:], tail)
}

// TestStepAbortAndTimeout: DELETE kills the process and releases the pod;
// a step past its timeout is killed and errors saying so, and the time it
// waited for a target does not count.
func TestStepAbortAndTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[1], "st-abort", "{}\n", gatewayOptions{tokens: []api.Token{adminToken, mainToken}})

	g.run(t, shStep("abort", `echo started; exec sleep 600`))
	eventually(t, 20*time.Second, func() error {
		if v := g.step(t, "abort"); v.Phase != wire.Running {
			return errorf("phase %s", v.Phase)
		}
		return nil
	})
	pod := g.step(t, "abort").Pod
	followed := g.followEvents(ctx, t, "abort", "", 0)
	code, body, _ := call(t, http.MethodDelete, g.base+"/api/v1/steps/abort", mainToken.Token)
	assert.Equal(t, http.StatusNotFound, code, "another team's token: %s", body)
	start := time.Now()
	code, body, _ = call(t, http.MethodDelete, g.base+"/api/v1/steps/abort", adminToken.Token)
	require.Equal(t, http.StatusOK, code, body)
	assert.Less(t, time.Since(start), 10*time.Second, "TERM ends sleep at once")
	v := g.step(t, "abort")
	assert.Equal(t, wire.Aborted, v.Phase)
	assert.True(t, v.Released)
	evs := <-followed
	assert.Equal(t, "started\n", outputOf(evs, wire.EventStdout))
	assert.Equal(t, wire.Aborted, evs[len(evs)-1].Phase)
	code, body, _ = call(t, http.MethodGet, g.base+"/api/v1/steps/abort/events", adminToken.Token)
	assert.Equal(t, http.StatusGone, code, "a released step's log went with its pod: %s", body)
	eventually(t, 10*time.Second, func() error {
		if _, err := clusters[1].Client.CoreV1().Pods("st-abort").Get(ctx, pod, metav1.GetOptions{}); err == nil {
			return errorf("pod %s still there", pod)
		}
		return nil
	})

	req := shStep("timeout", `echo going; exec sleep 600`)
	req.Timeout = "2s"
	g.run(t, req)
	evs = g.stepEvents(ctx, t, "timeout", "", 0)
	last := evs[len(evs)-1]
	assert.Equal(t, wire.EventFailed, last.Type)
	assert.Equal(t, wire.Errored, last.Phase)
	assert.Equal(t, "timeout", last.Reason)
	assert.Contains(t, last.Message, "timed out after 2s")
	v = g.step(t, "timeout")
	assert.Less(t, v.FinishedAt.Sub(v.StartedAt), 10*time.Second, "killed after its timeout and the kill grace")
}

// setPodStatus changes a pod's status through the API server, as a kubelet
// or the node controller would.
func setPodStatus(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string, change func(*corev1.Pod)) time.Time {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(p)
		_, err = c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	return time.Now()
}

// endsWithin waits for the step to end and returns its last event, which
// must come within 10 s of since.
func (g *gateway) endsWithin(ctx context.Context, t *testing.T, handle string, since time.Time) wire.Event {
	t.Helper()
	evs := g.stepEvents(ctx, t, handle, "", 0)
	last := evs[len(evs)-1]
	v := g.step(t, handle)
	assert.Less(t, v.FinishedAt.Sub(since), 10*time.Second, "%s ended %s after Kubernetes said so", handle, v.FinishedAt.Sub(since))
	assert.Equal(t, wire.Errored, v.Phase, "%+v", v)
	return last
}

// waitPhase waits until the step reaches phase.
func (g *gateway) waitPhase(t *testing.T, handle string, phase wire.Phase) wire.View {
	t.Helper()
	var v wire.View
	eventually(t, 20*time.Second, func() error {
		if v = g.step(t, handle); v.Phase != phase {
			return errorf("%s is %s, not %s", handle, v.Phase, phase)
		}
		return nil
	})
	return v
}

// TestStepPodFailures: each way Kubernetes says a step pod cannot go on
// ends the step within 10 s, with Kubernetes' reason and message. Where
// kwok cannot make the condition, the test writes the pod's status as a
// kubelet or the node controller would.
func TestStepPodFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "pf-run", "{}\n", "")
	placeTarget(ctx, t, clusters[0], dir, "pf-nowhere", "tags: [nowhere]\nnodeSelector: {jetway-test/pool: none}\n", "")
	placeTarget(ctx, t, clusters[0], dir, "pf-manual", "tags: [manual]\nnodeSelector: "+cluster.KubeletManualSelector+"\n", "")
	g := startGateway(t, dir, gatewayOptions{pullGrace: 3 * time.Second})
	for _, name := range []string{"pf-run", "pf-nowhere", "pf-manual"} {
		g.waitTarget(t, name, 10*time.Second, running)
	}

	t.Run("unschedulable", func(t *testing.T) {
		req := shStep("unschedulable", "true")
		req.Tags = []string{"nowhere"}
		g.run(t, req)
		last := g.endsWithin(ctx, t, "unschedulable", time.Now())
		assert.Equal(t, "Unschedulable", last.Reason)
		assert.Contains(t, last.Message, "node(s) didn't match Pod's node affinity/selector", "the scheduler's message")
		assert.True(t, g.step(t, "unschedulable").Released, "a pod that never ran goes")
	})
	pull := func(handle, message string) wire.Event {
		req := shStep(handle, "true")
		req.Tags = []string{"manual"}
		v := g.run(t, req)
		v = g.waitPhase(t, handle, wire.Starting)
		eventually(t, 10*time.Second, func() error {
			p, err := clusters[0].Client.CoreV1().Pods("pf-manual").Get(ctx, v.Pod, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" {
				return errorf("pod %s not scheduled yet (%v)", v.Pod, err)
			}
			return nil
		})
		at := setPodStatus(ctx, t, clusters[0], "pf-manual", v.Pod, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodPending
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "step", Image: "busybox:1.37",
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: message}}}}
		})
		last := g.endsWithin(ctx, t, handle, at)
		assert.Equal(t, "ErrImagePull", last.Reason)
		assert.Contains(t, last.Message, message)
		return last
	}
	t.Run("image not found fails at once", func(t *testing.T) {
		pull("pull-not-found", `failed to pull and unpack image "docker.io/library/busybox:1.37": not found`)
	})
	t.Run("rate limited image gets the grace", func(t *testing.T) {
		start := time.Now()
		last := pull("pull-rate-limited", `429 Too Many Requests: toomanyrequests: You have reached your pull rate limit`)
		assert.Contains(t, last.Message, "image-pull grace of 3s")
		assert.GreaterOrEqual(t, g.step(t, "pull-rate-limited").FinishedAt.Sub(start), 3*time.Second)
	})

	runningStep := func(handle string) wire.View {
		g.run(t, shStep(handle, "exec sleep 600"))
		return g.waitPhase(t, handle, wire.Running)
	}
	t.Run("oom killed sidecar", func(t *testing.T) {
		v := runningStep("oom")
		at := setPodStatus(ctx, t, clusters[0], "pf-run", v.Pod, func(p *corev1.Pod) {
			for i, cs := range p.Status.ContainerStatuses {
				if cs.Name == "volumes" {
					p.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}
				}
			}
		})
		last := g.endsWithin(ctx, t, "oom", at)
		assert.Equal(t, "OOMKilled", last.Reason)
		assert.Equal(t, `container "volumes": OOMKilled (137)`, last.Message)
	})
	t.Run("evicted", func(t *testing.T) {
		v := runningStep("evicted")
		at := setPodStatus(ctx, t, clusters[0], "pf-run", v.Pod, func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
		})
		last := g.endsWithin(ctx, t, "evicted", at)
		assert.Equal(t, "Evicted", last.Reason)
		assert.Equal(t, "The node was low on resource: memory.", last.Message)
	})
	t.Run("node lost", func(t *testing.T) {
		v := runningStep("node-lost")
		at := setPodStatus(ctx, t, clusters[0], "pf-run", v.Pod, func(p *corev1.Pod) {
			for i, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady {
					p.Status.Conditions[i].Status = corev1.ConditionFalse
				}
			}
		})
		last := g.endsWithin(ctx, t, "node-lost", at)
		assert.Equal(t, "NodeNotReady", last.Reason)
	})
	t.Run("pod deleted by someone else", func(t *testing.T) {
		v := runningStep("deleted")
		require.NoError(t, clusters[0].Client.CoreV1().Pods("pf-run").Delete(ctx, v.Pod, metav1.DeleteOptions{}))
		last := g.endsWithin(ctx, t, "deleted", time.Now())
		assert.Equal(t, "PodDeleted", last.Reason)
	})
}

// TestStepsKeepTheActiveTaskLimit submits 50 tasks at once over 3 targets
// with limit-active-tasks at 2: a watch of the pods never sees more than
// 2 unfinished task pods on a target, and all 50 finish.
func TestStepsKeepTheActiveTaskLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	names := []string{"lim-a", "lim-b", "lim-c"}
	for i, name := range names {
		placeTarget(ctx, t, clusters[i%2], dir, name, "{}\n", "")
	}
	g := startGateway(t, dir, gatewayOptions{placement: steps.PlacementOptions{
		Strategy: selection.Chain{selection.LimitActiveTasks}, Limits: selection.Limits{ActiveTasks: 2}}})
	for _, name := range names {
		g.waitTarget(t, name, 10*time.Second, running)
	}
	var mu sync.Mutex
	peak := map[string]int{}
	var wg sync.WaitGroup
	wctx, stopWatch := context.WithCancel(ctx)
	for i, name := range names {
		w, err := clusters[i%2].Client.CoreV1().Pods(name).Watch(wctx, metav1.ListOptions{LabelSelector: "jetway-ci.dev/step"})
		require.NoError(t, err)
		wg.Go(func() {
			unfinished := map[string]bool{}
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				unfinished[p.Name] = ev.Type != watch.Deleted && !targets.Finished(p)
				n := 0
				for _, u := range unfinished {
					if u {
						n++
					}
				}
				mu.Lock()
				peak[name] = max(peak[name], n)
				mu.Unlock()
			}
		})
	}
	codes := make(chan string, 50)
	for i := range 50 {
		go func() {
			req := shStep(fmt.Sprintf("task-%d", i), "sleep 0.5")
			// Longer than a task runs, even on a busy machine; shorter than
			// the later ones wait (50 tasks, 6 at a time: 8 rounds of at
			// least 0.5 s).
			req.Timeout = "3s"
			code, _, body := g.submitStep(t, "", req)
			codes <- strconv.Itoa(code) + " " + body
		}()
	}
	for range 50 {
		assert.Regexp(t, "^202 ", <-codes)
	}
	for i := range 50 {
		handle := fmt.Sprintf("task-%d", i)
		eventually(t, 3*time.Minute, func() error {
			code, body, _ := call(t, http.MethodGet, g.base+"/api/v1/steps/"+handle, "")
			if code != http.StatusOK || !strings.Contains(body, `"phase":"succeeded"`) {
				return errorf("%s: %d %s", handle, code, body)
			}
			return nil
		})
	}
	stopWatch()
	wg.Wait()
	var longestWait time.Duration
	for i := range 50 {
		v := g.step(t, fmt.Sprintf("task-%d", i))
		longestWait = max(longestWait, v.StartedAt.Sub(v.CreatedAt))
	}
	assert.Greater(t, longestWait, time.Second, "some tasks waited longer than their timeout, which waiting does not count against")
	for _, name := range names {
		assert.LessOrEqual(t, peak[name], 2, "unfinished task pods on %s at once", name)
		assert.Positive(t, peak[name], "%s ran tasks", name)
	}
}

// TestStepSurvivesAnAPIServerRestart restarts the API server (and with it
// the kwok node, which kills what its execs ran) in the middle of a step:
// the step's process, detached from every exec, runs on; the gateway
// attaches again once the server is back; nothing is lost or run twice.
func TestStepSurvivesAnAPIServerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, "st-restart", "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "st-restart", 10*time.Second, running)

	const lines = 80
	g.run(t, longStep("outage", lines))
	g.waitEvents(t, "outage", 8)
	c.StopAPIServer()
	require.NoError(t, c.StartAPIServer(ctx))
	evs := g.stepEvents(ctx, t, "outage", "", 0)
	v := g.step(t, "outage")
	assert.Equal(t, wire.Failed, v.Phase, "%+v", v)
	checkLongStep(t, c, v, evs, lines)
	assert.Positive(t, metricValue(t, g, "jetway_step_reattaches_total"), "the exec broke and was attached again")
}
