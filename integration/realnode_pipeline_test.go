package integration

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// pipelineYAML is the real-node pipeline's: a resource type defined in
// the pipeline (the node's busybox image, whose /opt/resource is a test
// type, fetched with the stand-in registry-image base type), gets of it
// and of an image, a task from a get's task file in an image from a get,
// input and output mappings, a task cache, a put; a failing job whose
// task's image is an image_resource; a job whose get and put wait until
// aborted; a get of an image with root-only files, setuid binaries and
// hard links, with its layers, as a task's image. Nothing is checked but by fly (a check of the web node's own
// would run first and make fly's a no-op, without its log). MIRROR is where pods reach the node's registry.
const pipelineYAML = `
resource_types:
- name: test-type
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
resources:
- name: repo
  check_every: never
  type: test-type
  source: {uri: git://repo}
- name: base
  check_every: never
  type: registry-image
  source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
- name: target
  check_every: never
  type: test-type
  source: {uri: git://target}
jobs:
- name: build
  plan:
  - get: src
    resource: repo
  - get: base
    params: {skip_download: true}
  - task: make
    file: src/task.yml
    image: base
    output_mapping: {out: made}
  - task: use
    image: base
    input_mapping: {made-in: made}
    config:
      platform: linux
      inputs: [{name: made-in}]
      caches: [{path: cache}]
      run:
        path: sh
        args: [-c, 'echo "used $(cat made-in/made)"; echo x >> cache/seen; echo "cache holds $(wc -l < cache/seen)"']
  - put: target
    inputs: [src]
- name: failing
  plan:
  - task: fail
    config:
      platform: linux
      image_resource:
        type: registry-image
        source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
      run: {path: sh, args: [-c, 'echo "failing in $(pwd)" | tee /tmp/mark; exit 1']}
- name: rich
  plan:
  - get: base
    params: {format: rootfs}
  - task: look
    image: base
    config:
      platform: linux
      run:
        path: sh
        args: [-ec, 'stat -c "%n %a %u %g %h" /root /root/.key /etc/shadow /usr/bin/suid-probe /usr/share/hard/one /home/builder/.key; cat /root/.key']
- name: slow
  plan:
  - in_parallel:
    - get: repo
      params: {mode: in-slow}
    - put: target
      params: {mode: out-slow}
`

