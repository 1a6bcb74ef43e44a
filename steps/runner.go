package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// runner carries one step this gateway owns from its placement to its
// end. It keeps nothing that matters only in memory: each move is in the
// step's record or its pod before the next, so a runner stopped at any
// line (this gateway stopping or dying, or losing the step) is continued
// where it was by the step's next owner.
type runner struct {
	k      *keeper
	name   string // the step's record
	sum    Summary
	placed Placed
	log    *slog.Logger
	tail   *tail
	cancel context.CancelCauseFunc
	done   chan struct{}

	// The work goroutine's: the number of the log's first event (the
	// head's length), where in the log it is (the end of the last complete
	// frame, and the log's events before it), and a resource step's
	// answer.
	base      int
	offset    int64
	logEvents int
	answer    []byte
	result    []byte // the answer, once it checked out

	mu        sync.Mutex
	startedAt time.Time     // the process's start, once the log or the record says so
	seen      bool          // the pod was seen by this runner
	known     types.UID     // the UID of the step's pod this runner made or took (ensurePod)
	knownSet  chan struct{} // closed when known is set (knownChanged)

	// closing, once the status came, lets the last exec end; run calls it
	// after the step's end is recorded.
	closing func()

	// specMu guards specRaw, the step's spec for its agent once read
	// (spec): it never changes.
	specMu  sync.Mutex
	specRaw []byte
}

// Why a runner was stopped.
var (
	errRunnerDone = errors.New("the runner returned")
	errStopping   = errors.New("the gateway stops")
	errNotDriving = errors.New("this gateway does not drive the step now: another owns it, or this one cannot renew its lease")
)

// Why the watcher stopped the work.
var (
	errAborted  = errors.New("aborted")
	errTimedOut = errors.New("timed out")
)

// podFailed carries a pod failure as a cancellation cause.
type podFailed struct{ f steppod.Failure }

func (e *podFailed) Error() string { return e.f.Reason + ": " + e.f.Message }

// record is the step's record as last seen.
func (r *runner) record() (*Record, bool) { return r.k.opts.Records.Get(r.name) }

// update changes the step's record, as its owner: errNotOwner once
// another gateway took it over.
func (r *runner) update(ctx context.Context, change func(st *Status) error) (*Record, error) {
	return r.k.opts.Records.Update(ctx, r.name, func(rec *Record) error {
		if rec.Status.Owner != r.k.me {
			return errNotOwner
		}
		return change(&rec.Status)
	})
}

// target resolves the step's target now: a rotated kubeconfig makes a new
// Target, and the runner follows it.
func (r *runner) target() (*targets.Target, error) { return r.k.opts.Registry.Target(r.placed.Target) }

// run drives the step to its end and records it. When ctx ends first
// (the gateway stops, or the step is another's now) it leaves the pod as
// it is, for the step's next owner.
func (r *runner) run(ctx context.Context) {
	work, stop := context.WithCancelCause(ctx)
	running := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(work, stop, running) })
	status, err := r.work(work, running)
	cause := context.Cause(work)
	stop(nil)
	wg.Wait()
	if ctx.Err() != nil || errors.Is(err, errNotOwner) || errors.Is(cause, errNotOwner) {
		return // the step goes on; its owner, this gateway again or another, continues it
	}
	e, keep := r.outcome(status, err, cause)
	if err != nil && cause == nil {
		r.log.Warn("step errored", "error", err.Error())
	}
	r.conclude(ctx, e, keep)
}

// work brings the step to its process's end: its pod, its spec, its
// inputs, its start, its log to the status.
func (r *runner) work(ctx context.Context, running <-chan struct{}) (stepagent.Status, error) {
	rec, ok := r.record()
	if !ok {
		return stepagent.Status{}, errRecordGone
	}
	if r.placed.Run == "" {
		if err := r.ensurePod(ctx, rec); err != nil {
			return stepagent.Status{}, err
		}
	}
	if rec.Status.Started.IsZero() {
		// The spec is read while the pod starts, not after: the start's
		// exec carries it.
		var read sync.WaitGroup
		defer read.Wait()
		read.Go(func() { _, _ = r.spec(ctx) })
	}
	select {
	case <-ctx.Done():
		return stepagent.Status{}, ctx.Err()
	case <-running:
	}
	var err error
	if rec, ok = r.record(); !ok {
		return stepagent.Status{}, errRecordGone
	}
	if rec.Status.Scheduled == nil {
		// Running, so scheduled: the head is final once that is recorded,
		// and the log has nothing before it.
		if rec, err = r.recordScheduled(ctx); err != nil {
			return stepagent.Status{}, err
		}
	}
	head, _ := rec.Head()
	r.base = len(head)
	r.tail = r.k.events.open(r.name, r.base)
	return r.follow(ctx, rec)
}

