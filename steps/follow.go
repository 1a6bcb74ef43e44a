package steps

import (
	"bytes"
	"context"
	"io"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// follow starts the process (once: the agent never runs it twice) and
// reads its log to the status (steppod.Follower), attaching again from
// the last complete frame whenever the exec breaks: a dropped
// connection, an API server restart. A step whose process started under
// an earlier owner is read from the log's end (a resource step's from its
// start: its answer is in it); one whose spec never reached its pod is
// started as a new one.
func (r *runner) follow(ctx context.Context, rec *Record) (stepagent.Status, error) {
	var first steppod.Command
	var stdin []byte // the start's: sent again while nothing was read
	switch {
	case !rec.Status.Started.IsZero() && !r.sum.Resource:
		first = steppod.Tail(r.placed.Run, steppod.Cursor{}, "all")
	case !rec.Status.Started.IsZero():
		first = steppod.Tail(r.placed.Run, steppod.Cursor{}, "")
	default:
		if r.placed.Run != "" {
			if st, ok := r.viaSession(ctx); ok {
				return st, nil
			}
			if ctx.Err() != nil {
				return stepagent.Status{}, ctx.Err()
			}
		}
		args, in, err := r.start(ctx, rec)
		if err != nil {
			return stepagent.Status{}, err
		}
		first, stdin = steppod.Command{Args: args}, in
	}
	f := r.follower(ctx)
	f.Next = func(ctx context.Context, at steppod.Cursor, after error) (steppod.Command, error) {
		switch {
		case after == nil:
		case steppod.NotStarted(after):
			// Its spec, or its start, never reached the pod (its owner
			// went in between): start it, as a new one.
			rec, ok := r.record()
			if !ok {
				return steppod.Command{}, errRecordGone
			}
			args, in, err := r.start(ctx, rec)
			if err != nil {
				return steppod.Command{}, err
			}
			first, stdin = steppod.Command{Args: args}, in
		case at.Offset > 0 || len(stdin) == 0:
			r.k.opts.Metrics.reattached()
			r.log.Warn("step output interrupted; attaching again", "offset", at.Offset, "error", after.Error())
			first, stdin = steppod.Tail(r.placed.Run, at, ""), nil
		default: // not started yet: the same start again (it never runs twice)
			r.log.Debug("step start failed; retrying", "error", after.Error())
		}
		cmd := steppod.Command{Args: first.Args}
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		return cmd, nil
	}
	f.Linger = func(wait func()) { r.closing = wait }
	st, err := f.Follow(ctx)
	if err == nil {
		r.tail.end(false)
	}
	return st, err
}

// follower reads the step's log into its events, from where r has read
// it to.
func (r *runner) follower(ctx context.Context) *steppod.Follower {
	return &steppod.Follower{
		At:  steppod.Cursor{Offset: r.offset, Events: r.logEvents},
		Now: r.k.opts.Now,
		Exec: func(ctx context.Context, args []string, stdin io.Reader, out io.Writer) error {
			var in []byte
			if stdin != nil {
				var err error
				if in, err = io.ReadAll(stdin); err != nil { // the spec and the inputs' list: bounded by the request's limits
					return err
				}
			}
			return r.exec(ctx, agent(args...), in, out)
		},
		Position: func(at steppod.Cursor) {
			r.offset, r.logEvents = at.Offset, at.Events
			r.tail.position(r.base + at.Events)
		},
		Frame: func(f stepagent.Frame, at steppod.Cursor) error {
			r.offset, r.logEvents = at.Offset, at.Events
			if f.Kind == stepagent.KindAnswer {
				r.answer = append(r.answer, f.Payload[:min(len(f.Payload), resultLimit-len(r.answer))]...)
			}
			if err := r.handle(ctx, f); err != nil {
				return steppod.Again(err) // read again from this frame
			}
			r.offset += f.Size()
			return nil
		},
	}
}

// handle turns one frame of the log into the step's next event. The
// process's start is recorded before its event goes out.
func (r *runner) handle(ctx context.Context, f stepagent.Frame) error {
	if !stepagent.IsEvent(f.Kind) {
		return nil
	}
	e, ok := steppod.FrameEvent(f)
	if ok && e.Type == wire.EventStarted && !r.hasStarted() {
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
