package stepagent

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/pty"
)

// Starts side by side spawn one supervisor: an extra one would wait on the
// lock and wake after the step ended, writing into a folder its owner may
// be deleting.
func TestStartsSideBySideSpawnOneSupervisor(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, Prepare(root, []byte(`{"handle":"h","path":"sh","args":["-c","echo hi"]}`)))
	var spawned atomic.Int32
	var supervisors sync.WaitGroup
	spawn := func(root string) error {
		spawned.Add(1)
		supervisors.Go(func() { assert.NoError(t, Supervise(root)) })
		return nil
	}
	var starts sync.WaitGroup
	for range 8 {
		starts.Go(func() { assert.NoError(t, start(root, []byte("[]"), spawn)) })
	}
	starts.Wait()
	supervisors.Wait()
	assert.Equal(t, int32(1), spawned.Load())
	st, ended, err := ReadStatus(root)
	require.NoError(t, err)
	require.True(t, ended)
	assert.Equal(t, ReasonExited, st.Reason)
	assert.Equal(t, 0, st.ExitStatus)
}

// TestNoTerminalFallsBackToPipes: a process that asks for a terminal
// where none can be opened (a container without /dev/pts) runs on pipes,
// its stdout and stderr apart, with a note for its stderr saying why.
func TestNoTerminalFallsBackToPipes(t *testing.T) {
	defer func(open func(pty.Size) (*os.File, *os.File, error)) { openTerminal = open }(openTerminal)
	openTerminal = func(pty.Size) (*os.File, *os.File, error) {
		return nil, nil, errors.New("open a pseudo-terminal: open /dev/ptmx: no such file or directory")
	}
	cmd := exec.Command("sh", "-c", "echo out; echo err >&2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pio, err := attachIO(cmd, Spec{TTY: &pty.Size{Columns: 80, Rows: 24}})
	require.NoError(t, err)
	assert.Equal(t, "jetway: the process runs without a terminal: open a pseudo-terminal: open /dev/ptmx: no such file or directory", pio.note)
	require.Len(t, pio.outputs, 2)
	require.NoError(t, cmd.Start())
	for _, f := range pio.child {
		f.Close()
	}
	for i, want := range []string{"out\n", "err\n"} {
		b, err := io.ReadAll(pio.outputs[i].f)
		require.NoError(t, err)
		assert.Equal(t, want, string(b))
		pio.outputs[i].f.Close()
	}
	require.NoError(t, cmd.Wait())
}

// A process whose absolute working dir its container lacks runs there,
// the dir made, as Garden makes it: fly intercept into a check container
// names /tmp/build/check, which no mount made.
func TestAMissingAbsoluteWorkingDirIsMade(t *testing.T) {
	dir := t.TempDir() + "/tmp/build/check"
	cmd, err := command(t.TempDir(), Spec{Handle: "h", Path: "sh", Args: []string{"-c", "pwd"}, Dir: dir})
	require.NoError(t, err)
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Equal(t, dir+"\n", string(out))
}
