package steppod

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/wire"
)

// FrameEvent is the event a frame of a step's log stands for: output, an
// input streamed in, the process's start, each at the time the agent
// wrote it. Other frames (and ones that do not decode) are none.
func FrameEvent(f stepagent.Frame) (wire.Event, bool) {
	e := wire.Event{Time: f.Time}
	switch f.Kind {
	case stepagent.KindStdout:
		e.Type = wire.EventStdout
		return withData(e, f.Payload), true
	case stepagent.KindStderr:
		e.Type = wire.EventStderr
		return withData(e, f.Payload), true
	case stepagent.KindInput:
		var in wire.InputDigest
		if json.Unmarshal(f.Payload, &in) == nil {
			e.Type, e.Input, e.Bytes, e.SHA256 = wire.EventInput, in.Name, in.Bytes, in.SHA256
			return e, true
		}
	case stepagent.KindStarted:
		var st stepagent.Started
		if json.Unmarshal(f.Payload, &st) == nil {
			e.Type, e.Time = wire.EventStarted, st.At
			return e, true
		}
	}
	return wire.Event{}, false
}

// logReader reads a step's log from a position: frames, the first a
// position, the last the status.
type logReader struct {
	br   *bufio.Reader
	base int // the head's length: the number of the log's first event
	next int // the number of the next event
}

// frame reads the next frame, numbering events.
func (l *logReader) frame() (stepagent.Frame, *wire.Event, error) {
	f, err := stepagent.ReadFrame(l.br)
	if err != nil {
		return f, nil, err
	}
	switch {
	case f.Kind == stepagent.KindPosition:
		var p stepagent.Position
		if err := json.Unmarshal(f.Payload, &p); err != nil {
			return f, nil, fmt.Errorf("the agent's position: %w", err)
		}
		l.next = l.base + p.Events
	case stepagent.IsEvent(f.Kind):
		if e, ok := FrameEvent(f); ok {
			e.N = l.next
			l.next++
			return f, &e, nil
		}
		l.next++ // counted, as the agent counts it
	}
	return f, nil, nil
}

// withData sets a chunk of output: Data when it is UTF-8, else
// DataBase64.
func withData(e wire.Event, b []byte) wire.Event {
	if utf8.Valid(b) {
		e.Data = string(b)
	} else {
		e.DataBase64 = b
	}
	return e
}

// StatusEvent is the last event of a step whose process ended as st
// says: exited (succeeded or failed by its exit status, or failed
// OOMKilled by its memory limit), or failed
// (aborted; errored by a timeout, a spawn failure or a lost supervisor).
func StatusEvent(st stepagent.Status) wire.Event {
	code := st.ExitStatus
	e := wire.Event{ExitStatus: &code, Reason: st.Reason, Message: st.Message, Time: st.FinishedAt}
	switch st.Reason {
	case stepagent.ReasonExited:
		e.Type, e.Phase, e.Reason = wire.EventExited, wire.Succeeded, st.Signal
		if code != 0 {
			e.Phase = wire.Failed
		}
	case stepagent.ReasonOOMKilled:
		// The step's own process outgrew its memory: it failed, as an
		// exit status fails it, named as Kubernetes names a container
		// killed so.
		e.Type, e.Phase, e.Reason = wire.EventExited, wire.Failed, "OOMKilled"
		e.Message = fmt.Sprintf("container %q: OOMKilled (%d): %s", StepContainer, code, st.Message)
	case stepagent.ReasonAborted:
		e.Type, e.Phase = wire.EventFailed, wire.Aborted
	default: // timeout, spawn-failed, lost
		e.Type, e.Phase = wire.EventFailed, wire.Errored
	}
	return e
}

// ErrLogGone: a step's log went with its pod (or its folder).
var ErrLogGone = errors.New("the step's log is gone")

// eventsPoll bounds how long a follower waits for a step to change before
// it looks again (a pod its log is read from going, say).
const eventsPoll = 2 * time.Second

// Journal is where a step's events are: its head and its end in its
// record, its log where its agent keeps it. A gateway's steps and an
// agent's are served from one.
type Journal interface {
	// State returns the step's head (its events before its log, numbered
	// from 0), whether its log may be read now (it began, or the step
	// ended), its end event, numbered, once it ended, and a channel closed
	// at the next change; ok is false once the step is forgotten.
	State() (head []wire.Event, logged bool, end *wire.Event, changed <-chan struct{}, ok bool)
	// ReadLog sends the step's log events from number n on (base is the
	// number of its first) until the log's status, and returns the number
	// of the next event; ErrLogGone when the log is gone. A failure of
	// send is returned as a *SendError.
	ReadLog(ctx context.Context, base, n int, send func([]wire.Event) error) (int, error)
}

// SendError is a follower's send failing: the follow ends with it.
type SendError struct{ Err error }

func (e *SendError) Error() string { return e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// FollowJournal sends a step's events from n on, as they come, until the
// step has ended and all were sent, ctx ends or send fails. Events of the
// log of a step whose log is gone are ErrGone.
func FollowJournal(ctx context.Context, j Journal, n int, send func([]wire.Event) error) error {
	retryDelay := FirstRetry
	for {
		head, logged, end, changed, ok := j.State()
		if !ok {
			return nil // forgotten meanwhile
		}
		if n < len(head) {
			if err := send(head[n:]); err != nil {
				return err
			}
			n = len(head)
		}
		switch {
		case end != nil && n > end.N:
			return nil
		case end != nil && n == end.N:
			return send([]wire.Event{*end})
		}
		if logged {
			next, err := j.ReadLog(ctx, len(head), n, send)
			n = next
			var se *SendError
			switch {
			case err == nil && end != nil:
				continue // the end follows
			case err == nil:
				retryDelay = FirstRetry // the log is all read: wait for the end to be recorded
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.As(err, &se):
				return se.Err
			case errors.Is(err, ErrLogGone) && end != nil:
				return fmt.Errorf("%w: events %d to %d went with the step's log", wire.ErrGone, n, end.N-1)
			default:
				if err := backoff.Sleep(ctx, backoff.Jitter(retryDelay, 0.2)); err != nil {
					return err
				}
				retryDelay = min(2*retryDelay, eventsPoll)
				continue
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-time.After(eventsPoll):
		}
	}
}

// ReadEvents sends the events of a log read from r (an agent's tail: a
// position first, the status last) from number want on (base is the
// number of the log's first event), in batches, until the status; it
// returns the number of the next event. handover, if set, is asked after
// each batch whether the caller takes it from the next event on (then
// ReadEvents returns).
func ReadEvents(r io.Reader, base, want int, send func([]wire.Event) error, handover func(next int) bool) (int, error) {
	l := &logReader{br: bufio.NewReaderSize(r, 64<<10), base: base, next: want}
	var batch []wire.Event
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := send(batch)
		batch = batch[:0]
		if err != nil {
			return &SendError{err}
		}
		return nil
	}
	for {
		f, e, err := l.frame()
		if err != nil {
			if ferr := flush(); ferr != nil {
				return l.next, ferr
			}
			return l.next, err
		}
		switch {
		case e != nil && e.N >= want:
			batch = append(batch, *e)
		case f.Kind == stepagent.KindStatus:
			// A log that ended with fewer events than asked for has none
			// from want on.
			return max(l.next, want), flush()
		}
		if l.br.Buffered() == 0 || len(batch) >= 64 {
			if err := flush(); err != nil {
				return l.next, err
			}
			if handover != nil && handover(l.next) {
				return l.next, nil
			}
		}
	}
}
