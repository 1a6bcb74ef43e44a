package integration

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steppod"
)

// TestRealNodeConcourseTask: a real web node's build runs on the real
// node (kubelet, containerd, runc): fly execute's task runs in its
// container's pod, in the image its rootfs_uri names, in its build dir (a
// real subPath mount), with its param, its input moved into a nested mount
// and its output moved back out, which fly downloads; it runs as a user
// that is not root (uid 65534), which writes its output. The agent comes as
// an image volume (read-only over /jetway/bin): kubelet makes the mounts'
// folders, open to the task's user.
func TestRealNodeConcourseTask(t *testing.T) {
	testRealNodeConcourseTask(t, "rn-concourse", steppod.AgentImageVolume)
}

// TestRealNodeConcourseTaskInitContainer: the same with the fallback for
// runtimes without image volumes: the init container copies the agent
// and makes the mounts' folders.
func TestRealNodeConcourseTaskInitContainer(t *testing.T) {
	testRealNodeConcourseTask(t, "rn-concourse-init", steppod.AgentInitContainer)
}

func testRealNodeConcourseTask(t *testing.T, name string, mount steppod.AgentMount) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "realnode-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		agentMount: mount})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	work := t.TempDir()
	payload := rand.Text() + "\n"
	writeFile(t, filepath.Join(work, "in", "payload"), []byte(payload))
	require.NoError(t, os.Chmod(filepath.Join(work, "in", "payload"), 0o644), "readable by the task's user, as on a stock worker")
	download := filepath.Join(work, "out")
	require.NoError(t, os.MkdirAll(download, 0o755))
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\nparams: {NAME: node}\n"+
		"inputs: [{name: in}]\noutputs: [{name: out}]\n"+
		"run: {user: \"65534\", path: sh, args: [-ec, 'echo \"hello $NAME in $(pwd) as $(id -u)\"; cat in/payload > out/copy; cat /proc/1/cmdline; echo; grep \" /tmp/jetway/bin \" /proc/self/mountinfo || echo no agent volume']}\n"))
	fctx, fcancel := context.WithTimeout(ctx, 3*time.Minute)
	out, err := web.FlyContext(fctx, "execute", "-c", task, "-i", "in="+filepath.Join(work, "in"), "-o", "out="+download)
	fcancel()
	require.NoError(t, err, out)
	assert.Regexp(t, `hello node in /tmp/build/[0-9a-f]+ as 65534\r\n`, out, "a task runs on a terminal")
	assert.Contains(t, out, "/tmp/jetway/bin/step-agent", "pid 1 is the step agent: the task ran in its container's pod")
	if mount == steppod.AgentImageVolume {
		assert.Regexp(t, ` /tmp/jetway/bin ro,`, out, "the agent is a read-only volume of its own")
	} else {
		assert.Contains(t, out, "no agent volume", "the init container copied the agent into the pod's emptyDir")
	}
	got, err := os.ReadFile(filepath.Join(download, "copy"))
	require.NoError(t, err, out)
	assert.Equal(t, payload, string(got))
}

// TestRealNodeConcourseUncopyableOutput: a task whose output holds what
// the volume holder would refuse, a FIFO on a target that allows no
// privileged steps, fails its build at once (issue 41): fly execute
// shows the entry and why, the build ends errored, and no copy was tried
// at all: the pod's check of the output refused it when the task ended,
// before the output was held.
func TestRealNodeConcourseUncopyableOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "rn-uncopyable"
	client := cwn.Client{ID: "jetway", Secret: "uncopyable-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t)})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	work := t.TempDir()
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\noutputs: [{name: out}]\n"+
		"run: {path: sh, args: [-ec, 'mkfifo out/f; echo made']}\n"))
	download := filepath.Join(work, "out")
	require.NoError(t, os.MkdirAll(download, 0o755))
	fctx, fcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer fcancel()
	start := time.Now()
	out, err := web.FlyContext(fctx, "execute", "-c", task, "-o", "out="+download)
	require.NoError(t, fctx.Err(), "fly execute ends by itself, it does not hang: %s", out)
	require.Error(t, err, out)
	assert.Less(t, time.Since(start), 45*time.Second, "the whole build, its pod's start included")
	assert.Contains(t, out, "made", "the task ran")
	assert.Contains(t, out, `tar entry "f": a FIFO`, "the user sees the entry and why")
	assert.Contains(t, out, "errored")

	logs := g.logs.String()
	assert.NotContains(t, logs, `"msg":"volume move failed"`, "no copy tried")
	assert.NotContains(t, logs, `"msg":"direct stream failed; relaying"`, "no relay")
	assert.Zero(t, metricValue(t, g, `jetway_concourse_volume_holds_total{outcome="held"}`), "nothing held")
}

// TestRealNodeConcourseInputUnderOutput: a task whose input is mounted
// inside its output (Concourse's nested volume mounts, a testflight
// spec) leaves in the output what it wrote there and the empty folder
// the input was mounted on, as a stock worker's volume has them; the
// input's files stay the input's.
func TestRealNodeConcourseInputUnderOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "rn-nested"
	client := cwn.Client{ID: "jetway", Secret: "nested-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t)})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	work := t.TempDir()
	writeFile(t, filepath.Join(work, "in", "payload"), []byte("the input\n"))
	require.NoError(t, os.Chmod(filepath.Join(work, "in", "payload"), 0o644))
	download := filepath.Join(work, "out")
	require.NoError(t, os.MkdirAll(download, 0o755))
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\n"+
		"inputs: [{name: in, path: out/in}]\noutputs: [{name: out}]\n"+
		"run: {path: sh, args: [-ec, 'cat out/in/payload; echo written > out/written']}\n"))
	fctx, fcancel := context.WithTimeout(ctx, 3*time.Minute)
	out, err := web.FlyContext(fctx, "execute", "-c", task, "-i", "in="+filepath.Join(work, "in"), "-o", "out="+download)
	fcancel()
	require.NoError(t, err, out)
	assert.Contains(t, out, "the input")
	got, err := os.ReadFile(filepath.Join(download, "written"))
	require.NoError(t, err, "what the task wrote in its output: %s", out)
	assert.Equal(t, "written\n", string(got))
	entries, err := os.ReadDir(filepath.Join(download, "in"))
	require.NoError(t, err, "the folder the input was mounted on")
	assert.Empty(t, entries, "the input's files are the input's, not the output's")
}
