package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// Remote opens the bytes of a volume another mesh member owns, asked as
// caller: for an input whose pod is on a cluster.
type Remote func(ctx context.Context, caller streams.Caller, from wire.Endpoint, encoding string) (io.ReadCloser, error)

// uploadTimeout is how long a step waits for its uploaded inputs once its
// folder takes them, as on a cluster.
const uploadTimeout = 10 * time.Minute

// errAborted stops a step's inputs when it is aborted before its start.
var errAborted = errors.New("aborted")

// run drives s to its end: a new step from its folder's preparation, an
// adopted one (a restarted agent's) from what its folder holds. When ctx
// ends first (the agent stops) the step's process goes on.
func (a *Agent) run(ctx context.Context, s *step, adopted bool) {
	defer close(s.done)
	defer a.settle()
	s.mu.Lock()
	s.view.Target, s.view.Pod = a.opts.Name, s.pod
	end := s.rec.End
	s.mu.Unlock()
	if _, err := s.serveVolumes(); err != nil {
		a.conclude(s, failed("VolumesFailed", err.Error()))
		return
	}
	if end != nil {
		s.restore(*end, steppod.OutputVolumes(s.rec.Outputs, a.opts.Name, s.pod))
		return
	}
	if !adopted {
		if err := a.start(ctx, s); err != nil {
			if ctx.Err() == nil {
				a.conclude(s, startFailure(err))
			}
			return
		}
	}
	st, err := a.follow(ctx, s, adopted)
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, stepagent.ErrNotStarted), errors.Is(err, stepagent.ErrNotPrepared):
		a.conclude(s, failed("AgentRestarted", "the agent restarted before the step's process started; submit the step again"))
	case err != nil:
		a.conclude(s, failed("StepFailed", err.Error()))
	default:
		a.conclude(s, steppod.StatusEvent(st))
	}
}

func failed(reason, msg string) wire.Event {
	return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, Reason: reason, Message: msg}
}

func startFailure(err error) wire.Event {
	if errors.Is(err, errAborted) {
		return wire.Event{Type: wire.EventFailed, Phase: wire.Aborted, Reason: stepagent.ReasonAborted,
			Message: "aborted before its process started"}
	}
	return failed("StepFailed", err.Error())
}

// conclude ends the step with e: its outputs are kept in its folder.
func (a *Agent) conclude(s *step, e wire.Event) {
	var outs []wire.Volume
	if e.Phase == wire.Succeeded || e.Phase == wire.Failed || s.snapshot().Phase == wire.Running {
		outs = steppod.OutputVolumes(s.rec.Outputs, a.opts.Name, s.pod)
	}
	s.finish(e, a.opts.Now().UTC(), outs)
}

// settle wakes the target's readers after a step's end, and ends a land
// or retire waiting for it.
func (a *Agent) settle() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notifyLocked()
	if err := a.settleLocked(); err != nil {
		a.opts.Logger.Error("agent lifecycle", "target", a.opts.Name, "error", err.Error())
	}
}

// start prepares the step's folder, brings its inputs in and starts its
// supervisor: a process of its own, which outlives this agent.
func (a *Agent) start(ctx context.Context, s *step) error {
	sp := steppod.AgentSpec(&s.req)
	sp.KillGrace = stepagent.Duration(a.opts.KillGrace)
	raw, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	if err := stepagent.Prepare(s.root, raw); err != nil {
		return fmt.Errorf("prepare the step's folder: %w", err)
	}
	close(s.ready)
	ictx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.abort:
			cancel(errAborted)
		case <-ictx.Done():
		}
	}()
	log := a.opts.Logger.With("target", a.opts.Name, "pod", s.pod, "team", s.key.team, "handle", s.key.handle)
	log.Debug("step prepared; bringing its inputs in", "inputs", len(s.rec.Inputs))
	inputs, err := a.inputs(ictx, s)
	if err != nil {
		if cause := context.Cause(ictx); errors.Is(cause, errAborted) {
			return cause
		}
		return err
	}
	log.Debug("step inputs in", "inputs", inputs)
	rawInputs, _ := json.Marshal(inputs)
	if err := stepagent.Start(s.root, rawInputs); err != nil {
		return fmt.Errorf("start the step's supervisor: %w", err)
	}
	return nil
}

// inputs brings every input into its volume, in order.
func (a *Agent) inputs(ctx context.Context, s *step) ([]wire.InputDigest, error) {
	var out []wire.InputDigest
	for _, in := range s.rec.Inputs {
		got, err := a.input(ctx, s, in)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", in.Name, err)
		}
		got.Name = in.Name
		out = append(out, got)
	}
	return out, nil
}