// ensurePod makes the step's pod and binds it (ownership.Bind), or takes
// it as this gateway's: a pod of the step already there, made and bound
// by this step's earlier owner or by a retry after a lost answer, gets
// this gateway as its owner. A pod of its name that is sealed but not
// bound was made by an owner that stopped before it bound it, or planted
// with a copied seal: never used either way, it is deleted and the step's
// made again, a few times at most.
func (r *runner) ensurePod(ctx context.Context, rec *Record) error {
	t, err := r.target()
	if err != nil {
		return err
	}
	if err := awaitKey(ctx, r.k.opts.Pod.Key); err != nil {
		return err
	}
	if rec.Status.Scheduled != nil {
		return r.own(ctx, t)
	}
	// Placement kept the step off targets that refuse it; this is for a
	// target.yaml changed since.
	if err := privilegeRefused(&r.sum, t); err != nil {
		return &createFailed{err}
	}
	for attempt := 1; ; attempt++ {
		err := r.createPod(ctx, t)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		var unbound *unboundPod
		if err = r.own(ctx, t); !errors.As(err, &unbound) {
			return err
		}
		r.log.Warn("pod deleted: it has the step's name and seal but is not bound to jetway's create (its maker stopped first, or it was planted); making the step's again",
			"pod", unbound.pod.Name, "uid", string(unbound.pod.UID))
		if attempt == maxUnbound {
			return &createFailed{fmt.Errorf("pod %s is in the step's way: pods of its name keep appearing that jetway did not make (sealed but not bound to their UID); the step gave them nothing", unbound.pod.Name)}
		}
	}
}

// maxUnbound bounds how many unbound pods in its way a step deletes
// before it fails: one is a gateway that stopped between its create and
// its bind; more, someone making them.
const maxUnbound = 3

// createPod makes the step's pod and binds it to its UID (the binding
// seen through even if ctx ends meanwhile: ownership.Bind); an error of
// its own is a createFailed, an AlreadyExists the API server's.
func (r *runner) createPod(ctx context.Context, t *targets.Target) error {
	pod := buildPod(&r.sum, r.k.me, t, r.placed, r.k.opts.Pod)
	pods := t.Core.Pods(t.Namespace())
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	created, err := pods.Create(cctx, pod, metav1.CreateOptions{})
	cancel()
	switch {
	case apierrors.IsAlreadyExists(err):
		return err
	case err != nil:
		return &createFailed{fmt.Errorf("create pod %s: %w", pod.Name, err)}
	}
	r.setPodUID(created.UID)
	if _, err := ownership.Bind(ctx, pods, r.k.opts.Pod.Key, t.Name(), created); err != nil {
		return &createFailed{err}
	}
	return nil
}

// unboundPod: own deleted the pod in the step's way, sealed but not bound.
type unboundPod struct{ pod *corev1.Pod }

func (e *unboundPod) Error() string {
	return "pod " + e.pod.Name + " is sealed but not bound to jetway's create"
}

// recordScheduled records where the scheduler bound the step's pod, as
// the pod says: the last event of the step's head.
func (r *runner) recordScheduled(ctx context.Context) (*Record, error) {
	t, err := r.target()
	if err != nil {
		return nil, err
	}
	p := t.CachedPod(r.placed.Pod)
	if p == nil {
		if p, err = t.Pod(ctx, r.placed.Pod); err != nil {
			return nil, fmt.Errorf("read pod %s: %w", r.placed.Pod, err)
		}
	}
	node := Node{Name: p.Spec.NodeName, At: scheduledAt(p), UID: p.UID}
	return r.update(ctx, func(st *Status) error {
		if st.Scheduled != nil {
			return errUnchanged
		}
		st.Scheduled = &node
		return nil
	})
}

