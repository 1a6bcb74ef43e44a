package stepagent_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/pty"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/volumes"
)

var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "step-agent-test-")
	if err != nil {
		panic(err)
	}
	agentBin = filepath.Join(dir, "step-agent")
	if out, err := exec.Command("go", "build", "-o", agentBin, "github.com/jetway-ci/jetway/cmd/step-agent").CombinedOutput(); err != nil {
		panic(fmt.Sprintf("build step-agent: %v\n%s", err, out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "stepagent: leaked goroutines:", err)
		code = 1
	}
	os.Exit(code)
}

// agent runs the step agent in root, as an exec would.
func agent(t *testing.T, root string, stdin []byte, args ...string) ([]byte, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, args...)
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+root)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return append(out, stderr.Bytes()...), ee.ExitCode()
	}
	require.NoError(t, err, stderr.String())
	return out, 0
}

// newStep prepares a root for a step running sh -c script.
func newStep(t *testing.T, script string, change ...func(*stepagent.Spec)) (string, []byte) {
	t.Helper()
	root := t.TempDir()
	sp := stepagent.Spec{Handle: "h", Path: "sh", Args: []string{"-c", script}, KillGrace: stepagent.Duration(time.Second)}
	for _, c := range change {
		c(&sp)
	}
	raw, err := json.Marshal(sp)
	require.NoError(t, err)
	t.Cleanup(func() { killAll(t, root) })
	return root, raw
}

