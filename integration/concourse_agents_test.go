package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	gclient "code.cloudfoundry.org/garden/client"
	gconn "code.cloudfoundry.org/garden/client/connection"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/internal/meshtest"
)

// TestConcourseRunsOnAgents: an agent's worker runs the web node's steps
// as processes on the agent's machine (fly execute, real web node, real
// fly, a real `gateway agent` joined over the mesh). A tagged task with
// params, an uploaded input and an output runs in a folder of the agent's
// work dir, its image not needed; fly downloads its output; its stdout
// and stderr are in the build's log, on a terminal as on any worker. fly
// intercept runs a command in its container, also on a terminal, and
// fly abort-build ends a running task's process. The agent offers no base
// resource type. A failing task fails the
// build, a privileged one is refused naming why. The agent killed and
// restarted mid-task, the task goes on and its build succeeds, its output
// shown once. The web node's collector destroys the containers: their
// folders are gone. One pipeline build runs across a cluster target and
// the agent, each task's output the next one's input, and the agent's
// task cache is reused by the next build.
func TestConcourseRunsOnAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second, GCInterval: time.Second,
		Args: []string{"--gc-one-off-grace-period", "15s", "--gc-hijack-grace-period", "15s"}})
	ca := meshtest.NewCA(t, "cw-agentrun-ca")
	member := meshMember(t, ca, ca, "cw-agentrun-gw", "127.0.0.1:0")
	dir := t.TempDir()
	const cluster = "cw-boxcl"
	placeTarget(ctx, t, clusters[0], dir, cluster, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{identity: "cw-agentrun-gw", mesh: member, state: newState(t),
		sweep: 500 * time.Millisecond, tokens: []api.Token{adminToken, mainToken}, concourse: concourseTSA(t, web)})
	const name = "cw-box"
	ag := joinAgent(t, g, ca, name, "--platform", "linux", "--tag", "box")
	w := flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	assert.Empty(t, w.ResourceTypes, "an agent runs no image, so no base resource type: checks, gets and puts go elsewhere")
	containers := filepath.Join(ag.work, "concourse", "containers")

	work := t.TempDir()
	execute := func(args ...string) (string, error) {
		fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
		defer fcancel()
		return web.FlyContext(fctx, append([]string{"execute", "--tag", "box"}, args...)...)
	}

	// A task with params, an uploaded input and an output, without an
	// image: it runs in the agent's folder.
	upload, download := filepath.Join(work, "in"), filepath.Join(work, "out")
	payload := rand.Text() + "\n"
	writeFile(t, filepath.Join(upload, "payload"), []byte(payload))
	require.NoError(t, os.MkdirAll(download, 0o755))
	copyTask := filepath.Join(work, "copy.yml")
	writeFile(t, copyTask, []byte("platform: linux\nparams: {NAME: jetway}\ninputs: [{name: in}]\noutputs: [{name: out}]\n"+
		"run: {path: sh, args: [-c, 'cat in/payload > out/copy && echo \"hello $NAME\" && echo to-stderr >&2']}\n"))
	out, err := execute("-c", copyTask, "-i", "in="+upload, "-o", "out="+download)
	require.NoError(t, err, out)
	assert.Contains(t, out, "hello jetway\r\n", "a task runs on a terminal, as on any worker")
	assert.Contains(t, out, "to-stderr")
	assert.Contains(t, out, "succeeded")
	got, err := os.ReadFile(filepath.Join(download, "copy"))
	require.NoError(t, err, out)
	assert.Equal(t, payload, string(got))
	build := regexp.MustCompile(`executing build (\d+)`).FindStringSubmatch(out)
	require.NotNil(t, build, out)

	// Its container is on the agent's worker, a folder of its work dir.
	var handle string
	for _, c := range flyContainers(t, web) {
		if c.WorkerName == name && c.Type == "task" {
			handle = c.ID
		}
	}
	require.NotEmpty(t, handle, "fly containers lists the task's container on %s: %v", name, flyContainers(t, web))
	assert.DirExists(t, filepath.Join(containers, handle))
	assert.True(t, slices.ContainsFunc(flyVolumes(t, web), func(v flyRow) bool { return v.WorkerName == name }),
		"fly volumes lists volumes on %s", name)

	// fly intercept runs a command in the build's container, with the
	// task's params.
	ictx, icancel := context.WithTimeout(ctx, 60*time.Second)
	iout, err := web.FlyContext(ictx, "intercept", "-b", build[1], "--", "sh", "-c", `echo "intercepted $NAME"`)
	icancel()
	require.NoError(t, err, iout)
	assert.Contains(t, iout, "intercepted jetway")
	// And on a terminal of the agent's machine, resized.
	interceptOnATerminal(ctx, t, web, "-b", build[1])

	// A failing task fails the build; a privileged one is refused.
	failing := filepath.Join(work, "failing.yml")
	writeFile(t, failing, []byte("platform: linux\nrun: {path: sh, args: [-c, 'echo failing-here >&2; exit 3']}\n"))
	out, err = execute("-c", failing)
	require.Error(t, err, out)
	assert.Contains(t, out, "failing-here")
	assert.Contains(t, out, "failed")
	// (The web node asks for a privileged container only with an image:
	// Garden's own client asks here.)
	srv := httptest.NewServer(g.containers.API(name))
	t.Cleanup(srv.Close)
	gc := gclient.New(gconn.New("tcp", strings.TrimPrefix(srv.URL, "http://")))
	_, err = gc.Create(garden.ContainerSpec{Handle: "cw-box-privileged", Privileged: true})
	assert.ErrorContains(t, err, "worker cw-box is an agent: it runs processes as its own user, never privileged")
	assert.NoDirExists(t, filepath.Join(containers, "cw-box-privileged"))

	// fly abort-build ends a running task: its process is killed.
	sleeping := filepath.Join(work, "sleeping")
	sleeper := filepath.Join(work, "sleeper.yml")
	writeFile(t, sleeper, []byte("platform: linux\nrun: {path: sh, args: [-c, 'echo sleeping; touch "+sleeping+"; exec sleep 600']}\n"))
	aborted := flyAsync(ctx, web, 90*time.Second, "execute", "--tag", "box", "-c", sleeper)
	awaitFile(t, sleeping, 60*time.Second)
	_, err = web.Fly("abort-build", "-b", startedBuild(t, web))
	require.NoError(t, err)
	select {
	case r := <-aborted:
		assert.Contains(t, fmt.Sprintf("%s\nfly: %v", r.out, r.err), "interrupted")
	case <-time.After(60 * time.Second):
		t.Fatal("fly execute did not end after fly abort-build")
	}
	waitNoStepProcesses(t, ag.work)

	// The agent killed mid-task and started again: the task, which runs
	// on without it, ends once it is back, and the build succeeds.
	started, release := filepath.Join(work, "started"), filepath.Join(work, "release")
	waiter := filepath.Join(work, "waiter.yml")
	writeFile(t, waiter, []byte(fmt.Sprintf("platform: linux\nrun: {path: sh, args: [-c, "+
		"'echo waiting; touch %s; until [ -e %s ]; do sleep 0.05; done; echo released']}\n", started, release)))
	done := flyAsync(ctx, web, 90*time.Second, "execute", "--tag", "box", "-c", waiter)
	awaitFile(t, started, 60*time.Second)
	ag.kill(t)
	ag.restart(t)
	waitWorker(t, g, name, "running")
	writeFile(t, release, nil)
	select {
	case r := <-done:
		out := fmt.Sprintf("%s\nfly: %v", r.out, r.err)
		assert.Contains(t, out, "succeeded", out)
		assert.Equal(t, 1, strings.Count(out, "waiting\r\n"), "the task's output is shown once: %s", out)
		assert.Equal(t, 1, strings.Count(out, "released\r\n"), out)
	case <-ctx.Done():
		t.Fatal("fly execute did not end after the agent's restart")
	}

	// The web node collects the one-off builds' containers: their
	// folders go.
	eventually(t, 90*time.Second, func() error {
		if slices.ContainsFunc(flyContainers(t, web), func(c flyRow) bool { return c.WorkerName == name }) {
			return errorf("fly still lists containers on %s", name)
		}
		entries, err := os.ReadDir(containers)
		if err != nil {
			return err
		}
		if len(entries) > 0 {
			return errorf("the agent still holds %d containers", len(entries))
		}
		return nil
	})

	// One build across a cluster target and the agent: an output made in
	// a pod is an input on the agent, whose output is an input in a pod
	// again (the web node streams each between the two workers).
	pipeline := filepath.Join(work, "pipeline.yml")
	writeFile(t, pipeline, []byte(`jobs:
- name: across
  plan:
  - task: make
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      outputs: [{name: made}]
      run: {path: sh, args: [-c, 'echo from-the-cluster > made/file']}
  - task: use
    tags: [box]
    config:
      platform: linux
      inputs: [{name: made}]
      outputs: [{name: used}]
      caches: [{path: cache}]
      run: {path: sh, args: [-c, 'echo "$(cat made/file), through the agent" > used/file; echo "on the agent: $(cat made/file)"; echo "cached: $(cat cache/n 2>/dev/null)"; echo 1 > cache/n']}
  - task: back
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      inputs: [{name: used}]
      run: {path: sh, args: [-c, 'echo "back on the cluster: $(cat used/file)"']}
`))
	fly := func(args ...string) string {
		t.Helper()
		fctx, fcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer fcancel()
		out, err := web.FlyContext(fctx, args...)
		require.NoError(t, err, out)
		return out
	}
	fly("set-pipeline", "-n", "-p", "across", "-c", pipeline)
	fly("unpause-pipeline", "-p", "across")
	out = fly("trigger-job", "-j", "across/across", "--watch")
	assert.Contains(t, out, "selected worker:\x1b[0m "+cluster)
	assert.Contains(t, out, "selected worker:\x1b[0m "+name)
	assert.Contains(t, out, "on the agent: from-the-cluster\r\n")
	assert.Contains(t, out, "back on the cluster: from-the-cluster, through the agent\r\n")
	assert.Contains(t, out, "cached: \r\n", "the first build's task cache is empty")
	assert.Contains(t, out, "succeeded")
	// The task cache on the agent is reused by the next build.
	out = fly("trigger-job", "-j", "across/across", "--watch")
	assert.Contains(t, out, "cached: 1\r\n", "the next build reuses the task cache")
	assert.Contains(t, out, "succeeded")
}

