package integration

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// The step suite on the real node (startRealNode): kubelet, containerd and
// runc run the step pods' containers, so what kwok could only stand in
// for runs for real: the init container's copy of the agent, pid1, the
// volume sidecar as root with four capabilities and a read-only root, exec and port-forward
// through a kubelet, OOM kills, image pulls, users and security contexts.

// nodeGateway places target name on the real node and starts a gateway
// owning it, with the step agent's image the node holds, mounted as an
// image volume unless o says otherwise.
func nodeGateway(ctx context.Context, t *testing.T, name string, o gatewayOptions) *gateway {
	t.Helper()
	rn := startRealNode(t)
	o.agentImage = rn.NodeImage("step-agent-image.tar")
	o.agentMount = cmp.Or(o.agentMount, steppod.AgentImageVolume)
	return targetGateway(ctx, t, rn, name, cmp.Or(o.targetYAML, "{}\n"), o)
}

// nodeStep is a shell task in the node's busybox image.
func nodeStep(handle, script string) wire.Request {
	req := shStep(handle, script)
	req.Image = cluster.BusyboxImage
	return req
}

// statusField reads a field of /proc/self/status as a step printed it.
func statusField(t *testing.T, status, field string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + field + `:\s*(.*)$`).FindStringSubmatch(status)
	require.NotNil(t, m, "%s in %q", field, status)
	return m[1]
}

// gatewayDefaults are the step pods' limits of a gateway run with its
// defaults (config.Default: step-volume-size-limit and the others).
var gatewayDefaults = steppod.Defaults{VolumeSizeLimit: resource.MustParse("10Gi"),
	EphemeralStorageRequest: resource.MustParse("1Gi"), CPURequest: resource.MustParse("100m"),
	MemoryRequest: resource.MustParse("256Mi"), CheckCPURequest: resource.MustParse("10m"),
	CheckMemoryRequest: resource.MustParse("32Mi")}