// killAll kills what a test left running in root, as pod deletion would,
// and waits for the supervisor to be gone: the run command returns at the
// log's status frame, a moment before the supervisor writes status.json,
// and a supervisor killed mid-write may still create a file there.
func killAll(t *testing.T, root string) {
	for _, f := range []string{stepagent.LockFile, stepagent.StartedFile, stepagent.DaemonLock} {
		b, _ := os.ReadFile(stepagent.Path(root, f))
		var st stepagent.Started
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil && json.Unmarshal(b, &st) == nil {
			pid = st.PID
		}
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	lock, err := os.Open(stepagent.Path(root, stepagent.LockFile))
	if err != nil {
		return // no supervisor ever ran
	}
	defer lock.Close()
	assert.Eventually(t, func() bool {
		return syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
	}, 10*time.Second, 2*time.Millisecond, "the supervisor in %s exits", root)
}

// run starts the step in root with its spec and follows it to the end.
func run(t *testing.T, root string, spec []byte) []stepagent.Frame {
	t.Helper()
	out, code := agent(t, root, slices.Concat(spec, []byte("[]")), "run", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2")
	require.Equal(t, 0, code, "%s", out)
	return frames(t, out)
}

// position reads a KindPosition frame.
func position(t *testing.T, f stepagent.Frame) stepagent.Position {
	t.Helper()
	require.Equal(t, stepagent.KindPosition, f.Kind)
	var p stepagent.Position
	require.NoError(t, json.Unmarshal(f.Payload, &p))
	return p
}

func frames(t *testing.T, b []byte) []stepagent.Frame {
	t.Helper()
	var fs []stepagent.Frame
	r := bufio.NewReader(bytes.NewReader(b))
	for {
		f, err := stepagent.ReadFrame(r)
		if errors.Is(err, io.EOF) {
			return fs
		}
		require.NoError(t, err)
		fs = append(fs, f)
	}
}

// outcome reads the output per stream and the first status frame.
func outcome(t *testing.T, fs []stepagent.Frame) (stdout, stderr string, st stepagent.Status) {
	t.Helper()
	for _, f := range fs {
		switch f.Kind {
		case stepagent.KindStdout:
			stdout += string(f.Payload)
		case stepagent.KindStderr:
			stderr += string(f.Payload)
		case stepagent.KindStatus:
			require.NoError(t, json.Unmarshal(f.Payload, &st))
			return
		}
	}
	t.Fatal("no status frame")
	return
}

func TestExitStatusIsExact(t *testing.T) {
	for _, tt := range []struct {
		script string
		code   int
		signal string
	}{{"exit 0", 0, ""}, {"exit 1", 1, ""}, {"exit 42", 42, ""}, {"exit 255", 255, ""}, {"kill -9 $$", 137, "killed"}} {
		t.Run(tt.script, func(t *testing.T) {
			root, spec := newStep(t, tt.script)
			_, _, st := outcome(t, run(t, root, spec))
			assert.Equal(t, stepagent.ReasonExited, st.Reason)
			assert.Equal(t, tt.code, st.ExitStatus)
			assert.Equal(t, tt.signal, st.Signal)
		})
	}
}

func TestOutputIsCompleteAndInOrderPerStream(t *testing.T) {
	root, spec := newStep(t, `i=1; while [ $i -le 200 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; head -c 100000 /dev/zero | tr '\0' x`)
	fs := run(t, root, spec)
	stdout, stderr, st := outcome(t, fs)
	var wantOut, wantErr strings.Builder
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	wantOut.WriteString(strings.Repeat("x", 100000))
	assert.Equal(t, wantOut.String(), stdout)
	assert.Equal(t, wantErr.String(), stderr)
	assert.Equal(t, 0, st.ExitStatus)
	for _, f := range fs {
		assert.LessOrEqual(t, len(f.Payload), stepagent.MaxPayload)
	}
	assert.Equal(t, stepagent.Position{}, position(t, fs[0]), "the tail says where it starts")
	assert.Equal(t, stepagent.KindStarted, fs[1].Kind, "started comes first")
	last := fs[len(fs)-1]
	assert.Equal(t, stepagent.KindStatus, last.Kind, "the trailer comes last")
}

func TestADroppedFollowerLosesNothingAndRunsOnce(t *testing.T) {
	root, spec := newStep(t, `echo run >> ../ran; i=1; while [ $i -le 30 ]; do echo "line $i"; i=$((i+1)); sleep 0.02; done; exit 3`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, "run", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2")
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+root)
	cmd.Stdin = bytes.NewReader(slices.Concat(spec, []byte("[]")))
	pipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	// Read three frames of the log (started and two lines), then kill the
	// follower, as a kwok node does when the exec drops.
	r := bufio.NewReader(pipe)
	f, err := stepagent.ReadFrame(r)
	require.NoError(t, err)
	require.Equal(t, stepagent.Position{}, position(t, f))
	var offset int64
	for range 3 {
		f, err := stepagent.ReadFrame(r)
		require.NoError(t, err)
		offset += f.Size()
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	// Two followers at once from that offset: both get the rest.
	var wg sync.WaitGroup
	results := make([][]byte, 2)
	for i := range results {
		wg.Go(func() {
			results[i], _ = agent(t, root, nil, "tail", "--offset", strconv.FormatInt(offset, 10), "--events", "3")
		})
	}
	wg.Wait()
	for _, res := range results {
		fs := frames(t, res)
		assert.Equal(t, stepagent.Position{Offset: offset, Events: 3}, position(t, fs[0]))
		stdout, _, st := outcome(t, fs)
		var want strings.Builder
		for i := 3; i <= 30; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		assert.Equal(t, want.String(), stdout)
		assert.Equal(t, 3, st.ExitStatus)
	}
	// run again: the process does not start again.
	_, _, st := outcome(t, run(t, root, spec))
	assert.Equal(t, 3, st.ExitStatus)
	ran, err := os.ReadFile(filepath.Join(root, "ran"))
	require.NoError(t, err)
	assert.Equal(t, "run\n", string(ran))
}

func TestConcurrentRunsStartOnce(t *testing.T) {
	root, spec := newStep(t, `echo run >> ../ran; echo hi`)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, _, st := outcome(t, run(t, root, spec))
			assert.Equal(t, 0, st.ExitStatus)
		})
	}
	wg.Wait()
	ran, err := os.ReadFile(filepath.Join(root, "ran"))
	require.NoError(t, err)
	assert.Equal(t, "run\n", string(ran))
}

