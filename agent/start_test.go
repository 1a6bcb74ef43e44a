package agent

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

// A restarted agent reads its steps back before it takes new ones: a
// step submitted meanwhile would be read back too, as a restarted
// agent's, and run twice. Here the read-back is held on a step record
// that is a pipe, and a step submitted then is refused: the agent is not
// running yet.
func TestNoStepIsTakenWhileStepsAreReadBack(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, stepsDir, "old")
	require.NoError(t, os.MkdirAll(old, 0o700))
	require.NoError(t, syscall.Mkfifo(filepath.Join(old, recordFile), 0o600))
	a := starting(t, dir)

	record, err := os.OpenFile(filepath.Join(old, recordFile), os.O_WRONLY, 0) // returns once the agent reads it
	require.NoError(t, err)
	t.Cleanup(func() { _ = record.Close() }) // lets the read-back end, should the test stop early
	_, _, err = a.Submit(mainCaller, task("hello", "exit 0"))
	require.ErrorIs(t, err, wire.ErrUnavailable)
	assert.ErrorContains(t, err, "steps are not accepted now: agent mac is starting or stopping")

	_, err = record.WriteString("not a record")
	require.NoError(t, err)
	require.NoError(t, record.Close())
	require.Eventually(t, func() bool {
		_, _, err = a.Submit(mainCaller, task("hello", "exit 0"))
		return err == nil
	}, 10*time.Second, time.Millisecond)
	evs := events(t, a, "hello")
	require.NotEmpty(t, evs)
	assert.Equal(t, wire.EventExited, evs[len(evs)-1].Type)
}
