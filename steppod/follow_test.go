package steppod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/jetway-ci/jetway/stepagent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logAgent stands in for a step agent with a log of frames: a tail from a
// cursor writes a position and the frames from there; breakAt ends the
// n-th exec (from 0) after that many frames without the status.
type logAgent struct {
	frames  []stepagent.Frame
	status  stepagent.Status
	breakAt map[int]int
	failAll error // every exec fails at once with it

	mu    sync.Mutex
	calls [][]string
}

func (a *logAgent) exec(_ context.Context, args []string, _ io.Reader, out io.Writer) error {
	a.mu.Lock()
	n := len(a.calls)
	a.calls = append(a.calls, args)
	a.mu.Unlock()
	if a.failAll != nil {
		return a.failAll
	}
	offset, events := int64(0), 0
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--offset":
			offset, _ = strconv.ParseInt(args[i+1], 10, 64)
		case "--events":
			events, _ = strconv.Atoi(args[i+1])
		}
	}
	pos, _ := json.Marshal(stepagent.Position{Offset: offset, Events: events})
	if err := stepagent.WriteFrame(out, stepagent.KindPosition, pos); err != nil {
		return err
	}
	var at int64
	written := 0
	for _, f := range a.frames {
		if at >= offset {
			if limit, ok := a.breakAt[n]; ok && written == limit {
				return errors.New("connection reset")
			}
			if err := stepagent.WriteFrameAt(out, f.Kind, f.Time, f.Payload); err != nil {
				return err
			}
			written++
		}
		at += f.Size()
	}
	st, _ := json.Marshal(a.status)
	return stepagent.WriteFrame(out, stepagent.KindStatus, st)
}

func stdout(s string) stepagent.Frame {
	return stepagent.Frame{Kind: stepagent.KindStdout, Time: time.Unix(1, 0).UTC(), Payload: []byte(s)}
}

// seen records what a Follower's Frame got.
type seen struct {
	payloads []string
	cursors  []Cursor
}

func (s *seen) frame(f stepagent.Frame, at Cursor) error {
	s.payloads = append(s.payloads, string(f.Payload))
	s.cursors = append(s.cursors, at)
	return nil
}

func tailer(run string) func(context.Context, Cursor, error) (Command, error) {
	return func(_ context.Context, at Cursor, _ error) (Command, error) { return Tail(run, at, ""), nil }
}

func TestAFollowerReadsEveryFrameOnceAcrossBreaks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &logAgent{frames: []stepagent.Frame{stdout("a"), stdout("b"), stdout("c"), stdout("d")},
			status: stepagent.Status{Reason: "exited", ExitStatus: 3}, breakAt: map[int]int{0: 1, 1: 2}}
		var s seen
		var breaks []error
		f := &Follower{Exec: a.exec, Frame: s.frame,
			Next: func(ctx context.Context, at Cursor, after error) (Command, error) {
				breaks = append(breaks, after)
				return Tail("r1", at, ""), nil
			}}
		st, err := f.Follow(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 3, st.ExitStatus)
		assert.Equal(t, []string{"a", "b", "c", "d"}, s.payloads, "each frame once, in order")
		size := stdout("a").Size()
		assert.Equal(t, []Cursor{{0, 0}, {size, 1}, {2 * size, 2}, {3 * size, 3}}, s.cursors, "each with the cursor before it")
		require.Len(t, breaks, 3)
		assert.Nil(t, breaks[0], "the first attach follows no break")
		assert.ErrorContains(t, breaks[1], "connection reset")
		assert.Equal(t, []string{"tail", "--offset", strconv.FormatInt(3*size, 10), "--events", "3", "--run", "r1"}, a.calls[2],
			"the third attach reads from the last frame read")
	})
}

func TestAFollowerGivesUpWhenNothingComesForLostAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &logAgent{failAll: errors.New("dial tcp: connection refused")}
		start := time.Now()
		_, err := (&Follower{Exec: a.exec, Frame: (&seen{}).frame, Next: tailer("")}).Follow(t.Context())
		require.ErrorIs(t, err, ErrLost)
		assert.ErrorContains(t, err, "connection refused", "it says what failed last")
		took := time.Since(start)
		assert.Greater(t, took, LostAfter)
		assert.Less(t, took, LostAfter+3*time.Second, "it gives up right after LostAfter")
		a.mu.Lock()
		defer a.mu.Unlock()
		assert.Greater(t, len(a.calls), 50, "it retried quickly at first")
		assert.Less(t, len(a.calls), 250, "then backed off")
	})
}

func TestAFollowerEndsAtOnceOnAnAnswerThatCannotChange(t *testing.T) {
	for _, code := range []int{stepagent.ExitUsage, stepagent.ExitSpecDiffers} {
		synctest.Test(t, func(t *testing.T) {
			a := &logAgent{failAll: utilexec.CodeExitError{Err: errors.New("exit"), Code: code}}
			_, err := (&Follower{Exec: a.exec, Frame: (&seen{}).frame, Next: tailer("")}).Follow(t.Context())
			got, ok := stepagent.ExitCode(err)
			require.True(t, ok, "the agent's answer: %v", err)
			assert.Equal(t, code, got)
			assert.Len(t, a.calls, 1, "never tried again")
		})
	}
}