func TestLostSupervisorIsReported(t *testing.T) {
	root, spec := newStep(t, `echo started; exec sleep 600`)
	out, code := agent(t, root, slices.Concat(spec, []byte("[]")), "prepare", "--spec-bytes", strconv.Itoa(len(spec)))
	require.Equal(t, 0, code, "%s", out)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, "run", "--inputs-bytes", "2")
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+root)
	cmd.Stdin = strings.NewReader("[]")
	pipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	br := bufio.NewReader(pipe)
	f, err := stepagent.ReadFrame(br)
	require.NoError(t, err)
	require.Equal(t, stepagent.KindPosition, f.Kind)
	f, err = stepagent.ReadFrame(br)
	require.NoError(t, err)
	require.Equal(t, stepagent.KindStarted, f.Kind)
	// Its first output is in the log before the supervisor dies.
	f, err = stepagent.ReadFrame(br)
	require.NoError(t, err)
	require.Equal(t, stepagent.KindStdout, f.Kind)
	cancel()
	_ = cmd.Wait()
	b, err := os.ReadFile(stepagent.Path(root, stepagent.LockFile))
	require.NoError(t, err)
	pid, err := strconv.Atoi(string(b))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL), "the supervisor dies (an OOM kill, say)")

	out, code = agent(t, root, nil, "tail", "--offset", "0")
	require.Equal(t, 0, code, "%s", out)
	stdout, _, st := outcome(t, frames(t, out))
	assert.Equal(t, "started\n", stdout)
	assert.Equal(t, stepagent.ReasonLost, st.Reason)
	_, _, again := outcome(t, run(t, root, spec))
	assert.Equal(t, stepagent.ReasonLost, again.Reason, "never run again")
}

func TestTimeoutAndAbort(t *testing.T) {
	root, spec := newStep(t, `echo going; exec sleep 600`, func(sp *stepagent.Spec) { sp.Timeout = stepagent.Duration(300 * time.Millisecond) })
	stdout, _, st := outcome(t, run(t, root, spec))
	assert.Equal(t, "going\n", stdout)
	assert.Equal(t, stepagent.ReasonTimeout, st.Reason)
	assert.Equal(t, "timed out after 300ms", st.Message)
	assert.Equal(t, 128+int(syscall.SIGTERM), st.ExitStatus)

	root, spec = newStep(t, `trap '' TERM; echo stubborn; while :; do sleep 0.05; done`)
	done := make(chan []stepagent.Frame)
	go func() { done <- run(t, root, spec) }()
	require.Eventually(t, func() bool { return fileHas(root, stepagent.LogFile, "stubborn") }, 10*time.Second, 10*time.Millisecond)
	out, code := agent(t, root, nil, "abort")
	require.Equal(t, 0, code, "%s", out)
	_, _, st = outcome(t, <-done)
	assert.Equal(t, stepagent.ReasonAborted, st.Reason)
	assert.Equal(t, 137, st.ExitStatus, "TERM ignored: KILL after the grace")
}

func fileHas(root, rel, s string) bool {
	b, _ := os.ReadFile(stepagent.Path(root, rel))
	return strings.Contains(string(b), s)
}

func TestAbortBeforeStartNeverStarts(t *testing.T) {
	root, spec := newStep(t, `echo run >> ../ran`)
	_, code := agent(t, root, spec, "prepare", "--spec-bytes", strconv.Itoa(len(spec)))
	require.Equal(t, 0, code)
	_, code = agent(t, root, nil, "abort")
	require.Equal(t, 0, code)
	out, code := agent(t, root, []byte("[]"), "run", "--inputs-bytes", "2")
	require.Equal(t, 0, code, "%s", out)
	_, _, st := outcome(t, frames(t, out))
	assert.Equal(t, stepagent.ReasonAborted, st.Reason)
	assert.NoFileExists(t, filepath.Join(root, "ran"))
}

