package agent

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// TestMain is also the step agent the agent starts as each step's
// supervisor: this test binary, run with "supervise".
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "supervise" {
		if err := stepagent.Supervise(stepagent.RootDir()); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

var mainCaller = streams.Caller{Team: "main"}

// started runs an agent over a fresh work dir until the test ends.
func started(t *testing.T, dir string) *Agent {
	t.Helper()
	a := starting(t, dir)
	require.Eventually(t, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.ctx != nil }, 5*time.Second, time.Millisecond)
	return a
}

// starting starts an agent over dir, to run until the test ends.
func starting(t *testing.T, dir string) *Agent {
	t.Helper()
	a, err := New(Options{Name: "mac", WorkDir: dir, Platform: "darwin", Tags: []string{"mac"}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return a
}

func task(handle, script string) wire.Request {
	return wire.Request{Handle: handle, Type: "task", Image: "ignored", Platform: "darwin", Tags: []string{"mac"},
		Run: wire.Run{Path: "sh", Args: []string{"-c", script}}}
}

// events follows a step to its end.
func events(t *testing.T, a *Agent, handle string) []wire.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []wire.Event
	require.NoError(t, a.Events(ctx, mainCaller, "", handle, 0, func(evs []wire.Event) error {
		out = append(out, evs...)
		return nil
	}))
	return out
}

func TestATaskRunsAsALocalProcess(t *testing.T) {
	a := started(t, t.TempDir())
	v, isNew, err := a.Submit(mainCaller, task("hello", "echo hi; echo oops >&2; mkdir -p out; echo x > out/f; exit 3"))
	require.NoError(t, err)
	assert.True(t, isNew)
	assert.Equal(t, "hello", v.Handle)
	evs := events(t, a, "hello")
	var typs []string
	for _, e := range evs {
		typs = append(typs, e.Type)
	}
	assert.ElementsMatch(t, []string{"placed", "started", "stdout", "stderr", "exited"}, typs, "stdout and stderr in the order read")
	assert.Equal(t, []string{"placed", "started"}, typs[:2])
	assert.Equal(t, "exited", typs[4])
	v, err = a.Get(mainCaller, "", "hello")
	require.NoError(t, err)
	assert.Equal(t, wire.Failed, v.Phase, "%s: %s", v.Reason, v.Message)
	require.NotNil(t, v.ExitStatus)
	assert.Equal(t, 3, *v.ExitStatus)
}
