package steps

import (
	"bufio"
	"bytes"
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
	"github.com/jetway-ci/jetway/targets"
)

// A process in a pod's run folder is what a Concourse web node's Garden
// runs in its container (package concourse): the agent's own run, as a
// check's in a sandbox, driven without a step record. It is started once
// (the agent never runs a spec twice) and read from its log, so a
// dropped exec, an API server restart or another gateway reading it
// loses nothing.

// stdinEnd ends a streamed stdin.
var stdinEnd = func() []byte {
	var b bytes.Buffer
	_ = stepagent.WriteFrame(&b, stepagent.KindStdinEnd, nil)
	return b.Bytes()
}()

// ErrNoSuchRun: the pod has no process of that name.
var ErrNoSuchRun = errors.New("no such process in the pod")

// RunIn is one process in the run folder Run of Pod, reached through the
// step container's exec.
type RunIn struct {
	// Target is the pod's target as it is now: nil for an Exec that
	// reaches the step agent otherwise (an agent's machine, whose "pod"
	// is a folder); its error ends an attach, which is tried again.
	Target func() (*targets.Target, error)
	Pod    string
	Run    string
	// Exec runs an agent command in the pod; default ExecPod.
	Exec ExecStream
}

// Follow starts spec in the run folder if spec is not nil (once: the same
// spec again only reads it) and streams its log's frames to out from the
// start, until its status, attaching again from the last frame whenever
// the exec breaks. The process's stdin (a spec with StdinStream) is stdin
// as the first exec streams it, in stepagent.KindStdin frames up to a
// KindStdinEnd; an exec after a break ends it. With a nil
// spec it only reads what is there: ErrNoSuchRun if nothing is. out's
// error ends it.
func (p RunIn) Follow(ctx context.Context, spec []byte, stdin io.Reader, out func(stepagent.Frame) error) (stepagent.Status, error) {
	var offset int64
	var events int
	retryDelay := firstRetry
	var failingSince time.Time
	for {
		cmd := agent("tail", "--run", p.Run, "--offset", strconv.FormatInt(offset, 10), "--events", strconv.Itoa(events))
		var in io.Reader
		if spec != nil {
			cmd = agent("run", "--run", p.Run, "--stdin", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2",
				"--offset", strconv.FormatInt(offset, 10), "--events", strconv.Itoa(events))
			in = bytes.NewReader(append(append([]byte{}, spec...), "[]"...))
			if stdin != nil {
				in, stdin = io.MultiReader(in, stdin), nil
			} else {
				in = io.MultiReader(in, bytes.NewReader(stdinEnd))
			}
		}
		before := offset
		st, done, err := p.attach(ctx, cmd, in, &offset, &events, out)
		if done {
			return st, nil
		}
		var outErr *outError
		if errors.As(err, &outErr) {
			return st, outErr.err
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		code, coded := stepagent.ExitCode(err)
		switch {
		case coded && spec == nil && (code == stepagent.ExitNotPrepared || code == stepagent.ExitNotStarted):
			return st, fmt.Errorf("%s in pod %s: %w", p.Run, p.Pod, ErrNoSuchRun)
		case coded && (code == stepagent.ExitUsage || code == stepagent.ExitSpecDiffers):
			return st, fmt.Errorf("process %s in pod %s: %w", p.Run, p.Pod, err)
		}
		now := time.Now()
		if offset > before || failingSince.IsZero() {
			failingSince = now
		}
		if now.Sub(failingSince) > lostAfter {
			return st, fmt.Errorf("lost contact with process %s in pod %s for %s: %w", p.Run, p.Pod, lostAfter, err)
		}
		if err := backoff.Sleep(ctx, backoff.Jitter(retryDelay, 0.2)); err != nil {
			return st, err
		}
		retryDelay = nextRetry(retryDelay, now.Sub(failingSince))
	}
}

// Abort asks the process's supervisor to end it (TERM, then KILL after its
// kill grace); a process that has ended, or never started, is no error.
func (p RunIn) Abort(ctx context.Context) error {
	t, err := p.Target()
	if err != nil {
		return err
	}
	err = p.exec()(ctx, t, p.Pod, agent("abort", "--run", p.Run), nil, nopWriter{})
	if err == nil {
		return nil
	}
	if code, ok := stepagent.ExitCode(err); ok && (code == stepagent.ExitNotPrepared || code == stepagent.ExitNotStarted) {
		return nil
	}
	return err
}

func (p RunIn) exec() ExecStream {
	if p.Exec != nil {
		return p.Exec
	}
	return ExecPod
}

// outError is out's own error: it ends Follow as it is.
type outError struct{ err error }

func (e *outError) Error() string { return e.err.Error() }

// attach runs one agent command, passing its frames to out (and moving
// offset and events past each) until the status (done), or until the exec
// ends without it.
func (p RunIn) attach(ctx context.Context, cmd []string, stdin io.Reader, offset *int64, events *int,
	out func(stepagent.Frame) error) (stepagent.Status, bool, error) {
	t, err := p.Target()
	if err != nil {
		return stepagent.Status{}, false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	var execErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		execErr = p.exec()(ctx, t, p.Pod, cmd, stdin, pw)
		pw.CloseWithError(cmp.Or(execErr, io.EOF))
	})
	defer func() {
		cancel()
		pr.CloseWithError(io.ErrClosedPipe)
		wg.Wait()
	}()
	br := bufio.NewReaderSize(pr, 64<<10)
	for {
		f, err := stepagent.ReadFrame(br)
		if err != nil {
			wg.Wait()
			return stepagent.Status{}, false, cmp.Or(execErr, fmt.Errorf("the agent's output ended before the process's status: %w", err))
		}
		switch f.Kind {
		case stepagent.KindStatus:
			var st stepagent.Status
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return st, false, fmt.Errorf("the agent's status: %w", err)
			}
			return st, true, nil
		case stepagent.KindPosition:
			var pos stepagent.Position
			if err := json.Unmarshal(f.Payload, &pos); err != nil {
				return stepagent.Status{}, false, fmt.Errorf("the agent's position: %w", err)
			}
			*offset, *events = pos.Offset, pos.Events
			continue
		}
		if err := out(f); err != nil {
			return stepagent.Status{}, false, &outError{err}
		}
		*offset += f.Size()
		if stepagent.IsEvent(f.Kind) {
			*events++
		}
	}
}