func TestProcessEnvironmentStdinAndSpawnFailure(t *testing.T) {
	t.Setenv("FROM_IMAGE", "image value")
	root, spec := newStep(t, `echo "$FROM_IMAGE|$GIVEN|${JETWAY_STEP_ROOT:-unset}|$(pwd)"; cat`, func(sp *stepagent.Spec) {
		sp.Env = []string{"GIVEN=given value"}
		sp.Stdin = []byte("from stdin\n")
		sp.Dir = "work/dir"
	})
	stdout, _, st := outcome(t, run(t, root, spec))
	build, err := filepath.EvalSymlinks(filepath.Join(root, "build", "work", "dir"))
	require.NoError(t, err)
	assert.Equal(t, "image value|given value|unset|"+build+"\nfrom stdin\n", stdout)
	assert.Equal(t, 0, st.ExitStatus)

	root, spec = newStep(t, "", func(sp *stepagent.Spec) { sp.Path, sp.Args = "no-such-program", nil })
	_, _, st = outcome(t, run(t, root, spec))
	assert.Equal(t, stepagent.ReasonSpawnFailed, st.Reason)
	assert.Equal(t, 127, st.ExitStatus)
	assert.Contains(t, st.Message, "no-such-program")
}

func TestPrepareIsIdempotentAndRefusesAnotherSpec(t *testing.T) {
	root, spec := newStep(t, "true", func(sp *stepagent.Spec) {
		sp.Volumes = []stepagent.Volume{{Handle: "input-src", Path: "src"}, {Handle: "output-out", Path: "out/put"}}
	})
	for range 2 {
		out, code := agent(t, root, spec, "prepare", "--spec-bytes", strconv.Itoa(len(spec)))
		require.Equal(t, 0, code, "%s", out)
	}
	other := bytes.Replace(spec, []byte(`"true"`), []byte(`"false"`), 1)
	out, code := agent(t, root, other, "prepare", "--spec-bytes", strconv.Itoa(len(other)))
	assert.Equal(t, stepagent.ExitSpecDiffers, code, "%s", out)
	_, code = agent(t, root, nil, "tail")
	assert.Equal(t, stepagent.ExitNotStarted, code)
	_, code = agent(t, t.TempDir(), nil, "tail")
	assert.Equal(t, stepagent.ExitNotPrepared, code)

	// The sidecar serves the step's volumes: what streams in lands in the
	// build dir.
	srv, err := volumes.Start(root, ownership.TokenHash("the-pods-token"))
	require.NoError(t, err)
	defer srv.Kill()
	tarball := tarOf(t, map[string]string{"file.txt": "hello"})
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d/volumes/input-src/stream-in", srv.Port()), bytes.NewReader(tarball))
	req.Header.Set("Authorization", "Bearer the-pods-token")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	got, err := os.ReadFile(filepath.Join(root, "build", "src", "file.txt"))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	link, err := os.Readlink(filepath.Join(root, "volumes", "input-src"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join("..", "build", "src"), link)
}

func TestExitCode(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code int
		ok   bool
	}{
		{utilexec.CodeExitError{Err: errors.New("command terminated with exit code 3"), Code: 3}, 3, true},
		{fmt.Errorf("wrapped: %w", utilexec.CodeExitError{Code: 4}), 4, true},
		{errors.New("Internal error occurred: error executing command in container: cmd wait: bin/step-agent tail --offset 0: exit status 5"), 5, true},
		{errors.New("Internal error occurred: Internal error occurred: error executing command in container: cmd wait: sh -c echo exit status 9: exit status 42"), 42, true},
		{errors.New("Internal error occurred: error executing command in container: cmd wait: sh -c kill -9 $$: signal: killed"), 0, false},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), 0, false},
	} {
		code, ok := stepagent.ExitCode(tt.err)
		assert.Equal(t, tt.ok, ok, tt.err.Error())
		assert.Equal(t, tt.code, code, tt.err.Error())
	}
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func TestRunsOfASandboxAreApartAndForgotten(t *testing.T) {
	root, _ := newStep(t, "")
	specOf := func(script string) []byte {
		raw, err := json.Marshal(stepagent.Spec{Handle: "h", Path: "sh", Args: []string{"-c", script}})
		require.NoError(t, err)
		return raw
	}
	results := map[string]string{}
	for _, name := range []string{"check-1", "check-2"} {
		spec := specOf("echo " + name + "; pwd")
		out, code := agent(t, root, slices.Concat(spec, []byte("[]")),
			"run", "--run", name, "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2")
		require.Equal(t, 0, code, "%s", out)
		stdout, _, st := outcome(t, frames(t, out))
		require.Equal(t, 0, st.ExitStatus)
		results[name] = stdout
	}
	for name, stdout := range results {
		runRoot, err := stepagent.RunRoot(root, name)
		require.NoError(t, err)
		assert.Equal(t, name+"\n"+stepagent.Path(runRoot, stepagent.BuildDir)+"\n", stdout, "each run has its own build dir")
		out, code := agent(t, root, nil, "forget", "--run", name)
		require.Equal(t, 0, code, "%s", out)
		assert.NoDirExists(t, runRoot)
	}

	out, code := agent(t, root, nil, "run", "--run", "../escape", "--inputs-bytes", "0")
	assert.Equal(t, stepagent.ExitUsage, code)
	assert.Contains(t, string(out), `run "../escape": not a folder name`)
	out, code = agent(t, root, nil, "forget")
	assert.Equal(t, stepagent.ExitUsage, code)
	assert.Contains(t, string(out), "forget needs --run")
}