// TestRealNodeTasks: a task's exact exit status, output per stream and
// environment through the real exec path; run.user; an image without a
// shell; the step container's security context and limits in effect,
// read from inside it.
func TestRealNodeTasks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	g := nodeGateway(ctx, t, "rn-tasks", gatewayOptions{stepDefaults: gatewayDefaults})

	for _, code := range []int{0, 1, 42} {
		handle := "exit-" + strconv.Itoa(code)
		req := nodeStep(handle, fmt.Sprintf(`for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; done; printf 'no newline'; echo "$GREETING" >&2; exit %d`, code))
		req.Run.Env = map[string]string{"GREETING": "hello from env"}
		g.run(t, req)
		evs := g.stepEvents(ctx, t, handle, "", 0)
		assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, types(evs))
		assert.Equal(t, "out 1\nout 2\nout 3\nno newline", outputOf(evs, wire.EventStdout))
		assert.Equal(t, "err 1\nerr 2\nerr 3\nhello from env\n", outputOf(evs, wire.EventStderr))
		last := evs[len(evs)-1]
		require.NotNil(t, last.ExitStatus, "%+v", last)
		assert.Equal(t, code, *last.ExitStatus)
	}

	t.Run("run.user", func(t *testing.T) {
		req := nodeStep("user", `id -u; id -g; touch out/mine && ls -n out/mine | awk '{print $3":"$4}'`)
		req.Run.User = "1000:1001"
		req.Outputs = []wire.Output{{Name: "out"}}
		g.run(t, req)
		evs := g.stepEvents(ctx, t, "user", "", 0)
		require.Equal(t, wire.EventExited, evs[len(evs)-1].Type, "%+v", evs)
		assert.Equal(t, "1000\n1001\n1000:1001\n", outputOf(evs, wire.EventStdout), outputOf(evs, wire.EventStderr))
	})

	t.Run("image without a shell", func(t *testing.T) {
		agent := rn.NodeImage("step-agent-image.tar")
		g.run(t, wire.Request{Handle: "no-shell", Type: "task", Image: agent,
			Run: wire.Run{Path: "/step-agent", Args: []string{"no-such-command"}}})
		evs := g.stepEvents(ctx, t, "no-shell", "", 0)
		last := evs[len(evs)-1]
		require.NotNil(t, last.ExitStatus, "%+v", evs)
		assert.Equal(t, 2, *last.ExitStatus, "the agent's usage error, from an image with no shell")
		assert.Contains(t, outputOf(evs, wire.EventStderr), `unknown command "no-such-command"`)
	})

	t.Run("security context", func(t *testing.T) {
		g.run(t, nodeStep("status", `cat /proc/self/status`))
		evs := g.stepEvents(ctx, t, "status", "", 0)
		status := outputOf(evs, wire.EventStdout)
		assert.Equal(t, "1", statusField(t, status, "NoNewPrivs"), "allowPrivilegeEscalation: false")
		capEff, err := strconv.ParseUint(statusField(t, status, "CapEff"), 16, 64)
		require.NoError(t, err)
		const chown, netRaw, sysAdmin = 1 << 0, 1 << 13, 1 << 21
		assert.Zero(t, capEff&sysAdmin, "not privileged: no CAP_SYS_ADMIN (%x)", capEff)
		assert.Zero(t, capEff&netRaw, "the runtime's capabilities minus NET_RAW (%x)", capEff)
		assert.NotZero(t, capEff&chown, "the runtime's capabilities, CHOWN among them (%x)", capEff)
		capBnd, err := strconv.ParseUint(statusField(t, status, "CapBnd"), 16, 64)
		require.NoError(t, err)
		assert.Zero(t, capBnd&netRaw, "NET_RAW out of the bounding set too: no exec gets it back (%x)", capBnd)
		assert.Equal(t, "2", statusField(t, status, "Seccomp"), "the runtime's seccomp filter (RuntimeDefault)")
		assert.Equal(t, "0", strings.Fields(statusField(t, status, "Uid"))[0], "the image's user, root")

		// The pod as the API server admitted it and the kubelet ran it:
		// a bounded emptyDir, an ephemeral-storage request and the default
		// requests of a step that asked for none.
		p, err := rn.Client.CoreV1().Pods("rn-tasks").Get(ctx, g.step(t, "status").Pod, metav1.GetOptions{})
		require.NoError(t, err)
		require.NotNil(t, p.Spec.Volumes[0].EmptyDir.SizeLimit)
		assert.Equal(t, "10Gi", p.Spec.Volumes[0].EmptyDir.SizeLimit.String())
		req := p.Spec.Containers[0].Resources.Requests
		assert.Equal(t, "1Gi", req.StorageEphemeral().String())
		assert.Equal(t, "100m", req.Cpu().String())
		assert.Equal(t, "256Mi", req.Memory().String())
		assert.Empty(t, p.Spec.Containers[0].Resources.Limits, "requests only: a step that asks for nothing is Burstable")
		assert.Equal(t, corev1.PodQOSBurstable, p.Status.QOSClass)

		// The volume sidecar (its image has no shell) as the host sees
		// its first process: root with only the capabilities that carry
		// files as written (CHOWN, DAC_OVERRIDE, FOWNER, FSETID: bits 0,
		// 1, 3, 4), bounded to them, no escalation, a read-only root.
		pod := g.step(t, "status").Pod
		for _, container := range []string{steppod.SidecarContainer} {
			status, err := rn.ContainerProcess(ctx, "rn-tasks", pod, container, "status")
			require.NoError(t, err)
			assert.Equal(t, "0", strings.Fields(statusField(t, status, "Uid"))[0], container)
			assert.Equal(t, "0", strings.Fields(statusField(t, status, "Gid"))[0], container)
			assert.Equal(t, "1", statusField(t, status, "NoNewPrivs"), container)
			assert.Equal(t, "000000000000001b", statusField(t, status, "CapEff"), container+": CHOWN, DAC_OVERRIDE, FOWNER, FSETID alone")
			assert.Equal(t, "000000000000001b", statusField(t, status, "CapBnd"), container)
			assert.Equal(t, "2", statusField(t, status, "Seccomp"), container+": the runtime's seccomp filter")
			mounts, err := rn.ContainerProcess(ctx, "rn-tasks", pod, container, "mountinfo")
			require.NoError(t, err)
			assert.Regexp(t, `(?m)^\S+ \S+ \S+ \S+ / ro[, ]`, mounts, container+": a read-only root")
		}
	})
}

