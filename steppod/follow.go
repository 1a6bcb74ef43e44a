package steppod

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/stepagent"
)

// LostAfter bounds how long a Follower keeps trying to reach a step's
// agent without getting a byte (its cluster is unreachable, say): then it
// gives up rather than trying forever. An API server restart takes
// seconds.
const LostAfter = 5 * time.Minute

// FirstRetry is the first pause before an exec is tried again: a pod
// just Running may not take execs for a moment (a kwok node's exec
// objects lag the pod by ~230 ms), and every pause there is the step's
// start latency.
const FirstRetry = 20 * time.Millisecond

// closeGrace bounds the wait, after a process's status, for its exec to
// end on its own (the agent exits right after the status).
const closeGrace = 5 * time.Second

// ErrLost: no byte came from the agent for LostAfter.
var ErrLost = errors.New("lost contact with the step")

// ErrPodGone: the pod a process ran in is gone for good (deleted,
// evicted, ended): an Exec error that wraps it ends a Follow at once,
// since no attach can reach the process again.
var ErrPodGone = errors.New("the pod is gone")

// ErrNoSuchRun: the pod has no process of that name.
var ErrNoSuchRun = errors.New("no such process in the pod")

// AgentExec runs one step agent command (its arguments, after the
// agent's path) with stdin, writing the command's stdout to out: a pod's
// exec, or the agent in process where the "pod" is a folder.
type AgentExec func(ctx context.Context, args []string, stdin io.Reader, out io.Writer) error

// Cursor is a place in a process's log: the offset of a frame and how
// many event frames come before it. The zero Cursor is the log's start.
type Cursor struct {
	Offset int64
	Events int
}

// Command is one agent command and its stdin.
type Command struct {
	Args  []string
	Stdin io.Reader
}

// Tail reads the log of the process in run folder run ("" the step's
// own) from at. skip, if not empty, skips that many event frames from
// there ("all": every one logged now).
func Tail(run string, at Cursor, skip string) Command {
	args := []string{"tail", "--offset", strconv.FormatInt(at.Offset, 10), "--events", strconv.Itoa(at.Events)}
	if skip != "" {
		args = append(args, "--skip", skip)
	}
	if run != "" {
		args = append(args, "--run", run)
	}
	return Command{Args: args}
}

// NotStarted reports whether err is the agent's answer that the process
// never started: its spec, or its start, never reached the pod.
func NotStarted(err error) bool {
	if err == nil {
		return false
	}
	code, ok := stepagent.ExitCode(err)
	return ok && (code == stepagent.ExitNotPrepared || code == stepagent.ExitNotStarted)
}

// Again marks a Frame error after which the Follower attaches again from
// the frame, rather than ending.
func Again(err error) error { return &againError{err} }

type againError struct{ err error }

func (e *againError) Error() string { return e.err.Error() }
func (e *againError) Unwrap() error { return e.err }

// A Follower follows one process of a step agent: it runs the command
// Next gives and reads the frames of the process's log from its output
// until the process's status, attaching again from the last complete
// frame whenever the exec breaks (a dropped connection, an API server
// restart, another gateway's restart), with a jittered backoff, until no
// byte has come for LostAfter. The agent runs a spec once, so a start
// sent again only reads.
type Follower struct {
	// Exec reaches the agent.
	Exec AgentExec
	// Next is the command of each attach: the first (after is nil), and
	// the one after each break (after is why the last one broke; see
	// NotStarted). at is where the log was read to.
	Next func(ctx context.Context, at Cursor, after error) (Command, error)
	// At is where reading is: Follow starts there, and moves it past each
	// frame read.
	At Cursor
	// Frame takes each frame of the log but its positions and status, in
	// order, with the cursor before it. Its error ends Follow, as it is,
	// unless it is Again's.
	Frame func(f stepagent.Frame, at Cursor) error
	// Position, if set, hears where a tail starts (the agent's position
	// frame).
	Position func(Cursor)
	// Linger, if set, takes the wait for the exec's end after the
	// status, for the caller to run off the step's critical path; by
	// default Follow waits (closeGrace at most).
	Linger func(wait func())
	// Now is the clock of LostAfter; default time.Now.
	Now func() time.Time
	// ToEnd reads each exec to its end and takes its last status: a
	// tail's last is the supervisor's status file, its last write to the
	// step's folder, a moment after the log's.
	ToEnd bool
}