func TestARunningRunIsNotForgotten(t *testing.T) {
	root, _ := newStep(t, "")
	raw, err := json.Marshal(stepagent.Spec{Handle: "h", Path: "sh", Args: []string{"-c", "echo up; sleep 30"}, KillGrace: stepagent.Duration(time.Second)})
	require.NoError(t, err)
	runRoot, err := stepagent.RunRoot(root, "long")
	require.NoError(t, err)
	t.Cleanup(func() { killAll(t, runRoot) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, "run", "--run", "long", "--spec-bytes", strconv.Itoa(len(raw)), "--inputs-bytes", "2")
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+root)
	cmd.Stdin = bytes.NewReader(slices.Concat(raw, []byte("[]")))
	pipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := bufio.NewReader(pipe)
	for range 3 { // the position, started, "up": the process runs
		_, err := stepagent.ReadFrame(r)
		require.NoError(t, err)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	out, code := agent(t, root, nil, "forget", "--run", "long")
	assert.Equal(t, 1, code)
	assert.Contains(t, string(out), "still runs")
	assert.FileExists(t, stepagent.Path(runRoot, stepagent.SpecFile))
}

// request writes a sandbox session request for a run of script.
func request(t *testing.T, w io.Writer, run, script string) {
	t.Helper()
	spec, err := json.Marshal(stepagent.Spec{Handle: run, Path: "sh", Args: []string{"-c", script}})
	require.NoError(t, err)
	head, err := json.Marshal(stepagent.Request{Run: run, SpecBytes: len(spec), InputsBytes: 2})
	require.NoError(t, err)
	require.NoError(t, stepagent.WriteFrame(w, stepagent.KindRequest, head))
	_, err = w.Write(slices.Concat(spec, []byte("[]")))
	require.NoError(t, err)
}

func TestServeMuxesRunsOfOneSession(t *testing.T) {
	root, _ := newStep(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, "serve")
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+root)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	require.NoError(t, stepagent.WriteFrame(stdin, stepagent.KindPing, nil))
	for i := range 3 {
		request(t, stdin, fmt.Sprintf("check-%d", i), fmt.Sprintf(`i=0; while [ $i -lt 300 ]; do echo "run %d line $i"; i=$((i+1)); done; exit %d`, i, i))
	}
	request(t, stdin, "../bad", "true")
	logs := map[string]*bytes.Buffer{}
	ended := map[string]bool{}
	var runErr string
	r := bufio.NewReader(stdout)
	for len(ended) < 3 || runErr == "" {
		f, err := stepagent.ReadFrame(r)
		require.NoError(t, err)
		run := string(f.Payload[1 : 1+f.Payload[0]])
		chunk := f.Payload[1+f.Payload[0]:]
		switch f.Kind {
		case stepagent.KindRunError:
			runErr = run + ": " + string(chunk)
		case stepagent.KindMux:
			if logs[run] == nil {
				logs[run] = &bytes.Buffer{}
			}
			logs[run].Write(chunk)
			// The agent logs a status frame, and tail adds the trailer:
			// two in a row end a run's log.
			if b := logs[run].Bytes(); isComplete(b) {
				fs := frames(t, b)
				if len(fs) > 1 && fs[len(fs)-1].Kind == stepagent.KindStatus && fs[len(fs)-2].Kind == stepagent.KindStatus {
					ended[run] = true
				}
			}
		}
	}
	assert.Equal(t, `../bad: run "../bad": not a folder name`, runErr)
	for i := range 3 {
		fs := frames(t, logs[fmt.Sprintf("check-%d", i)].Bytes())
		assert.Equal(t, stepagent.Position{}, position(t, fs[0]), "a run's log is tailed from its start")
		stdout, _, st := outcome(t, fs)
		assert.Equal(t, i, st.ExitStatus)
		assert.Equal(t, 300, strings.Count(stdout, fmt.Sprintf("run %d line", i)))
	}
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait(), "the session ends with its stdin")
}

