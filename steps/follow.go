package steps

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

// lostAfter bounds how long jetway keeps trying to reach a step's agent
// without getting a byte (its cluster is unreachable, say): then the step
// errors rather than running forever. An API server restart takes seconds.
const lostAfter = 5 * time.Minute

// firstRetry is the first pause before an exec is tried again: a pod
// just Running may not take execs for a moment (a kwok node's exec
// objects lag the pod by ~230 ms), and every pause there is the step's
// start latency.
const firstRetry = 20 * time.Millisecond

// nextRetry keeps retrying at firstRetry for the first second of
// failures (a pod just Running that does not take execs yet costs the
// step's start no more than that), then backs off to 2 s.
func nextRetry(last, failingFor time.Duration) time.Duration {
	if failingFor < time.Second {
		return firstRetry
	}
	return min(2*last, 2*time.Second)
}

// follow starts the process (once: the agent never runs it twice) and
// reads its log to the status, attaching again from the last complete
// frame whenever the exec breaks: a dropped connection, an API server
// restart. A step whose process started under an earlier owner is read
// from the log's end (a resource step's from its start: its answer is in
// it); one whose spec never reached its pod is started as a new one.
func (r *runner) follow(ctx context.Context, rec *Record) (stepagent.Status, error) {
	var cmd []string
	var stdin []byte
	switch {
	case !rec.Status.Started.IsZero() && !r.sum.Resource:
		cmd = r.agent("tail", "--offset", "0", "--events", "0", "--skip", "all")
	case !rec.Status.Started.IsZero():
		cmd = r.agent("tail", "--offset", "0", "--events", "0")
	case r.placed.Run != "":
		if st, ok := r.viaSession(ctx); ok {
			return st, nil
		}
		if ctx.Err() != nil {
			return stepagent.Status{}, ctx.Err()
		}
		fallthrough
	default:
		var err error
		if cmd, stdin, err = r.start(ctx, rec); err != nil {
			return stepagent.Status{}, err
		}
	}
	retryDelay := firstRetry
	var failingSince time.Time
	for {
		before := r.offset
		st, done, err := r.attach(ctx, cmd, stdin)
		if done {
			return st, nil
		}
		if ctx.Err() != nil {
			return stepagent.Status{}, ctx.Err()
		}
		now := r.k.opts.Now()
		if r.offset > before || failingSince.IsZero() {
			failingSince = now
		}
		if now.Sub(failingSince) > lostAfter {
			return stepagent.Status{}, fmt.Errorf("lost contact with the step for %s: %w", lostAfter, err)
		}
		code, coded := stepagent.ExitCode(err)
		switch {
		case coded && (code == stepagent.ExitNotPrepared || code == stepagent.ExitNotStarted):
			// Its spec, or its start, never reached the pod (its owner
			// went in between): start it, as a new one.
			rec, ok := r.record()
			if !ok {
				return stepagent.Status{}, errRecordGone
			}
			if cmd, stdin, err = r.start(ctx, rec); err != nil {
				return stepagent.Status{}, err
			}
		case r.offset > 0 || len(stdin) == 0:
			r.k.opts.Metrics.reattached()
			r.log.Warn("step output interrupted; attaching again", "offset", r.offset, "error", err.Error())
			cmd, stdin = r.agent("tail", "--offset", strconv.FormatInt(r.offset, 10), "--events", strconv.Itoa(r.logEvents)), nil
		default: // not started yet: the same start again (it never runs twice)
			r.log.Debug("step start failed; retrying", "error", err.Error())
		}
		if err := backoff.Sleep(ctx, backoff.Jitter(retryDelay, 0.2)); err != nil {
			return stepagent.Status{}, err
		}
		retryDelay = nextRetry(retryDelay, now.Sub(failingSince))
	}
}

// attach runs one agent command and consumes its frames until the status
// trailer (done) or until the exec ends without it.
func (r *runner) attach(ctx context.Context, cmd []string, stdin []byte) (stepagent.Status, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	var execErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		execErr = r.exec(ctx, cmd, stdin, pw)
		pw.CloseWithError(cmp.Or(execErr, io.EOF))
	})
	st, done, err := r.consume(ctx, pr)
	if done {
		// The agent exits on its own after the trailer: the step's end
		// need not wait for the stream to close (cancelling it now would
		// only break it under the agent). run lets it close after.
		r.closing = func() {
			finished := make(chan struct{})
			go func() { wg.Wait(); close(finished) }()
			t := time.NewTimer(5 * time.Second)
			defer t.Stop()
			select {
			case <-finished:
			case <-t.C:
			}
			cancel()
			pr.CloseWithError(io.ErrClosedPipe)
			<-finished
		}
		return st, true, nil
	}
	cancel()
	pr.CloseWithError(io.ErrClosedPipe)
	wg.Wait()
	if errors.Is(err, errNotOwner) {
		return st, false, err
	}
	if execErr != nil {
		return st, false, execErr
	}
	return st, false, fmt.Errorf("the agent's output ended before the step's status: %w", err)
}

// consume reads frames, turning each event frame into the step's next
// event, until the status trailer.
func (r *runner) consume(ctx context.Context, rd io.Reader) (stepagent.Status, bool, error) {
	br := bufio.NewReaderSize(rd, 64<<10)
	for {
		f, err := stepagent.ReadFrame(br)
		if err != nil {
			return stepagent.Status{}, false, err
		}
		switch f.Kind {
		case stepagent.KindStatus:
			var st stepagent.Status
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return st, false, fmt.Errorf("the agent's status: %w", err)
			}
			r.tail.end(false)
			return st, true, nil
		case stepagent.KindPosition:
			var p stepagent.Position
			if err := json.Unmarshal(f.Payload, &p); err != nil {
				return stepagent.Status{}, false, fmt.Errorf("the agent's position: %w", err)
			}
			r.offset, r.logEvents = p.Offset, p.Events
			r.tail.position(r.base + p.Events)
			continue
		case stepagent.KindAnswer:
			r.answer = append(r.answer, f.Payload[:min(len(f.Payload), resultLimit-len(r.answer))]...)
		}
		if err := r.handle(ctx, f); err != nil {
			return stepagent.Status{}, false, err
		}
		r.offset += f.Size()
	}
}

// handle turns one frame of the log into the step's next event. The
// process's start is recorded before its event goes out.
func (r *runner) handle(ctx context.Context, f stepagent.Frame) error {
	if !stepagent.IsEvent(f.Kind) {
		return nil
	}
	e, ok := FrameEvent(f)
	if ok && e.Type == EventStarted && !r.hasStarted() {
		if _, err := r.update(ctx, func(st *Status) error {
			if !st.Started.IsZero() {
				return errUnchanged
			}
			st.Started = e.Time
			return nil
		}); err != nil {
			return err
		}
		r.mu.Lock()
		r.startedAt = e.Time
		r.mu.Unlock()
	}
	e.N = r.base + r.logEvents
	r.logEvents++
	if ok {
		r.tail.add(e)
	}
	return nil
}
