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
)

// TestRealNodeConcourseTask: a real web node's build runs on the real
// node (kubelet, containerd, runc): fly execute's task runs in its
// container's pod, in the image its rootfs_uri names, in its build dir (a
// real subPath mount), with its param, its input moved into a nested mount
// and its output moved back out, which fly downloads.
func TestRealNodeConcourseTask(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "realnode-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	const name = "rn-concourse"
	nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t)})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	work := t.TempDir()
	payload := rand.Text() + "\n"
	writeFile(t, filepath.Join(work, "in", "payload"), []byte(payload))
	download := filepath.Join(work, "out")
	require.NoError(t, os.MkdirAll(download, 0o755))
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\nparams: {NAME: node}\n"+
		"inputs: [{name: in}]\noutputs: [{name: out}]\n"+
		"run: {path: sh, args: [-c, 'echo \"hello $NAME in $(pwd)\"; cat in/payload > out/copy; cat /proc/1/cmdline']}\n"))
	fctx, fcancel := context.WithTimeout(ctx, 3*time.Minute)
	out, err := web.FlyContext(fctx, "execute", "-c", task, "-i", "in="+filepath.Join(work, "in"), "-o", "out="+download)
	fcancel()
	require.NoError(t, err, out)
	assert.Regexp(t, `hello node in /tmp/build/[0-9a-f]+\r\n`, out, "a task runs on a terminal")
	assert.Contains(t, out, "/jetway/bin/step-agent", "pid 1 is the step agent: the task ran in its container's pod")
	got, err := os.ReadFile(filepath.Join(download, "copy"))
	require.NoError(t, err, out)
	assert.Equal(t, payload, string(got))
}