// TestConcourseAgentBuildsOutliveAGatewayKill: a task on an agent's
// worker; the gateway the agent joined (one of two `gateway run`
// replicas, registered over REST) is SIGKILLed mid-task and started
// again. The agent joins it again, it registers the agent's worker again,
// the web node attaches to the process again through it, and the build
// succeeds, the task run once.
func TestConcourseAgentBuildsOutliveAGatewayKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "agent-kill-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	secret := filepath.Join(t.TempDir(), "secret")
	writeFile(t, secret, []byte(client.Secret))
	ca := meshtest.NewCA(t, "cw-agentkill-ca")
	rs := replicasOf(t, ca, t.TempDir(), "--concourse-url", web.URL, "--concourse-client-id", client.ID,
		"--concourse-client-secret-file", secret, "--concourse-worker-address", "127.0.0.1",
		"--concourse-insecure", "--concourse-web-node-networks", "127.0.0.1")
	const name = "cw-kbox"
	caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), name, time.Now().Add(time.Hour), meshtest.AgentURIs("", "box")...)
	work := t.TempDir()
	t.Cleanup(func() { killStepProcesses(t, work) })
	startAgent(t, "--join", rs[0].mesh, "--ca", caFile, "--cert", certFile, "--key", keyFile, "--work-dir", work,
		"--platform", "linux", "--tag", "box", "--log-level", "debug")
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	task, runs, release := waitingTask(t, "platform: linux\n")
	done := flyAsync(ctx, web, 3*time.Minute, "execute", "--tag", "box", "-c", task)
	awaitFile(t, runs, 90*time.Second)
	rs[0].kill(t)
	rs[0].start(t)
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	writeFile(t, release, nil)
	var r flyResult
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("fly execute did not end")
	}
	require.NoError(t, r.err, r.out)
	assert.Contains(t, r.out, "finished\r\n")
	assert.Contains(t, r.out, "succeeded")
	b, err := os.ReadFile(runs)
	require.NoError(t, err)
	assert.Equal(t, "ran\n", string(b), "the task ran once")
	// The restarted gateway served the web node's attach to the process.
	attach := regexp.MustCompile(`"msg":"web node call"[^\n]*"method":"GET","path":"/containers/[^"]+/processes/[^"]+"`)
	eventually(t, 10*time.Second, func() error {
		if !attach.MatchString(rs[0].proc.logs.String()) {
			return errorf("the restarted gateway logged no attach of the web node's")
		}
		return nil
	})
}

// startedBuild is the ID of the web node's one started build.
func startedBuild(t *testing.T, web *cwn.WebNode) string {
	t.Helper()
	out, err := web.Fly("builds", "--json")
	require.NoError(t, err)
	var builds []struct {
		ID     int    `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &builds), out)
	var started []string
	for _, b := range builds {
		if b.Status == "started" {
			started = append(started, fmt.Sprint(b.ID))
		}
	}
	require.Len(t, started, 1, "started builds: %s", out)
	return started[0]
}