// createFailed: the pod could not be made.
type createFailed struct{ err error }

func (e *createFailed) Error() string { return e.err.Error() }
func (e *createFailed) Unwrap() error { return e.err }

// own makes the step's existing pod this gateway's: its owner label names
// it, written on the version read, so a pod changed meanwhile is read
// again.
func (r *runner) own(ctx context.Context, t *targets.Target) error {
	for attempt := 0; ; attempt++ {
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		p, err := t.Pod(gctx, r.placed.Pod)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			return nil // the watcher reports it gone
		case err != nil:
			return fmt.Errorf("read pod %s: %w", r.placed.Pod, err)
		case p.Labels[HandleLabel] != r.sum.Handle || p.Labels[ownership.TeamLabel] != r.sum.Team:
			return &createFailed{fmt.Errorf("pod %s is in the step's way: its labels name another step", p.Name)}
		case !r.k.opts.Pod.Key.Sealed(r.placed.Target, p):
			// Its name and labels are the step's, but jetway did not seal
			// it: planted by someone who may create pods there.
			r.k.opts.Metrics.rejectedPod(rejectUnsealed)
			r.log.Warn("pod refused: it has the step's name and labels but not jetway's seal", "pod", p.Name)
			return &createFailed{fmt.Errorf("pod %s is in the step's way: jetway did not make it (it has no valid %s); the step gave it nothing", p.Name, ownership.SealAnnotation)}
		case r.podUID() != "" && p.UID != r.podUID():
			r.k.opts.Metrics.rejectedPod(rejectReplaced)
			return &podFailed{steppod.PodReplaced}
		case !r.k.opts.Pod.Key.Bound(r.placed.Target, p) && r.podUID() == "":
			// Never scheduled for the step, so never used: made by an owner
			// that stopped before it bound it, or planted with a copied seal.
			// Deleted as it was read: one its maker binds meanwhile is read
			// again, and taken.
			err := r.k.deleteUnbound(ctx, t, p)
			if apierrors.IsConflict(err) {
				continue
			}
			if err != nil {
				return err
			}
			r.k.opts.Metrics.rejectedPod(rejectUnbound)
			return &unboundPod{p}
		case !r.k.opts.Pod.Key.Bound(r.placed.Target, p):
			// The pod the step's record names, by its UID, made before pods
			// were bound: bound now, as its record vouches for it.
			if _, err := ownership.Bind(ctx, t.Core.Pods(t.Namespace()), r.k.opts.Pod.Key, r.placed.Target, p); err != nil {
				return fmt.Errorf("bind pod %s, which the step's record names: %w", p.Name, err)
			}
			r.log.Info("step pod bound to its recorded UID: made before pods were bound", "pod", p.Name)
			continue
		case p.Labels[ownership.OwnerLabel] == r.k.me:
			r.setPodUID(p.UID)
			return nil
		}
		err = r.k.relabel(ctx, t, p)
		if err == nil {
			r.setPodUID(p.UID)
			return nil
		}
		if !apierrors.IsConflict(err) || attempt > 10 {
			return fmt.Errorf("own pod %s: %w", p.Name, err)
		}
	}
}

// setPodUID notes the UID of the step's pod: the one this runner made,
// or the bound one it took; the watch, which may have seen the pod
// already and waits for no change of it, is woken.
func (r *runner) setPodUID(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.known = uid
	if r.knownSet != nil {
		close(r.knownSet)
		r.knownSet = nil
	}
}

// knownChanged is closed at the next setPodUID.
func (r *runner) knownChanged() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.knownSet == nil {
		r.knownSet = make(chan struct{})
	}
	return r.knownSet
}

// knownUID is the UID of the step's pod as this runner made or took it,
// or "".
func (r *runner) knownUID() types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known
}

// podUID is the step's pod's UID as its record has it, or "" before it
// was scheduled.
func (r *runner) podUID() types.UID {
	if rec, ok := r.record(); ok && rec.Status.Scheduled != nil {
		return rec.Status.Scheduled.UID
	}
	return ""
}

