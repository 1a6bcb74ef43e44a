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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

// runner carries one step from its placement to its end. Its fields are
// the work goroutine's, except started, which the pod watcher reads.
type runner struct {
	m       *Manager
	s       *step
	t       *targets.Target
	pod     string
	adopted *corev1.Pod // the pod a restarted gateway found, or nil
	offset  int64       // end of the last complete frame consumed
	inputs  []stepagent.Input
	run     string // the step's folder in its sandbox pod, if it runs in one

	// answer collects a resource step's stdout: its result, not its log.
	answer []byte

	mu        sync.Mutex
	startedAt time.Time // the process's start, once the log says so

	// closing, once the status came, lets the last exec end; run calls it
	// after the step's end is out.
	closing func()
}

// Why the watcher stopped the work.
var (
	errAborted  = errors.New("aborted")
	errTimedOut = errors.New("timed out")
)

// podFailed carries a pod failure as a cancellation cause.
type podFailed struct{ f failure }

func (e *podFailed) Error() string { return e.f.Reason + ": " + e.f.Message }

// run drives s to its end and records it. When ctx ends first (the
// gateway stops) it leaves the pod as it is, for the next start.
func (m *Manager) run(ctx context.Context, s *step, t *targets.Target, pod string, adopted *corev1.Pod) {
	defer close(s.done)
	r := &runner{m: m, s: s, t: t, pod: pod, adopted: adopted}
	if s.sandbox != nil {
		r.run = runName(s)
	}
	defer func() {
		if r.closing != nil {
			r.closing()
		}
	}()
	log := m.opts.Logger.With("target", t.Name(), "pod", pod, "team", s.key.team, "handle", s.key.handle)
	if adopted != nil {
		if e, ok := ended(adopted); ok {
			r.replay(ctx, e)
			return
		}
	} else if err := r.create(ctx); err != nil {
		if s.sandbox != nil {
			m.leaveSandbox(s.sandbox, false)
		}
		m.unreserve(t.Name(), pod)
		if ctx.Err() == nil {
			r.conclude(ctx, Event{Type: EventFailed, Phase: Errored, Reason: "CreatePodFailed", Message: err.Error()}, false)
		}
		return
	}
	r.emitPlaced()
	work, stop := context.WithCancelCause(ctx)
	running := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(work, stop, running) })
	status, err := r.work(work, running)
	cause := context.Cause(work)
	stop(nil)
	wg.Wait()
	if ctx.Err() != nil {
		return // stopping: the step goes on in its pod
	}
	e, keep := r.outcome(status, err, cause)
	if err != nil && cause == nil {
		log.Warn("step errored", "error", err.Error())
	}
	r.conclude(ctx, e, keep)
	if s.sandbox != nil {
		r.leave(ctx, err == nil && cause == nil)
	}
}

// leave ends a check's use of its sandbox, deleting its folder there once
// it ended by its script's exit; else the sandbox is broken and goes.
func (r *runner) leave(ctx context.Context, healthy bool) {
	if healthy {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.m.opts.Exec(fctx, r.t, r.pod, r.agent("forget"), nil, nopWriter{})
		cancel()
		if err != nil && ctx.Err() == nil {
			r.m.opts.Logger.Warn("check's folder in its sandbox not deleted", "target", r.t.Name(), "pod", r.pod, "error", err.Error())
		}
	}
	r.m.leaveSandbox(r.s.sandbox, healthy)
}