// TestRealNodeInputsAndOutputs: an upload and an output streamed into a
// task through the real volume sidecar (as root with four capabilities, read-only root) and the
// kubelet's port-forward, and the output downloaded: every byte whole.
func TestRealNodeInputsAndOutputs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := nodeGateway(ctx, t, "rn-io", gatewayOptions{})
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)

	src := t.TempDir()
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7 % 251)
	}
	require.NoError(t, os.WriteFile(filepath.Join(src, "blob"), data, 0o644))
	sum := sha256.Sum256(data)
	produce := nodeStep("produce", `sha256sum src/blob | cut -d' ' -f1 > out/sum; cp src/blob out/blob; printf 'from the node' > out/note; cat out/sum`)
	produce.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Upload: true}}}
	produce.Outputs = []wire.Output{{Name: "out"}}
	_, _, err = c.SubmitStep(ctx, produce)
	require.NoError(t, err)
	up, err := c.UploadInput(ctx, "", "produce", "src", src)
	require.NoError(t, err)
	assert.Positive(t, up.Bytes)
	evs := g.stepEvents(ctx, t, "produce", "", 0)
	require.Equal(t, []string{"placed", "scheduled", "input", "started", "exited"}, types(evs), "%+v", evs)
	assert.Equal(t, hex.EncodeToString(sum[:])+"\n", outputOf(evs, wire.EventStdout), outputOf(evs, wire.EventStderr))

	consume := nodeStep("consume", `cat in/note; echo; sha256sum in/blob | cut -d' ' -f1; echo more > in/written`)
	consume.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "produce", Output: "out"}}}
	g.run(t, consume)
	evs = g.stepEvents(ctx, t, "consume", "", 0)
	assert.Equal(t, []string{"placed", "scheduled", "input", "started", "exited"}, types(evs), "%+v", evs)
	assert.Equal(t, "from the node\n"+hex.EncodeToString(sum[:])+"\n", outputOf(evs, wire.EventStdout), outputOf(evs, wire.EventStderr))
	require.NotNil(t, evs[len(evs)-1].ExitStatus)
	assert.Equal(t, 0, *evs[len(evs)-1].ExitStatus, "an input is writable by the step")

	dst := t.TempDir()
	_, err = c.DownloadOutput(ctx, "", "produce", "out", dst)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dst, "blob"))
	require.NoError(t, err)
	assert.Equal(t, sum, sha256.Sum256(got))
	note, err := os.ReadFile(filepath.Join(dst, "note"))
	require.NoError(t, err)
	assert.Equal(t, "from the node", string(note))
}

// TestRealNodeStepSurvivesACutExecAndARestart cuts every connection to
// the API server mid-step, then restarts the gateway mid-step: the output
// is complete and in order, the exit status exact, and the process ran
// once (its output counts its runs).
func TestRealNodeStepSurvivesACutExecAndARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	dir := t.TempDir()
	proxy := startCutProxy(t, strings.TrimPrefix(rn.AdminConfig().Host, "https://"))
	placeTarget(ctx, t, rn, dir, "rn-cut", "{}\n", "https://"+proxy.ln.Addr().String())
	o := gatewayOptions{agentImage: rn.NodeImage("step-agent-image.tar")}
	g := startGateway(t, dir, o)
	g.waitTarget(t, "rn-cut", 10*time.Second, running)
	const lines = 60
	long := func(handle string) wire.Request {
		req := longStep(handle, lines)
		req.Image = cluster.BusyboxImage
		return req
	}
	check := func(handle string, evs []wire.Event) {
		t.Helper()
		var want strings.Builder
		for i := 1; i <= lines; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		assert.Equal(t, want.String(), outputOf(evs, wire.EventStdout))
		for i, e := range evs {
			require.Equal(t, i, e.N)
		}
		last := evs[len(evs)-1]
		require.NotNil(t, last.ExitStatus, "%+v", last)
		assert.Equal(t, 42, *last.ExitStatus)
		c, err := client.New(client.Options{URL: g.base})
		require.NoError(t, err)
		out := t.TempDir()
		_, err = c.DownloadOutput(ctx, "", handle, "out", out)
		require.NoError(t, err)
		runs, err := os.ReadFile(filepath.Join(out, "runs"))
		require.NoError(t, err)
		assert.Equal(t, "run\n", string(runs), "the process ran once")
	}

	g.run(t, long("cut"))
	followed := g.followEvents(ctx, t, "cut", "", 0)
	g.waitEvents(t, "cut", 8)
	proxy.Cut()
	check("cut", <-followed)
	assert.Positive(t, metricValue(t, g, "jetway_step_reattaches_total"), "the exec was cut and attached again")

	g.run(t, long("restart"))
	g.waitEvents(t, "restart", 8)
	g.stop()
	g = startGateway(t, dir, o)
	eventually(t, 20*time.Second, func() error {
		code, body, _ := call(t, http.MethodGet, g.base+"/api/v1/steps/restart", "")
		if code != http.StatusOK {
			return errorf("%d %s", code, body)
		}
		return nil
	})
	evs := g.stepEvents(ctx, t, "restart", "", 0)
	assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, types(evs))
	check("restart", evs)
}