// outcome is the step's last event, and whether its pod stays (its
// process ran, so its outputs and log may matter).
func (r *runner) outcome(st stepagent.Status, err, cause error) (wire.Event, bool) {
	var pf *podFailed
	var cf *createFailed
	switch {
	case errors.As(cause, &pf), errors.As(err, &pf):
		return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, Reason: pf.f.Reason, Message: pf.f.Message}, r.hasStarted()
	case errors.Is(cause, errAborted):
		return wire.Event{Type: wire.EventFailed, Phase: wire.Aborted, Reason: stepagent.ReasonAborted, Message: "aborted"}, true
	case errors.Is(err, errAborted):
		return wire.Event{Type: wire.EventFailed, Phase: wire.Aborted, Reason: stepagent.ReasonAborted, Message: "aborted while waiting for its inputs"}, false
	case errors.Is(cause, errTargetGone):
		return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, Reason: "TargetRemoved", Message: cause.Error()}, false
	case errors.Is(cause, errTimedOut):
		return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, Reason: stepagent.ReasonTimeout,
			Message: fmt.Sprintf("timed out after %s; the step agent did not stop the process, so its pod goes", r.sum.Timeout)}, false
	case errors.As(err, &cf):
		return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, Reason: "CreatePodFailed", Message: err.Error()}, false
	case err != nil:
		return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, Reason: "StepFailed", Message: err.Error()}, r.hasStarted()
	}
	e := steppod.StatusEvent(st)
	if e.Phase == wire.Succeeded && r.sum.Resource {
		return r.resourceOutcome(e)
	}
	return e, true
}

func (r *runner) hasStarted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.startedAt.IsZero()
}

// agent builds an agent command line.
func agent(args ...string) []string { return append([]string{agentCommand}, args...) }

// agent builds an agent command line for the step: in a sandbox, in the
// step's own folder.
func (r *runner) agent(args ...string) []string { return agent(r.args(args...)...) }

// args are an agent command's arguments for the step (after the agent's
// path, as steppod.Command's): in a sandbox, in the step's own folder.
func (r *runner) args(args ...string) []string {
	if r.placed.Run != "" {
		args = append(args, "--run", r.placed.Run)
	}
	return args
}

// exec runs an agent command in the step's pod, on its target as it is
// now.
func (r *runner) exec(ctx context.Context, cmd []string, stdin []byte, out interface{ Write([]byte) (int, error) }) error {
	t, err := r.target()
	if err != nil {
		return err
	}
	return r.k.opts.Exec(ctx, t, r.placed.Pod, steppod.StepContainer, cmd, stdin, out)
}

// spec is the step's spec as the agent takes it, from the request in its
// record: the same on every owner, so read once.
func (r *runner) spec(ctx context.Context) ([]byte, error) {
	r.specMu.Lock()
	defer r.specMu.Unlock()
	if r.specRaw != nil {
		return r.specRaw, nil
	}
	raw, err := r.k.opts.Records.Request(ctx, r.name)
	if err != nil {
		return nil, fmt.Errorf("read the step's request: %w", err)
	}
	var req wire.Request
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, fmt.Errorf("the step's request: %w", err)
	}
	sp := steppod.AgentSpec(&req)
	sp.KillGrace = r.placed.KillGrace
	sp.Answer = r.sum.Resource
	if r.specRaw, err = json.Marshal(sp); err != nil {
		return nil, err
	}
	return r.specRaw, nil
}

// start prepares the step in its pod, brings its inputs in and returns
// the command that starts it (its arguments, after the agent's path).
// Without inputs one exec does it all.
func (r *runner) start(ctx context.Context, rec *Record) ([]string, []byte, error) {
	spec, err := r.spec(ctx)
	if err != nil {
		return nil, nil, err
	}
	if len(r.sum.Inputs) == 0 {
		stdin := slices.Concat(spec, []byte("[]")) // spec is shared: never appended to
		return r.args("run", "--spec-bytes", strconv.Itoa(len(spec)), "--inputs-bytes", "2",
			"--offset", strconv.FormatInt(r.offset, 10), "--events", strconv.Itoa(r.logEvents)), stdin, nil
	}
	if rec.Status.Prepared.IsZero() {
		if err := r.prepare(ctx, spec); err != nil {
			return nil, nil, err
		}
		if rec, err = r.update(ctx, func(st *Status) error {
			if !st.Prepared.IsZero() {
				return errUnchanged
			}
			st.Prepared = r.k.opts.Now().UTC()
			return nil
		}); err != nil {
			return nil, nil, err
		}
	}
	inputs, err := r.inputs(ctx, rec)
	if err != nil {
		return nil, nil, err
	}
	raw, _ := json.Marshal(inputs)
	return r.args("run", "--inputs-bytes", strconv.Itoa(len(raw)),
		"--offset", strconv.FormatInt(r.offset, 10), "--events", strconv.Itoa(r.logEvents)), raw, nil
}