// isComplete reports whether b is whole frames.
func isComplete(b []byte) bool {
	r := bytes.NewReader(b)
	for {
		if _, err := stepagent.ReadFrame(r); err != nil {
			return errors.Is(err, io.EOF)
		}
	}
}

// A streamed stdin (a Concourse web node's process) is what `run --stdin`
// gets after its inputs, in frames, to the frame that ends it (the exec's
// stdin itself is never closed here, as kwok never passes that on); an
// absolute working dir is used as it is, under JETWAY_STEP_FS where that
// stands in for the container's.
func TestStreamedStdinAndAbsoluteDir(t *testing.T) {
	fsRoot := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(fsRoot, "tmp", "build", "x"), 0o755))
	t.Setenv(stepagent.FSEnv, fsRoot)
	root, spec := newStep(t, `pwd; cat; echo read-all`, func(sp *stepagent.Spec) {
		sp.StdinStream, sp.Dir = true, "/tmp/build/x"
	})
	var framed bytes.Buffer
	require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindStdin, []byte("{\"source\":")))
	require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindStdin, []byte("{}}\n")))
	require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindStdinEnd, nil))
	stdin := slices.Concat(spec, []byte("[]"), framed.Bytes())
	stdout, _, st := outcome(t, runOpenStdin(t, root, spec, stdin))
	dir, err := filepath.EvalSymlinks(filepath.Join(fsRoot, "tmp", "build", "x"))
	require.NoError(t, err)
	assert.Equal(t, dir+"\n{\"source\":{}}\nread-all\n", stdout)
	assert.Equal(t, 0, st.ExitStatus)

	// A process that never reads its stdin ends as it would, with its
	// stdin never ended (a task: the web node sends it none).
	root, spec = newStep(t, `echo done`, func(sp *stepagent.Spec) { sp.StdinStream = true })
	stdout, _, st = outcome(t, runOpenStdin(t, root, spec, slices.Concat(spec, []byte("[]"))))
	assert.Equal(t, "done\n", stdout)
	assert.Equal(t, 0, st.ExitStatus)
}

// runOpenStdin runs `run --stdin` with stdin written to a pipe it never
// closes, as kwok's exec never passes a close on.
func runOpenStdin(t *testing.T, root string, spec, stdin []byte) []stepagent.Frame {
	t.Helper()
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer pw.Close()
	defer pr.Close()
	_, err = pw.Write(stdin)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, "run", "--stdin", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2")
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+root)
	cmd.Stdin = pr
	b, err := cmd.Output()
	require.NoError(t, err)
	return frames(t, b)
}

// An abort that comes before the run was prepared (a web node aborting a
// build while its container's volumes move in) sticks: the run, prepared
// and started after it, never starts its process.
func TestAbortBeforePrepareNeverStarts(t *testing.T) {
	root := t.TempDir()
	run := filepath.Join(root, stepagent.RunsDir, "task")
	_, code := agent(t, root, nil, "abort", "--run", "task")
	require.Equal(t, 0, code)
	_, spec := newStep(t, "touch started", func(sp *stepagent.Spec) { sp.StdinStream = true })
	out, code := agent(t, root, slices.Concat(spec, []byte("[]")), "run", "--run", "task", "--stdin",
		"--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2")
	require.Equal(t, 0, code, "%s", out)
	_, _, st := outcome(t, frames(t, out))
	assert.Equal(t, stepagent.ReasonAborted, st.Reason)
	assert.NoFileExists(t, filepath.Join(run, stepagent.BuildDir, "started"))
}