// TestRealNodeAbortAndTimeout: abort and timeout send TERM to the process
// in the container, then KILL after the kill grace to one that ignores
// TERM.
func TestRealNodeAbortAndTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := nodeGateway(ctx, t, "rn-abort", gatewayOptions{killGrace: 2 * time.Second})

	// TERM reaches the process: its trap prints and exits.
	g.run(t, nodeStep("term", `trap 'echo got TERM; exit 3' TERM; echo started; while true; do sleep 0.1; done`))
	g.waitPhase(t, "term", wire.Running)
	g.waitEvents(t, "term", 4)
	followed := g.followEvents(ctx, t, "term", "", 0)
	code, body, _ := call(t, http.MethodDelete, g.base+"/api/v1/steps/term", "")
	require.Equal(t, http.StatusOK, code, body)
	evs := <-followed
	assert.Equal(t, "started\ngot TERM\n", outputOf(evs, wire.EventStdout))
	assert.Equal(t, wire.Aborted, evs[len(evs)-1].Phase)

	// A process that ignores TERM is killed after the grace.
	req := nodeStep("kill", `trap 'echo ignoring TERM' TERM; echo started; while true; do sleep 0.1; done`)
	req.Timeout = "2s"
	g.run(t, req)
	evs = g.stepEvents(ctx, t, "kill", "", 0)
	last := evs[len(evs)-1]
	assert.Equal(t, wire.EventFailed, last.Type, "%+v", last)
	assert.Equal(t, "timeout", last.Reason)
	assert.Contains(t, outputOf(evs, wire.EventStdout), "ignoring TERM", "TERM came first")
	v := g.step(t, "kill")
	d := v.FinishedAt.Sub(v.StartedAt)
	assert.GreaterOrEqual(t, d, 4*time.Second, "the timeout, then the kill grace")
	assert.Less(t, d, 15*time.Second)
}

// TestRealNodePodFailures: what only a kubelet makes: an OOM kill from a
// memory limit, named with its container; an image pull that cannot
// succeed fails at once, one that may succeed gets the grace.
func TestRealNodePodFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	g := nodeGateway(ctx, t, "rn-fail", gatewayOptions{pullGrace: 5 * time.Second})

	t.Run("oom killed", func(t *testing.T) {
		// The kernel kills the step's process, the largest in the
		// container, not the agent's pid1: the container lives on, so only
		// the agent can tell (kwok's suite wrote OOMKilled on the pod).
		// The step's process is the kernel's first choice, whatever its
		// size against the supervisor's at that moment.
		g.run(t, nodeStep("oom-score", `cat /proc/self/oom_score_adj`))
		assert.Equal(t, "1000\n", outputOf(g.stepEvents(ctx, t, "oom-score", "", 0), wire.EventStdout))
		req := nodeStep("oom", `echo filling; x=a; while true; do x="$x$x"; done`)
		req.Resources.Memory = "32Mi"
		g.run(t, req)
		evs := g.stepEvents(ctx, t, "oom", "", 0)
		last := evs[len(evs)-1]
		assert.Equal(t, wire.EventExited, last.Type, "%+v", last)
		assert.Equal(t, wire.Failed, last.Phase, "%+v", last)
		assert.Equal(t, "OOMKilled", last.Reason, "%+v", last)
		assert.Contains(t, last.Message, `container "step": OOMKilled (137)`)
		require.NotNil(t, last.ExitStatus)
		assert.Equal(t, 137, *last.ExitStatus)
		assert.Equal(t, "filling\n", outputOf(evs, wire.EventStdout))
	})
	t.Run("image that cannot exist fails at once", func(t *testing.T) {
		req := nodeStep("not-found", "true")
		req.Image = cluster.NodeRegistry + "/none:1"
		start := time.Now()
		g.run(t, req)
		last := g.endsWithin(ctx, t, "not-found", start)
		assert.Equal(t, "ErrImagePull", last.Reason, "%+v", last)
		assert.Contains(t, last.Message, "not found")
		assert.NotContains(t, last.Message, "grace")
		assert.Less(t, g.step(t, "not-found").FinishedAt.Sub(start), 5*time.Second, "before the grace")
	})
	t.Run("invalid image name fails at once", func(t *testing.T) {
		req := nodeStep("bad-name", "true")
		req.Image = "jetway.test/Not_A_Valid/Name:1"
		g.run(t, req)
		last := g.endsWithin(ctx, t, "bad-name", time.Now())
		assert.Equal(t, "InvalidImageName", last.Reason, "%+v", last)
	})
	t.Run("rate limited image gets the grace", func(t *testing.T) {
		req := nodeStep("rate-limited", "true")
		req.Image = cluster.NodeRegistry + "/busy/image:1"
		start := time.Now()
		g.run(t, req)
		last := g.endsWithin(ctx, t, "rate-limited", start.Add(5*time.Second))
		assert.Contains(t, []string{"ErrImagePull", "ImagePullBackOff"}, last.Reason, "%+v", last)
		assert.Contains(t, last.Message, "429")
		assert.Contains(t, last.Message, "image-pull grace of 5s")
		assert.GreaterOrEqual(t, g.step(t, "rate-limited").FinishedAt.Sub(start), 5*time.Second)
	})
	t.Run("pod deleted", func(t *testing.T) {
		g.run(t, nodeStep("deleted", "exec sleep 600"))
		v := g.waitPhase(t, "deleted", wire.Running)
		require.NoError(t, rn.Client.CoreV1().Pods("rn-fail").Delete(ctx, v.Pod, metav1.DeleteOptions{}))
		last := g.endsWithin(ctx, t, "deleted", time.Now())
		assert.Equal(t, "PodDeleted", last.Reason, "%+v", last)
	})
}