// prepare writes the spec into the pod, retrying broken execs. A spec
// there already (its earlier owner's) stands.
func (r *runner) prepare(ctx context.Context, spec []byte) error {
	retryDelay, since := steppod.FirstRetry, r.k.opts.Now()
	for {
		err := r.exec(ctx, r.agent("prepare", "--spec-bytes", strconv.Itoa(len(spec))), spec, nopWriter{})
		if err == nil {
			return nil
		}
		code, coded := stepagent.ExitCode(err)
		switch {
		case coded && code == stepagent.ExitSpecDiffers:
			return nil
		case coded && code == stepagent.ExitUsage:
			return fmt.Errorf("prepare the step in its pod: %w", err)
		case ctx.Err() != nil:
			return ctx.Err()
		case r.k.opts.Now().Sub(since) > steppod.LostAfter:
			return fmt.Errorf("prepare the step in its pod: no answer for %s: %w", steppod.LostAfter, err)
		}
		if err := backoff.Sleep(ctx, backoff.Jitter(retryDelay, 0.2)); err != nil {
			return err
		}
		retryDelay = steppod.NextRetry(retryDelay, r.k.opts.Now().Sub(since))
	}
}

// inputs brings every input into its volume, once: each one in is
// recorded before the next, and one recorded is never brought in again.
// Uploads come through the API, on any gateway; the runner waits for
// them.
func (r *runner) inputs(ctx context.Context, rec *Record) ([]wire.InputDigest, error) {
	out := []wire.InputDigest{}
	for _, in := range r.sum.Inputs {
		if got, ok := rec.Status.Inputs[in.Name]; ok {
			out = append(out, got)
			continue
		}
		if in.From.Upload {
			got, err := r.awaitUpload(ctx, in.Name)
			if err != nil {
				return nil, err
			}
			out = append(out, got)
			continue
		}
		got, err := r.stream(ctx, in)
		if err != nil {
			return nil, err
		}
		if rec, err = r.update(ctx, func(st *Status) error {
			if st.Inputs == nil {
				st.Inputs = map[string]wire.InputDigest{}
			}
			st.Inputs[in.Name] = got
			return nil
		}); err != nil {
			return nil, err
		}
		out = append(out, got)
	}
	return out, nil
}

// stream copies an input into its volume, as the step's submitter: a
// team's step reads only its team's pods.
func (r *runner) stream(ctx context.Context, in wire.Input) (wire.InputDigest, error) {
	req := streams.Request{StreamRequest: wire.StreamRequest{
		From:     wire.Endpoint{Target: in.From.Target, Pod: in.From.Pod, Handle: in.From.Handle, Path: in.From.Path},
		To:       wire.Endpoint{Target: r.placed.Target, Pod: r.placed.Pod, Handle: steppod.InputVolume(in.Name)},
		Encoding: "raw",
	}, Caller: streams.Caller{Admin: r.sum.Admin, Team: r.sum.Team}}
	res, err := r.k.opts.Streamer.Stream(ctx, req, nil)
	if err != nil {
		return wire.InputDigest{}, fmt.Errorf("input %s: %w", in.Name, err)
	}
	return wire.InputDigest{Name: in.Name, Bytes: res.Bytes, SHA256: res.SHA256}, nil
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// errTargetGone: the step's target left the targets directory.
var errTargetGone = errors.New("target removed")

// scheduledAt is when the scheduler bound the pod, as the pod says.
func scheduledAt(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.UTC()
		}
	}
	return time.Time{}
}