// Follow reads the process to its status. A usage error, a spec that
// differs from the one the process runs or a pod that is gone
// (ErrPodGone) ends it at once.
func (f *Follower) Follow(ctx context.Context) (stepagent.Status, error) {
	now := f.Now
	if now == nil {
		now = time.Now
	}
	retryDelay := FirstRetry
	var failingSince time.Time
	var broke error
	for {
		cmd, err := f.Next(ctx, f.At, broke)
		if err != nil {
			return stepagent.Status{}, err
		}
		before := f.At.Offset
		st, done, err := f.attach(ctx, cmd)
		if done {
			return st, nil
		}
		var refused *frameError
		var again *againError
		if errors.As(err, &refused) && !errors.As(refused.err, &again) {
			return stepagent.Status{}, refused.err
		}
		if ctx.Err() != nil {
			return stepagent.Status{}, ctx.Err()
		}
		if errors.Is(err, ErrPodGone) {
			return stepagent.Status{}, err
		}
		if code, ok := stepagent.ExitCode(err); ok && (code == stepagent.ExitUsage || code == stepagent.ExitSpecDiffers) {
			return stepagent.Status{}, err
		}
		t := now()
		if f.At.Offset > before || failingSince.IsZero() {
			failingSince = t
		}
		if t.Sub(failingSince) > LostAfter {
			return stepagent.Status{}, fmt.Errorf("%w for %s: %w", ErrLost, LostAfter, err)
		}
		if err := backoff.Sleep(ctx, backoff.Jitter(retryDelay, 0.2)); err != nil {
			return stepagent.Status{}, err
		}
		retryDelay = NextRetry(retryDelay, t.Sub(failingSince))
		broke = err
	}
}

// NextRetry keeps retrying at FirstRetry for the first second of
// failures (a pod just Running that does not take execs yet costs the
// step's start no more than that), then backs off to 2 s.
func NextRetry(last, failingFor time.Duration) time.Duration {
	if failingFor < time.Second {
		return FirstRetry
	}
	return min(2*last, 2*time.Second)
}

// frameError is Frame's own error, in attach's answer.
type frameError struct{ err error }

func (e *frameError) Error() string { return e.err.Error() }
func (e *frameError) Unwrap() error { return e.err }

// attach runs one command and reads its frames until the status (done)
// or until the exec ends without it.
func (f *Follower) attach(ctx context.Context, cmd Command) (stepagent.Status, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	var execErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		execErr = f.Exec(ctx, cmd.Args, cmd.Stdin, pw)
		pw.CloseWithError(cmp.Or(execErr, io.EOF))
	})
	stop := func() {
		cancel()
		pr.CloseWithError(io.ErrClosedPipe)
		wg.Wait()
	}
	st, done, err := f.Read(pr)
	if !done {
		stop()
		var refused *frameError
		if errors.As(err, &refused) {
			return st, false, err
		}
		return st, false, cmp.Or(execErr, fmt.Errorf("the agent's output ended before the process's status: %w", err))
	}
	// The agent exits on its own after the status: the caller need not
	// wait for the stream to close (cancelling it now would only break it
	// under the agent). What comes after the status (a tail's last status,
	// from the supervisor's status file) is read and dropped.
	wg.Go(func() { _, _ = io.Copy(io.Discard, pr) })
	wait := func() {
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		t := time.NewTimer(closeGrace)
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
		}
		stop()
	}
	if f.Linger != nil {
		f.Linger(wait)
	} else {
		wait()
	}
	return st, true, nil
}

// Read takes frames from r, a stream of the process's log the caller
// opened itself (a check's session), to the status (done), moving At
// past each; Follow goes on from there.
func (f *Follower) Read(r io.Reader) (stepagent.Status, bool, error) {
	at := &f.At
	br := bufio.NewReaderSize(r, 64<<10)
	var last *stepagent.Status
	for {
		fr, err := stepagent.ReadFrame(br)
		if errors.Is(err, io.EOF) && last != nil {
			return *last, true, nil
		}
		if err != nil {
			return stepagent.Status{}, false, err
		}
		switch fr.Kind {
		case stepagent.KindStatus:
			var st stepagent.Status
			if err := json.Unmarshal(fr.Payload, &st); err != nil {
				return st, false, fmt.Errorf("the agent's status: %w", err)
			}
			if !f.ToEnd {
				return st, true, nil
			}
			last = &st
			continue
		case stepagent.KindPosition:
			var p stepagent.Position
			if err := json.Unmarshal(fr.Payload, &p); err != nil {
				return stepagent.Status{}, false, fmt.Errorf("the agent's position: %w", err)
			}
			*at = Cursor{Offset: p.Offset, Events: p.Events}
			if f.Position != nil {
				f.Position(*at)
			}
			continue
		}
		if err := f.Frame(fr, *at); err != nil {
			return stepagent.Status{}, false, &frameError{err}
		}
		at.Offset += fr.Size()
		if stepagent.IsEvent(fr.Kind) {
			at.Events++
		}
	}
}