// TestRealNodeResources: check, get and put through a resource type's
// scripts in a real image (/opt/resource of the node's busybox image), and
// checks in a warm sandbox, whose session the agent's daemon serves over
// a real exec: the second check reuses the first's pod.
func TestRealNodeResources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := nodeGateway(ctx, t, "rn-res", gatewayOptions{})
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	source := map[string]string{"uri": "git://x"}
	res := func(handle string) client.ResourceStep {
		return client.ResourceStep{Handle: handle, Image: cluster.BusyboxImage, Source: source}
	}

	var pods []string
	for _, handle := range []string{"warm-1", "warm-2"} {
		r := res(handle)
		r.ReuseKey = "repo"
		versions, err := c.CheckResource(ctx, r)
		require.NoError(t, err)
		assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions)
		pods = append(pods, g.step(t, handle).Pod)
	}
	assert.Equal(t, pods[0], pods[1], "the second check ran in the first's sandbox")

	fetched, err := c.GetResource(ctx, func() client.ResourceStep { r := res("get"); r.Version = client.Version{"ref": "b"}; return r }())
	require.NoError(t, err)
	assert.Equal(t, client.Version{"ref": "b"}, fetched.Version)
	assert.Equal(t, []client.MetadataField{{Name: "author", Value: "me"}}, fetched.Metadata)
	var log strings.Builder
	put := res("put")
	put.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Step: "get", Output: "resource"}}}
	put.OnEvent = func(e wire.Event) { log.WriteString(e.Data) }
	pushed, err := c.PutResource(ctx, put)
	require.NoError(t, err)
	assert.Equal(t, client.Version{"ref": "c"}, pushed.Version)
	assert.Contains(t, log.String(), "and fetched", "put read what get wrote, streamed between real pods")
}

// TestRealNodeSidecarStopsAnArchivePastItsLimit: the gateway's extract
// limit reaches the step pod's sidecar (its command line), which refuses
// an upload past it, naming the limit and the entry: the upload fails,
// and the step does not start on a partial input.
func TestRealNodeSidecarStopsAnArchivePastItsLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := nodeGateway(ctx, t, "rn-limit", gatewayOptions{extract: tarsafe.Limits{Bytes: 1 << 20}})
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "small"), make([]byte, 512<<10), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "large"), make([]byte, 2<<20), 0o644))
	req := nodeStep("over", `echo ran; ls src`)
	req.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Upload: true}}}
	_, _, err = c.SubmitStep(ctx, req)
	require.NoError(t, err)
	_, err = c.UploadInput(ctx, "", "over", "src", src)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "goes past the limit of 1048576 bytes an archive may write")
	v := g.step(t, "over")
	assert.True(t, v.StartedAt.IsZero(), "the step did not start: %+v", v)
}