func TestAFollowerEndsAtOnceWhenThePodIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gone := fmt.Errorf("container c1: its pod p1 was evicted: %w", ErrPodGone)
		a := &logAgent{failAll: gone}
		start := time.Now()
		_, err := (&Follower{Exec: a.exec, Frame: (&seen{}).frame, Next: tailer("")}).Follow(t.Context())
		require.ErrorIs(t, err, ErrPodGone)
		assert.ErrorContains(t, err, "was evicted", "it says why")
		assert.Len(t, a.calls, 1, "never tried again")
		assert.Zero(t, time.Since(start), "at once, not after LostAfter")
	})
}

func TestAFollowersNextHearsAProcessThatNeverStarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &logAgent{failAll: utilexec.CodeExitError{Err: errors.New("exit"), Code: stepagent.ExitNotStarted}}
		_, err := (&Follower{Exec: a.exec, Frame: (&seen{}).frame,
			Next: func(_ context.Context, at Cursor, after error) (Command, error) {
				if NotStarted(after) {
					return Command{}, ErrNoSuchRun
				}
				return Tail("", at, ""), nil
			}}).Follow(t.Context())
		assert.ErrorIs(t, err, ErrNoSuchRun)
	})
}

func TestAFramesErrorEndsTheFollowUnlessItAsksAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &logAgent{frames: []stepagent.Frame{stdout("a"), stdout("b")}}
		refused := errors.New("the client went away")
		_, err := (&Follower{Exec: a.exec, Next: tailer(""),
			Frame: func(stepagent.Frame, Cursor) error { return refused }}).Follow(t.Context())
		assert.Equal(t, refused, err, "Frame's error as it is")
		assert.Len(t, a.calls, 1)

		a = &logAgent{frames: []stepagent.Frame{stdout("a"), stdout("b")}}
		var s seen
		tries := 0
		_, err = (&Follower{Exec: a.exec, Next: tailer(""), Frame: func(f stepagent.Frame, at Cursor) error {
			if string(f.Payload) == "b" && tries == 0 {
				tries++
				return Again(errors.New("the record was not written"))
			}
			return s.frame(f, at)
		}}).Follow(t.Context())
		require.NoError(t, err)
		assert.Equal(t, []string{"a", "b"}, s.payloads, "the refused frame is read again")
	})
}

func TestALingeringFollowerReturnsAtTheStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var linger func()
		f := &Follower{Frame: (&seen{}).frame, Next: tailer(""), Linger: func(wait func()) { linger = wait },
			Exec: func(ctx context.Context, _ []string, _ io.Reader, out io.Writer) error {
				st, _ := json.Marshal(stepagent.Status{Reason: "exited"})
				_ = stepagent.WriteFrame(out, stepagent.KindStatus, st)
				select { // the exec ends a moment after the status
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}}
		st, err := f.Follow(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "exited", st.Reason)
		require.NotNil(t, linger, "the wait for the exec's end is the caller's")
		close(release)
		linger()
	})
}

func TestAFollowerWaitsForTheExecAfterTheStatusAtMostCloseGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		f := &Follower{Frame: (&seen{}).frame, Next: tailer(""),
			Exec: func(ctx context.Context, _ []string, _ io.Reader, out io.Writer) error {
				st, _ := json.Marshal(stepagent.Status{Reason: "exited"})
				_ = stepagent.WriteFrame(out, stepagent.KindStatus, st)
				<-ctx.Done() // an exec that never ends on its own
				return ctx.Err()
			}}
		_, err := f.Follow(t.Context())
		require.NoError(t, err)
		assert.Equal(t, closeGrace, time.Since(start))
	})
}

func TestTailNamesTheRunAndTheSkip(t *testing.T) {
	assert.Equal(t, []string{"tail", "--offset", "0", "--events", "0", "--skip", "all"}, Tail("", Cursor{}, "all").Args)
	assert.Equal(t, []string{"tail", "--offset", "26", "--events", "2", "--run", "p1"}, Tail("p1", Cursor{26, 2}, "").Args)
	assert.Nil(t, Tail("", Cursor{}, "").Stdin)
}

func TestAFollowerToTheEndTakesTheLastStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		twoStatuses := func(_ context.Context, _ []string, _ io.Reader, out io.Writer) error {
			for _, code := range []int{0, 7} { // the log's, then the supervisor's status file
				st, _ := json.Marshal(stepagent.Status{Reason: "exited", ExitStatus: code})
				if err := stepagent.WriteFrame(out, stepagent.KindStatus, st); err != nil {
					return err
				}
			}
			return nil
		}
		start := time.Now()
		st, err := (&Follower{Exec: twoStatuses, Frame: (&seen{}).frame, Next: tailer(""), ToEnd: true}).Follow(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 7, st.ExitStatus, "the last")

		st, err = (&Follower{Exec: twoStatuses, Frame: (&seen{}).frame, Next: tailer("")}).Follow(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 0, st.ExitStatus, "the first")
		assert.Zero(t, time.Since(start), "what follows the first status is read and dropped: the exec is not held up")
	})
}
