package agent

import (
	"context"
	"encoding/json"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/wire"
)

// The supervisor logs a step's status a moment before it writes
// status.json, its last touch of the step's folder. The agent ends the
// step only after that: a step deleted, or an agent retired, as soon as
// the step ends must not pull the folder from under the supervisor.
//
// Here the test is the supervisor, inside that moment: its logged status
// says 0, status.json (written later) says 7, and the agent must report 7.
func TestAStepEndsOnlyOnceItsSupervisorIsDone(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, stepagent.Prepare(root, []byte(`{"handle":"h","path":"true"}`)))
	lock, err := os.OpenFile(stepagent.Path(root, stepagent.LockFile), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX), "the supervisor lives")
	started, _ := json.Marshal(stepagent.Started{PID: os.Getpid(), At: time.Now().UTC()})
	require.NoError(t, os.WriteFile(stepagent.Path(root, stepagent.StartedFile), started, 0o644))
	log, err := os.Create(stepagent.Path(root, stepagent.LogFile))
	require.NoError(t, err)
	require.NoError(t, stepagent.WriteFrame(log, stepagent.KindStarted, started))
	logged, _ := json.Marshal(stepagent.Status{Reason: stepagent.ReasonExited, ExitStatus: 0})
	require.NoError(t, stepagent.WriteFrame(log, stepagent.KindStatus, logged))
	require.NoError(t, log.Close())

	a, err := New(Options{Name: "mac", WorkDir: t.TempDir(), Platform: "darwin"})
	require.NoError(t, err)
	s := newStep(key{team: "main", handle: "h"}, "p", root, wire.Request{}, record{Handle: "h"}, tarsafe.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		st  stepagent.Status
		err error
	}
	followed := make(chan result, 1)
	go func() {
		st, err := a.follow(ctx, s, false)
		followed <- result{st, err}
	}()

	fi, err := os.Stat(stepagent.Path(root, stepagent.LogFile))
	require.NoError(t, err)
	final, _ := json.Marshal(stepagent.Status{Reason: stepagent.ReasonExited, ExitStatus: 7, LogSize: fi.Size(), FinishedAt: time.Now().UTC()})
	tmp := stepagent.Path(root, stepagent.StatusFile) + ".tmp" // written whole, as the supervisor does
	require.NoError(t, os.WriteFile(tmp, final, 0o644))
	require.NoError(t, os.Rename(tmp, stepagent.Path(root, stepagent.StatusFile)))
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_UN), "the supervisor exits")

	r := <-followed
	require.NoError(t, r.err)
	assert.Equal(t, 7, r.st.ExitStatus, "the status the supervisor wrote last")
}
