package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/wire"
)

// executeTask is a task config of two inputs (one at a path of its own)
// and an output; ((code)) is its exit status.
const executeTask = `platform: linux
image_resource:
  type: registry-image
  source: {repository: busybox, tag: ((tag))}
inputs:
- name: src
- name: lib
  path: deps/lib
outputs:
- name: out
caches:
- path: .cache
params:
  GREETING: hi
  OVERRIDDEN: from-config
  SLEEP:
run:
  path: sh
  args:
  - -c
  - |
    cat src/hello.txt deps/lib/version
    echo "$GREETING $OVERRIDDEN"
    echo to-stderr >&2
    mkdir -p out/sub && cat src/hello.txt deps/lib/version > out/sub/both
    [ -n "$SLEEP" ] && echo running && sleep "$SLEEP"
    exit ((code))
`

// execute runs `gateway execute` against g in work, returning its exit
// status, stdout and stderr.
func (g *gateway) execute(ctx context.Context, t *testing.T, work string, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), append([]string{"execute", "--url", g.base}, args...)...)
	cmd.Dir, cmd.Env = work, append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	require.NoError(t, err)
	return 0, stdout.String(), stderr.String()
}

// executeWork lays out a task.yml and two input folders.
func executeWork(t *testing.T) string {
	t.Helper()
	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "task.yml"), []byte(executeTask), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(work, "src"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(work, "lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(work, "src", "hello.txt"), []byte("hello\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "lib", "version"), []byte("1.2\n"), 0o644))
	return work
}

// TestGatewayExecute runs a task config from local folders as fly execute
// does: two inputs uploaded, the output streamed live, an output
// downloaded, params overridden from the environment, the exit status
// passed through, and Ctrl-C aborting the step with status 130.
func TestGatewayExecute(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[1], "execute", "{}\n", gatewayOptions{})
	work := executeWork(t)

	code, stdout, stderr := g.execute(ctx, t, work, []string{"OVERRIDDEN=from-env"},
		"-c", "task.yml", "-i", "src=src", "-i", "lib=lib", "-o", "out=got", "-v", "tag=1.37", "-v", "code=0")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Equal(t, "hello\n1.2\nhi from-env\n", stdout)
	assert.Contains(t, stderr, "to-stderr\n")
	assert.Contains(t, stderr, "warning: caches are not supported by jetway; ignoring cache .cache")
	assert.Contains(t, stderr, "uploaded input src from src")
	assert.Contains(t, stderr, "output out: 1 files into got")
	both, err := os.ReadFile(filepath.Join(work, "got", "sub", "both"))
	require.NoError(t, err)
	assert.Equal(t, "hello\n1.2\n", string(both))
	handle := regexp.MustCompile(`executing step (\S+)`).FindStringSubmatch(stderr)
	require.Len(t, handle, 2)
	v := g.step(t, handle[1])
	assert.Equal(t, wire.Succeeded, v.Phase)
	assert.True(t, v.Released, "execute releases the step's pod")

	code, stdout, stderr = g.execute(ctx, t, work, nil,
		"-c", "task.yml", "-i", "src=src", "-i", "lib=lib", "-o", "out=failed", "-v", "tag=1.37", "-v", "code=7")
	assert.Equal(t, 7, code, "the task's exit status: stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stderr, "not downloading outputs: the task failed")
	assert.NoDirExists(t, filepath.Join(work, "failed"))

	// Ctrl-C while the task runs: the step is aborted, the status 130.
	cmd := exec.CommandContext(ctx, gatewayBinary(t), "execute", "--url", g.base,
		"-c", "task.yml", "-i", "src=src", "-i", "lib=lib", "-v", "tag=1.37", "-v", "code=0")
	cmd.Dir, cmd.Env = work, append(os.Environ(), "SLEEP=60")
	errOut := &syncBuffer{}
	cmd.Stderr = errOut
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "running" {
	}
	require.Equal(t, "running", sc.Text(), errOut.String())
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, errOut.String())
	assert.Equal(t, 130, ee.ExitCode(), errOut.String())
	assert.Contains(t, errOut.String(), "interrupted: aborting the step")
	handle = regexp.MustCompile(`executing step (\S+)`).FindStringSubmatch(errOut.String())
	require.Len(t, handle, 2)
	v = g.step(t, handle[1])
	assert.Equal(t, wire.Aborted, v.Phase, "%+v", v)
	assert.True(t, v.Released)
}

// TestUploadsAndDownloadsRefuseWhatTheStepDoesNotAllow: an input the step
// does not upload is a 404, an input uploaded twice a 409, an output of a
// step still running a 409 and one it does not have a 404.
func TestUploadsAndDownloadsRefuseWhatTheStepDoesNotAllow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[0], "uploads", "{}\n", gatewayOptions{})
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	_, _, err = c.SubmitStep(ctx, wire.Request{Handle: "up", Type: "task", Image: "busybox",
		Run:     wire.Run{Path: "sh", Args: []string{"-c", "cat src/f; sleep 60"}},
		Inputs:  []wire.Input{{Name: "src", From: wire.InputSource{Upload: true}}},
		Outputs: []wire.Output{{Name: "out"}}})
	require.NoError(t, err)
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), []byte("uploaded\n"), 0o644))

	_, err = c.UploadInput(ctx, "", "up", "nope", src)
	assert.ErrorIs(t, err, client.ErrNotFound)
	got, err := c.UploadInput(ctx, "", "up", "src", src)
	require.NoError(t, err)
	assert.Positive(t, got.Bytes)
	_, err = c.UploadInput(ctx, "", "up", "src", src)
	assert.ErrorIs(t, err, client.ErrConflict)
	g.waitPhase(t, "up", wire.Running)
	_, err = c.DownloadOutput(ctx, "", "up", "out", t.TempDir())
	assert.ErrorIs(t, err, client.ErrConflict, "the step still runs")
	_, err = c.DownloadOutput(ctx, "", "up", "nope", t.TempDir())
	assert.ErrorIs(t, err, client.ErrNotFound)
	// A follower reads the events to the end while the step is aborted; a
	// released step's log goes with its pod.
	followed := g.followEvents(ctx, t, "up", "", 0)
	g.waitEvents(t, "up", 5)
	_, err = c.Abort(ctx, "", "up")
	require.NoError(t, err)
	evs := <-followed
	assert.Equal(t, "uploaded\n", outputOf(evs, wire.EventStdout), "the upload reached the process")
	code, body, _ := call(t, http.MethodGet, g.base+"/api/v1/steps/up/events", "")
	assert.Equal(t, http.StatusGone, code, body)
	assert.Contains(t, body, "went with its pod")
	last := evs[len(evs)-1]
	end := g.stepEvents(ctx, t, "up", "", last.N)
	assert.Equal(t, []wire.Event{last}, end, "its end is still there")
	var inputs []wire.Event
	for _, e := range evs {
		if e.Type == wire.EventInput {
			inputs = append(inputs, e)
		}
	}
	require.Len(t, inputs, 1)
	assert.Equal(t, got.SHA256, inputs[0].SHA256, "the input event has the upload's hash")
}