func (a *Agent) input(ctx context.Context, s *step, in wire.Input) (wire.InputDigest, error) {
	if in.From.Upload {
		return s.awaitUpload(ctx, in.Name)
	}
	from := wire.Endpoint{Target: in.From.Target, Pod: in.From.Pod, Handle: in.From.Handle, Path: in.From.Path}
	var src io.ReadCloser
	var err error
	switch {
	case from.Target == a.opts.Name:
		var other *step
		if other, err = a.byPod(s.rec.Caller, from.Target, from.Pod); err == nil {
			src, err = other.openVolume(ctx, from.Handle, from.Path, "")
		}
	case a.opts.Remote == nil:
		err = fmt.Errorf("%w: target %s is not on this agent, which has no mesh", streams.ErrNotFound, from.Target)
	default:
		src, err = a.opts.Remote(ctx, s.rec.Caller, from, "")
	}
	if err != nil {
		return wire.InputDigest{}, err
	}
	defer src.Close()
	return s.putVolume(ctx, steppod.InputVolume(in.Name), "", src)
}

// awaitUpload waits for the caller's upload of an input.
func (s *step) awaitUpload(ctx context.Context, name string) (wire.InputDigest, error) {
	u := s.uploads[name]
	t := time.NewTimer(uploadTimeout)
	defer t.Stop()
	select {
	case <-u.done:
		return u.result, nil
	case <-t.C:
		return wire.InputDigest{}, fmt.Errorf("not uploaded within %s of the step's folder being ready", uploadTimeout)
	case <-ctx.Done():
		return wire.InputDigest{}, context.Cause(ctx)
	}
}

// follow reads the step's log to its status, counting its events (a new
// step's from its start; a step read back after a restart from where its
// log is now: its events are read from the log by position, never into
// memory); an abort on the way asks the supervisor to kill the process,
// whose status then ends the log.
func (a *Agent) follow(ctx context.Context, s *step, adopted bool) (stepagent.Status, error) {
	skip := ""
	if adopted {
		skip = "all"
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the Wait: the abort's watch ends with ctx
	wg.Go(func() {
		select {
		case <-s.abort:
			if err := stepagent.Abort(s.root); err != nil {
				a.opts.Logger.Warn("abort failed", "target", a.opts.Name, "pod", s.pod, "error", err.Error())
			}
		case <-ctx.Done():
		}
	})
	f := &steppod.Follower{
		Exec:  tailInProcess(s.root),
		ToEnd: true,
		Next: func(_ context.Context, at steppod.Cursor, after error) (steppod.Command, error) {
			if after != nil { // a folder's log does not break: what failed is the step's
				return steppod.Command{}, after
			}
			return steppod.Tail("", at, skip), nil
		},
		Position: func(at steppod.Cursor) { s.logged(at.Events, nil) },
		Frame: func(f stepagent.Frame, at steppod.Cursor) error {
			if !stepagent.IsEvent(f.Kind) {
				return nil
			}
			if e, ok := steppod.FrameEvent(f); ok {
				s.logged(at.Events+1, &e)
			} else {
				s.logged(at.Events+1, nil)
			}
			return nil
		},
	}
	// The tail ends with the supervisor's status file, its last write:
	// Follow returns once it has, so nothing touches the step's folder
	// after.
	return f.Follow(ctx)
}

// tailInProcess is the step agent's tail (steppod.Tail's command), run in
// this process on the step's folder: an agent's step has no pod to exec
// into.
func tailInProcess(root string) steppod.AgentExec {
	return func(ctx context.Context, args []string, _ io.Reader, out io.Writer) error {
		fs := flag.NewFlagSet("tail", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var o stepagent.TailOptions
		fs.Int64Var(&o.Offset, "offset", 0, "")
		fs.IntVar(&o.Events, "events", 0, "")
		skip := fs.String("skip", "0", "")
		if len(args) == 0 || args[0] != "tail" || fs.Parse(args[1:]) != nil || fs.NArg() > 0 {
			return fmt.Errorf("the agent runs only a tail of its own step in process, not %q", args)
		}
		if *skip == "all" {
			o.Skip = -1
		} else if n, err := strconv.Atoi(*skip); err == nil {
			o.Skip = n
		} else {
			return fmt.Errorf("tail --skip %q: %w", *skip, err)
		}
		return stepagent.TailFrom(ctx, root, o, out)
	}
}

// adopt reads back the steps of the work dir: a restarted agent's.
func (a *Agent) adopt(ctx context.Context) {
	dir := filepath.Join(a.opts.WorkDir, stepsDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		a.opts.Logger.Error("agent: steps not read back", "error", err.Error())
		return
	}
	for _, e := range entries {
		root := filepath.Join(dir, e.Name())
		raw, err := os.ReadFile(filepath.Join(root, recordFile))
		var rec record
		if err == nil {
			err = json.Unmarshal(raw, &rec)
		}
		if err != nil {
			a.opts.Logger.Warn("agent: step folder without a record; left alone", "folder", root, "error", err.Error())
			continue
		}
		req := wire.Request{Handle: rec.Handle, Team: rec.Team, Type: rec.Type, Inputs: rec.Inputs, Outputs: rec.Outputs}
		s := newStep(key{rec.Team, rec.Handle}, e.Name(), root, req, rec, a.opts.Extract)
		a.mu.Lock()
		a.steps[s.key] = s
		a.mu.Unlock()
		a.opts.Logger.Info("step read back", "target", a.opts.Name, "pod", s.pod, "team", rec.Team, "handle", rec.Handle)
		a.wg.Go(func() { a.run(ctx, s, true) })
	}
	a.notify()
}