// TestRealNodeConcoursePipeline: a pipeline set with fly runs on a
// jetway target on the real node (kubelet, containerd, runc), through an
// unmodified web node. fly check-resource-type and check-resource run the
// checks with their logs; fly trigger-job --watch runs the job: its gets
// (the pipeline's own resource type, and an image fetched without its
// layers, pulled by the kubelet by digest from the node's registry), a
// task from a task file in a get, in that image, with an output mapped
// into the next task's input, a task cache, a put. fly watch follows the
// next build; the task cache is kept from build to build, and fly
// clear-task-cache empties it. fly execute --inputs-from runs with the
// job's inputs and image; a task whose program is missing errors. A
// failing build's last step is intercepted, also from a terminal without
// a command (sh on a terminal in the real container: the image has no
// bash). A get and a put are aborted while they run.
func TestRealNodeConcoursePipeline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "pipeline-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	const name = "rn-pipeline"
	rn := startRealNode(t)
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		resourceTypes: []wire.ResourceType{{Type: "registry-image", Image: rn.NodeImage("registry-image-image.tar"), Version: "test"}}})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	fly := func(within time.Duration, args ...string) (string, error) {
		fctx, fcancel := context.WithTimeout(ctx, within)
		defer fcancel()
		return web.FlyContext(fctx, args...)
	}
	mustFly := func(within time.Duration, args ...string) string {
		t.Helper()
		out, err := fly(within, args...)
		require.NoError(t, err, out)
		return out
	}
	work := t.TempDir()
	pipeline := filepath.Join(work, "pipeline.yml")
	writeFile(t, pipeline, []byte(strings.ReplaceAll(pipelineYAML, "MIRROR", rn.RegistryMirror())))
	mustFly(time.Minute, "set-pipeline", "-n", "-p", "p", "-c", pipeline)
	mustFly(time.Minute, "unpause-pipeline", "-p", "p")

	// Checks, with their logs: the type's through the base type's image,
	// the resources' through the type's.
	out := mustFly(2*time.Minute, "check-resource-type", "-r", "p/test-type")
	assert.Contains(t, out, "succeeded")
	out = mustFly(2*time.Minute, "check-resource", "-r", "p/repo")
	assert.Contains(t, out, `check got {"source":{"uri":"git://repo"}`)
	assert.Contains(t, out, "succeeded")
	for _, r := range []string{"p/base", "p/target"} {
		mustFly(2*time.Minute, "check-resource", "-r", r)
	}

	// The job, watched to its end.
	out = mustFly(3*time.Minute, "trigger-job", "-j", "p/build", "--watch")
	for _, want := range []string{
		"in wrote /tmp/build/get", // the pipeline type's get, with its log
		"fetched " + cluster.NodeRegistry + "/busybox@sha256:", "without its layers",
		"made by a task file", // Task.file from the get
		"used fetched",        // an output mapped into the next task's input
		"cache holds 1",
		`out got {"source":{"uri":"git://target"}} and fetched`, // the put, with the get as its input
		"succeeded",
	} {
		assert.Contains(t, out, want)
	}
	// The tasks ran in the image the get resolved, by digest.
	digest := regexp.MustCompile(`fetched \S+@(sha256:[0-9a-f]{64}) without its layers`).FindStringSubmatch(out)
	require.NotNil(t, digest, out)
	assert.Contains(t, g.logs.String(), `"image":"`+cluster.NodeRegistry+`/busybox@`+digest[1]+`"`)

	// The next builds, the first followed with fly watch: the cache is
	// kept from build to build; after clear-task-cache it is empty again.
	mustFly(time.Minute, "trigger-job", "-j", "p/build")
	out = mustFly(3*time.Minute, "watch", "-j", "p/build", "-b", "2")
	assert.Contains(t, out, "cache holds 2")
	assert.Contains(t, out, "succeeded")
	out = mustFly(3*time.Minute, "trigger-job", "-j", "p/build", "--watch")
	assert.Contains(t, out, "cache holds 3")
	out = mustFly(time.Minute, "clear-task-cache", "-j", "p/build", "-s", "use", "-n")
	assert.Contains(t, out, "1 caches removed")
	out = mustFly(3*time.Minute, "trigger-job", "-j", "p/build", "--watch")
	assert.Contains(t, out, "cache holds 1")

	// fly execute with the job's inputs and its image.
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\ninputs: [{name: src}]\nrun: {path: sh, args: [-c, 'echo \"executed with $(cat src/file)\"']}\n"))
	out = mustFly(3*time.Minute, "execute", "-c", task, "--inputs-from", "p/build", "--image", "base")
	assert.Contains(t, out, "executed with fetched")
	// A task whose program is not in its image errors, as on a stock
	// worker (Garden's ExecutableNotFoundError), rather than fails.
	missing := filepath.Join(work, "missing.yml")
	writeFile(t, missing, []byte("platform: linux\nrun: {path: no-such-program}\n"))
	out, err := fly(3*time.Minute, "execute", "-c", missing, "--inputs-from", "p/build", "--image", "base")
	require.Error(t, err, out)
	assert.Contains(t, out, "no-such-program: executable file not found")
	assert.Contains(t, out, "errored")

	// A failing build: its last step's container is kept, and fly
	// intercept runs in it.
	out, err = fly(3*time.Minute, "trigger-job", "-j", "p/failing", "--watch")
	require.Error(t, err, out)
	assert.Regexp(t, `failing in /tmp/build/[0-9a-f]+\r\n`, out, "a task runs on a terminal")
	assert.Contains(t, out, "failed")
	out = mustFly(time.Minute, "intercept", "-j", "p/failing", "-s", "fail", "--", "cat", "/tmp/mark")
	assert.Regexp(t, `failing in /tmp/build/[0-9a-f]+\n`, out)
	interceptOnATerminal(ctx, t, web, "-j", "p/failing", "-s", "fail")

	// An image with root-only files, setuid binaries and hard links,
	// fetched with its layers (no skip_download): the get's rootfs goes
	// to the holder whole, and a task runs in the image.
	out = mustFly(3*time.Minute, "trigger-job", "-j", "p/rich", "--watch")
	for _, want := range []string{"with its layers", "/root 700 0 0 ", "/root/.key 600 0 0 1", "/etc/shadow 640 0 42 1",
		"/usr/bin/suid-probe 4755 0 0 1", "/usr/share/hard/one 644 0 0 2", "/home/builder/.key 600 1000 1000 1", "root-only", "succeeded"} {
		assert.Contains(t, out, want)
	}

	// A get and a put that wait, aborted while they run.
	mustFly(time.Minute, "trigger-job", "-j", "p/slow")
	eventually(t, 2*time.Minute, func() error {
		out, _ := fly(10*time.Second, "watch", "-j", "p/slow", "-b", "1", "--timestamps")
		if !strings.Contains(out, "in waits") || !strings.Contains(out, "out waits") {
			return errorf("the get and the put do not run yet: %s", out)
		}
		return nil
	})
	mustFly(time.Minute, "abort-build", "-j", "p/slow", "-b", "1")
	out, err = fly(time.Minute, "watch", "-j", "p/slow", "-b", "1")
	require.Error(t, err, out)
	assert.Contains(t, out, "interrupted")
	assert.Contains(t, mustFly(time.Minute, "builds", "-j", "p/slow"), "aborted")
}