// outcome is the step's last event, and whether its pod stays (its
// process ran, so its outputs and log may matter).
func (r *runner) outcome(st stepagent.Status, err, cause error) (Event, bool) {
	var pf *podFailed
	switch {
	case errors.As(cause, &pf):
		return Event{Type: EventFailed, Phase: Errored, Reason: pf.f.Reason, Message: pf.f.Message}, r.hasStarted()
	case errors.Is(cause, errAborted):
		return Event{Type: EventFailed, Phase: Aborted, Reason: stepagent.ReasonAborted, Message: "aborted"}, true
	case errors.Is(err, errAborted):
		return Event{Type: EventFailed, Phase: Aborted, Reason: stepagent.ReasonAborted, Message: "aborted while waiting for its inputs"}, false
	case errors.Is(cause, errTimedOut):
		return Event{Type: EventFailed, Phase: Errored, Reason: stepagent.ReasonTimeout,
			Message: fmt.Sprintf("timed out after %s; the step agent did not stop the process, so its pod goes", r.s.req.Timeout)}, false
	case err != nil:
		return Event{Type: EventFailed, Phase: Errored, Reason: "StepFailed", Message: err.Error()}, r.hasStarted()
	}
	e := StatusEvent(st)
	if e.Phase == Succeeded && r.s.req.Resource != nil {
		return r.resourceOutcome(e)
	}
	return e, true
}

// StatusEvent is the last event of a step whose process ended as st
// says: exited (succeeded or failed by its exit status), or failed
// (aborted; errored by a timeout, a spawn failure or a lost supervisor).
func StatusEvent(st stepagent.Status) Event {
	code := st.ExitStatus
	e := Event{ExitStatus: &code, Reason: st.Reason, Message: st.Message}
	switch st.Reason {
	case stepagent.ReasonExited:
		e.Type, e.Phase, e.Reason = EventExited, Succeeded, st.Signal
		if code != 0 {
			e.Phase = Failed
		}
	case stepagent.ReasonAborted:
		e.Type, e.Phase = EventFailed, Aborted
	default: // timeout, spawn-failed, lost
		e.Type, e.Phase = EventFailed, Errored
	}
	return e
}

func (r *runner) hasStarted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.startedAt.IsZero()
}