// A process with a TTY (a Concourse task, `fly intercept` from a
// terminal) runs on a terminal of the spec's size: its stdin, stdout and
// stderr, all in stdout frames with the terminal's line endings. A
// window size streamed ahead of stdin applies before the process reads
// that stdin, and the stdin's end is the terminal's end of input.
func TestATerminal(t *testing.T) {
	tty := func(sp *stepagent.Spec) { sp.StdinStream, sp.TTY = true, &pty.Size{Columns: 100, Rows: 30} }
	root, spec := newStep(t, `test -t 0 && test -t 1 && test -t 2 && echo tty; stty size; echo err >&2; exit 3`, tty)
	stdout, stderr, st := outcome(t, runOpenStdin(t, root, spec, slices.Concat(spec, []byte("[]"))))
	assert.Empty(t, stderr, "a terminal is the process's stderr too")
	assert.Equal(t, "tty\r\n30 100\r\nerr\r\n", stdout)
	assert.Equal(t, 3, st.ExitStatus)

	root, spec = newStep(t, `read line; stty size; echo "got $line"; cat; echo end`, tty)
	var framed bytes.Buffer
	for _, sz := range []pty.Size{{Columns: 100, Rows: 31}, {Columns: 120, Rows: 40}} { // the last one holds
		size, err := json.Marshal(sz)
		require.NoError(t, err)
		require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindWindow, size))
	}
	require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindStdin, []byte("hello\n")))
	require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindStdin, []byte("more\n")))
	require.NoError(t, stepagent.WriteFrame(&framed, stepagent.KindStdinEnd, nil))
	stdout, _, st = outcome(t, runOpenStdin(t, root, spec, slices.Concat(spec, []byte("[]"), framed.Bytes())))
	assert.Contains(t, stdout, "40 120\r\ngot hello\r\n")
	assert.True(t, strings.HasSuffix(stdout, "more\r\nend\r\n"), "cat ends at the stdin's end: %q", stdout)
	assert.Equal(t, 0, st.ExitStatus)
}

// TestTheStepsProcessIsTheOOMKillersFirstChoiceFromItsFirstInstruction:
// the score is the process's before it runs anything, not set a moment
// after it started (a fast step read the supervisor's, seen on the real
// node), and the supervisor, which lends it for the fork, gets its own
// back.
//
// The agent runs on one CPU, as in a pod limited to one: the process then
// runs before its supervisor gets the CPU back, as it did there.
func TestTheStepsProcessIsTheOOMKillersFirstChoiceFromItsFirstInstruction(t *testing.T) {
	// The agent is forked from this thread, with its CPU set; the thread
	// is never unlocked, so it ends with the test, set and all.
	runtime.LockOSThread()
	var one unix.CPUSet
	one.Set(0)
	require.NoError(t, unix.SchedSetaffinity(0, &one))
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	require.NoError(t, err)
	require.NotEqual(t, "1000\n", string(own), "the test needs a supervisor whose own score is not the step's")
	for i := range 10 {
		// The supervisor ($PPID) gives its score back once the process
		// started: waited for, up to 5 s.
		root, spec := newStep(t, `read score < /proc/self/oom_score_adj
for i in $(seq 100); do read parent < /proc/$PPID/oom_score_adj; [ "$parent" != 1000 ] && break; sleep 0.05; done
echo "$score $parent"`)
		stdout, _, st := outcome(t, run(t, root, spec))
		require.Equal(t, 0, st.ExitStatus, "run %d", i)
		require.Equal(t, "1000 "+string(own), stdout, "run %d: the step's score, then its supervisor's", i)
	}
}