// TestRealNodeSidecarServesOnlyTheGateway: from another team's step in
// the same namespace, and from a step in another namespace, every call to
// a step pod's volume sidecar without its token (stream-out, stream-in,
// a property named stream-in, stream-p2p-out, making or listing volumes,
// registering a ticket), or
// with a guessed one or an unissued ticket, gets 401 and moves no byte;
// the gateway's own streams, download and direct (p2p) alike, keep
// working.
func TestRealNodeSidecarServesOnlyTheGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	dir := t.TempDir()
	placeTarget(ctx, t, rn, dir, "rn-victim", "tags: [v]\n", "")
	placeTarget(ctx, t, rn, dir, "rn-other", "tags: [o]\n", "")
	g := startGateway(t, dir, gatewayOptions{agentImage: rn.NodeImage("step-agent-image.tar")})
	g.waitTarget(t, "rn-victim", 10*time.Second, running)
	g.waitTarget(t, "rn-other", 10*time.Second, running)
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)

	victim := nodeStep("victim", `echo team-main-secret > out/secret`)
	victim.Team, victim.Tags = "main", []string{"v"}
	victim.Outputs = []wire.Output{{Name: "out"}}
	g.run(t, victim)
	g.stepEvents(ctx, t, "victim", "&team=main", 0)
	v := g.teamStep(t, "victim", "main")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	pod, err := rn.Client.CoreV1().Pods("rn-victim").Get(ctx, v.Pod, metav1.GetOptions{})
	require.NoError(t, err)
	ip := pod.Status.PodIP
	require.NotEmpty(t, ip)

	// Each probe is one request; nc prints the status line it gets.
	requests := []string{
		"PUT /volumes/output-out/stream-out HTTP/1.1",
		"PUT /volumes/output-out/stream-in HTTP/1.1",
		"PUT /volumes/output-out/properties/stream-in HTTP/1.1",
		"PUT /volumes/output-out/stream-p2p-out?streamInURL=http%3A%2F%2F" + ip + "%3A7788%2Fvolumes%2Fx%2Fstream-in HTTP/1.1",
		"POST /volumes HTTP/1.1",
		"GET /volumes HTTP/1.1",
		"POST /tickets HTTP/1.1",
	}
	var script strings.Builder
	for _, auth := range []string{"", "Authorization: Bearer guessed-token\r\n"} {
		for _, r := range requests {
			fmt.Fprintf(&script, `printf '%s\r\nHost: x\r\n%sContent-Length: 10\r\nConnection: close\r\n\r\n0123456789' | nc -w 10 %s 7788 | head -1; `,
				strings.ReplaceAll(r, "%", "%%"), auth, ip)
		}
	}
	for _, probe := range []struct{ handle, tag string }{{"probe-same-namespace", "v"}, {"probe-other-namespace", "o"}} {
		req := nodeStep(probe.handle, script.String())
		req.Team, req.Tags = "other", []string{probe.tag}
		g.run(t, req)
		evs := g.stepEvents(ctx, t, probe.handle, "&team=other", 0)
		v = g.teamStep(t, probe.handle, "other")
		require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
		out := outputOf(evs, wire.EventStdout)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		assert.Len(t, lines, 2*len(requests), "%s: %q (stderr %q)", probe.handle, out, outputOf(evs, wire.EventStderr))
		for _, l := range lines {
			assert.Contains(t, l, "401 Unauthorized", probe.handle)
		}
		assert.NotContains(t, out, "team-main-secret")
	}

	// Nothing moved: the output is as the step left it, and the
	// gateway's own streams work, a download and a direct push alike.
	dst := t.TempDir()
	_, err = c.DownloadOutput(ctx, "main", "victim", "out", dst)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dst, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "team-main-secret\n", string(got))
	entries, err := os.ReadDir(dst)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no stream-in landed")
	consume := nodeStep("consume", `cat in/secret`)
	consume.Team, consume.Tags = "main", []string{"v"}
	consume.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "victim", Output: "out"}}}
	g.run(t, consume)
	evs := g.stepEvents(ctx, t, "consume", "&team=main", 0)
	v = g.teamStep(t, "consume", "main")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	assert.Equal(t, "team-main-secret\n", outputOf(evs, wire.EventStdout), outputOf(evs, wire.EventStderr))
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_streams_total{mode="p2p",result="ok"}`), 1.0,
		"pushed pod to pod, with a ticket for that one stream")
}