// create makes the step's pod; a check in a sandbox waits for the
// sandbox's pod instead, made by the first check placed in it. A pod
// already there with the step's labels
// (a retry after a lost answer) is taken as made.
func (r *runner) create(ctx context.Context) error {
	if sb := r.s.sandbox; sb != nil {
		if r.s.makes {
			r.makeSandbox(ctx)
		}
		select {
		case <-sb.ready:
			return sb.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pod := buildPod(&r.s.req, r.s.caller, r.t, r.s.snapshot().PlacedAt, r.m.opts.Pod)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := r.t.Core.Pods(r.t.Namespace()).Create(cctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, gerr := r.t.Pod(cctx, pod.Name)
		if gerr != nil {
			return fmt.Errorf("create pod %s: %w", pod.Name, gerr)
		}
		if got.Labels[HandleLabel] != r.s.key.handle || got.Labels[targets.StepTypeLabel] != r.s.req.Type {
			return fmt.Errorf("create pod %s: a pod of that name exists and is not this step's", pod.Name)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	return nil
}

func (r *runner) emitPlaced() {
	v := r.s.snapshot()
	r.s.emit(Event{Type: EventPlaced, Time: v.PlacedAt, Target: v.Target, Pod: v.Pod})
}

// work waits for the pod to run, then runs the step through the agent.
func (r *runner) work(ctx context.Context, running <-chan struct{}) (stepagent.Status, error) {
	select {
	case <-ctx.Done():
		return stepagent.Status{}, ctx.Err()
	case <-running:
	}
	return r.follow(ctx)
}

// agent builds an agent command line.
func agent(args ...string) []string { return append([]string{agentCommand}, args...) }

// agent builds an agent command line for the step: in a sandbox, in the
// step's own folder.
func (r *runner) agent(args ...string) []string {
	if r.run != "" {
		args = append(args, "--run", r.run)
	}
	return agent(args...)
}

// follow starts the process (once: the agent never runs it twice) and
// reads its log to the end, attaching again from the last complete frame
// whenever the exec breaks: a dropped connection, an API server restart.
func (r *runner) follow(ctx context.Context) (stepagent.Status, error) {
	if r.s.sandbox != nil && r.adopted == nil {
		spec, err := r.spec()
		if err != nil {
			return stepagent.Status{}, err
		}
		if st, ok := r.viaSession(ctx, spec); ok {
			return st, nil
		}
		if ctx.Err() != nil {
			return stepagent.Status{}, ctx.Err()
		}
	}
	cmd, stdin, err := r.first(ctx)
	if err != nil {
		return stepagent.Status{}, err
	}
	backoff := firstRetry
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
		now := r.m.opts.Now()
		if r.offset > before || failingSince.IsZero() {
			failingSince = now
		}
		if now.Sub(failingSince) > lostAfter {
			return stepagent.Status{}, fmt.Errorf("lost contact with the step for %s: %w", lostAfter, err)
		}
		code, ok := stepagent.ExitCode(err)
		switch {
		case ok && code == stepagent.ExitNotPrepared:
			return stepagent.Status{}, errors.New("the step's spec never reached its pod (the gateway restarted before it did); submit the step again")
		case ok && code == stepagent.ExitNotStarted:
			if cmd, stdin, err = r.start(ctx); err != nil {
				return stepagent.Status{}, err
			}
		case r.offset > 0 || r.adopted != nil:
			r.m.opts.Metrics.reattached()
			r.m.opts.Logger.Warn("step output interrupted; attaching again", "target", r.t.Name(), "pod", r.pod,
				"offset", r.offset, "error", err.Error())
			cmd, stdin = r.agent("tail", "--offset", strconv.FormatInt(r.offset, 10)), nil
		default: // not started yet: the same start again (it never runs twice)
			r.m.opts.Logger.Debug("step start failed; retrying", "target", r.t.Name(), "pod", r.pod, "error", err.Error())
		}
		if err := sleep(ctx, jitter(backoff)); err != nil {
			return stepagent.Status{}, err
		}
		backoff = nextRetry(backoff, now.Sub(failingSince))
	}
}

// nextRetry keeps retrying at firstRetry for the first second of
// failures (a pod just Running that does not take execs yet costs the
// step's start no more than that), then backs off to 2 s.
func nextRetry(last, failingFor time.Duration) time.Duration {
	if failingFor < time.Second {
		return firstRetry
	}
	return min(2*last, 2*time.Second)
}

// first is the first agent command: for a new step its start, for an
// adopted one a tail of its log from the beginning.
func (r *runner) first(ctx context.Context) ([]string, []byte, error) {
	if r.adopted != nil {
		return r.agent("tail", "--offset", "0"), nil, nil
	}
	return r.start(ctx)
}

// start prepares the step in its pod, streams its inputs in and returns
// the run command. Without inputs one exec does it all.
func (r *runner) start(ctx context.Context) ([]string, []byte, error) {
	spec, err := r.spec()
	if err != nil {
		return nil, nil, err
	}
	// An adopted step's spec is in its pod already (the gateway that made
	// it is gone, and with it the step's environment and stdin).
	if r.adopted == nil && len(r.s.req.Inputs) == 0 {
		stdin := append(spec, "[]"...)
		// From the last byte had: a check whose session broke got some.
		return r.agent("run", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2",
			"--offset", strconv.FormatInt(r.offset, 10)), stdin, nil
	}
	if r.adopted == nil {
		if err := r.prepare(ctx, spec); err != nil {
			return nil, nil, err
		}
	}
	r.s.readyForUploads()
	inputs, err := r.streamInputs(ctx)
	if err != nil {
		return nil, nil, err
	}
	raw, _ := json.Marshal(inputs)
	return r.agent("run", "--inputs-bytes", strconv.Itoa(len(raw))), raw, nil
}

// spec is the step's spec as the agent takes it.
func (r *runner) spec() ([]byte, error) {
	sp := r.s.req.Spec()
	sp.KillGrace = stepagent.Duration(r.m.opts.KillGrace)
	return json.Marshal(sp)
}

// lostAfter bounds how long jetway keeps trying to reach a step's agent
// without getting a byte (its cluster is unreachable, say): then the step
// errors rather than running forever. An API server restart takes seconds.
const lostAfter = 5 * time.Minute

// firstRetry is the first pause before an exec is tried again: a pod
// just Running may not take execs for a moment (a kwok node's exec
// objects lag the pod by ~230 ms), and every pause there is the step's
// start latency.
const firstRetry = 20 * time.Millisecond

// prepare writes the spec into the pod, retrying broken execs.
func (r *runner) prepare(ctx context.Context, spec []byte) error {
	backoff, since := firstRetry, r.m.opts.Now()
	for {
		err := r.m.opts.Exec(ctx, r.t, r.pod, r.agent("prepare", "--spec-bytes", strconv.Itoa(len(spec))), spec, io.Discard)
		if err == nil {
			return nil
		}
		if code, ok := stepagent.ExitCode(err); ok && (code == stepagent.ExitSpecDiffers || code == stepagent.ExitUsage) {
			return fmt.Errorf("prepare the step in its pod: %w", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := sleep(ctx, jitter(backoff)); err != nil {
			return err
		}
		backoff = nextRetry(backoff, r.m.opts.Now().Sub(since))
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
		execErr = r.m.opts.Exec(ctx, r.t, r.pod, cmd, stdin, pw)
		pw.CloseWithError(cmp.Or(execErr, io.EOF))
	})
	st, done, err := r.consume(pr)
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
	if execErr != nil {
		return st, false, execErr
	}
	return st, false, fmt.Errorf("the agent's output ended before the step's status: %w", err)
}

// consume reads frames, turning each complete one into an event, until
// the status trailer.
func (r *runner) consume(rd io.Reader) (stepagent.Status, bool, error) {
	br := bufio.NewReaderSize(rd, 64<<10)
	for {
		f, err := stepagent.ReadFrame(br)
		if err != nil {
			return stepagent.Status{}, false, err
		}
		if f.Kind == stepagent.KindStatus {
			var st stepagent.Status
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return st, false, fmt.Errorf("the agent's status: %w", err)
			}
			return st, true, nil
		}
		r.handle(f)
		r.offset += f.Size()
	}
}

// handle turns one frame of the log into an event.
func (r *runner) handle(f stepagent.Frame) {
	if f.Kind == stepagent.KindStdout && r.s.req.Resource != nil {
		r.answer = append(r.answer, f.Payload[:min(len(f.Payload), resultLimit-len(r.answer))]...)
		return
	}
	e, ok := FrameEvent(f)
	if !ok {
		return
	}
	if e.Type == EventStarted {
		r.mu.Lock()
		r.startedAt = e.Time
		r.mu.Unlock()
		r.s.update(func(v *View) { v.Phase, v.StartedAt = Running, e.Time })
	}
	r.s.emit(e)
}

// FrameEvent is the event a frame of a step's log stands for: output, an
// input streamed in, the process's start. Other frames (and ones that do
// not decode) are none.
func FrameEvent(f stepagent.Frame) (Event, bool) {
	switch f.Kind {
	case stepagent.KindStdout:
		return Event{Type: EventStdout}.withData(f.Payload), true
	case stepagent.KindStderr:
		return Event{Type: EventStderr}.withData(f.Payload), true
	case stepagent.KindInput:
		var in stepagent.Input
		if json.Unmarshal(f.Payload, &in) == nil {
			return Event{Type: EventInput, Input: in.Name, Bytes: in.Bytes, SHA256: in.SHA256}, true
		}
	case stepagent.KindStarted:
		var st stepagent.Started
		if json.Unmarshal(f.Payload, &st) == nil {
			return Event{Type: EventStarted, Time: st.At}, true
		}
	}
	return Event{}, false
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
