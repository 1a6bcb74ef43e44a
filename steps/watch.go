package steps

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/steppod"
)

// appearTimeout is how long a pod just made may stay out of the target's
// watch before the watcher asks the API server whether it still exists.
const appearTimeout = 30 * time.Second

// DefaultTargetGoneGrace is how long a step's target may be missing from
// the targets directory (an operator moving its entry) before the step
// ends.
const DefaultTargetGoneGrace = 30 * time.Second

// watch follows the step's pod in its target's watch (the target as it is
// now: a rotated kubeconfig's new watch too) and its record until ctx
// ends: it closes running once the pod runs, and stops the work with the
// reason when Kubernetes says the pod cannot go on, when the step's
// release is asked for (it is aborted), when the agent overran the step's
// timeout, when the step's target was removed, or when another gateway
// owns the step now.
func (r *runner) watch(ctx context.Context, stop context.CancelCauseFunc, running chan struct{}) {
	w := podWatch{r: r, stop: stop, running: running}
	appear := time.NewTimer(appearTimeout)
	defer appear.Stop()
	var aborts sync.WaitGroup
	defer aborts.Wait()
	aborting := false
	var missing time.Time // since when the target is not in the registry
	for {
		registry, records, known := r.k.opts.Registry.Changed(), r.k.opts.Records.Changed(), r.knownChanged()
		var pods <-chan struct{}
		t, err := r.target()
		switch {
		case err != nil:
			now := r.k.opts.Now()
			if missing.IsZero() {
				missing = now
			}
			if grace := r.k.opts.TargetGoneGrace; now.Sub(missing) >= grace {
				stop(fmt.Errorf("%w: target %s left the targets directory while the step ran (%v); its pod is left as it is", errTargetGone, r.placed.Target, err))
				return
			}
			w.wakeIn(r.k.opts.TargetGoneGrace - now.Sub(missing))
		default:
			missing = time.Time{}
			pods = t.PodsChanged()
			if synced, _ := t.Synced(); synced && w.observe(ctx, t.CachedPod(r.placed.Pod)) {
				return
			}
		}
		rec, ok := r.record()
		switch {
		case !ok:
			stop(errRecordGone)
			return
		case rec.Status.Owner != r.k.me:
			stop(errNotOwner)
			return
		case rec.Status.Release && !aborting:
			aborting = true
			reachable := w.isRunning
			aborts.Go(func() { r.abort(ctx, reachable, errAborted, stop) })
		}
		select {
		case <-ctx.Done():
			return
		case <-pods:
		case <-registry:
		case <-records:
		case <-known: // ensurePod says which pod is the step's
		case <-w.timer():
		case <-appear.C:
			if !w.seen && t != nil {
				if _, err := t.Pod(ctx, r.placed.Pod); apierrors.IsNotFound(err) {
					stop(&podFailed{steppod.Failure{Reason: "PodDeleted", Message: "the step's pod was deleted before it ran"}})
					return
				}
			}
		}
	}
}

// podWatch is the watcher's memory of the pod.
type podWatch struct {
	r       *runner
	stop    context.CancelCauseFunc
	running chan struct{}
	seen    bool      // the watch has shown the step's pod
	uid     types.UID // the step's pod's UID: recorded, made or taken by the runner, or a sandbox's first seen bound
	// unboundSince is when a pod of the step's name was first seen that
	// is not known to be the step's (not bound yet).
	unboundSince time.Time
	isRunning    bool      // running is closed
	pullSince    time.Time // first sight of a pull failing for a passing reason
	wake         *time.Timer
}

// timer fires when the watcher must look again without a change: the
// image-pull grace ending, the step's timeout overrun, a missing target's
// grace ending.
func (w *podWatch) timer() <-chan time.Time {
	if w.wake == nil {
		return nil
	}
	return w.wake.C
}

func (w *podWatch) wakeIn(d time.Duration) {
	if w.wake != nil {
		w.wake.Stop()
	}
	w.wake = time.NewTimer(max(d, 0))
}

// observe acts on the pod as last seen; true when the watch is over.
func (w *podWatch) observe(ctx context.Context, p *corev1.Pod) bool {
	r := w.r
	if p == nil {
		if w.seen {
			w.stop(&podFailed{steppod.PodDeleted})
			return true
		}
		return false
	}
	if w.uid == "" {
		w.uid = cmp.Or(r.podUID(), r.knownUID())
		if w.uid == "" && r.placed.Run != "" && r.k.opts.Pod.Key.Bound(r.placed.Target, p) {
			w.uid = p.UID // a check sandbox, made and bound by the placer
		}
	}
	switch {
	case w.uid == "" && r.placed.Run == "":
		return false // ensurePod makes the step's pod or takes one, and says which
	case w.uid == "":
		return w.unbound(p) // not seen: not the sandbox the placer made
	}
	if p.UID != w.uid {
		r.k.opts.Metrics.rejectedPod(rejectReplaced)
		r.log.Warn("step's pod replaced: another pod has its name", "pod", p.Name, "uid", string(p.UID), "step_pod_uid", string(w.uid))
		w.stop(&podFailed{steppod.PodReplaced})
		return true
	}
	w.seen = true
	if f, ok := steppod.PodFailure(p); ok {
		if !f.Transient {
			w.stop(&podFailed{f})
			return true
		}
		now := r.k.opts.Now()
		if w.pullSince.IsZero() {
			w.pullSince = now
		}
		if left := r.k.opts.ImagePullGrace - now.Sub(w.pullSince); left > 0 {
			w.wakeIn(left)
			return false
		}
		f.Message += " (still failing after the image-pull grace of " + r.k.opts.ImagePullGrace.String() + ")"
		w.stop(&podFailed{f})
		return true
	}
	w.pullSince = time.Time{}
	if !w.isRunning && p.Status.Phase == corev1.PodRunning {
		w.isRunning = true
		close(w.running)
	}
	return w.overrun(ctx)
}

// unbound waits, for at most appearTimeout, for the pod of the step's
// name to be bound by the gateway that made it, a moment after its
// create; a pod still not bound then is not jetway's (planted, or its
// maker stopped first): the step fails, and the pod got nothing.
func (w *podWatch) unbound(p *corev1.Pod) bool {
	now := w.r.k.opts.Now()
	if w.unboundSince.IsZero() {
		w.unboundSince = now
	}
	if left := appearTimeout - now.Sub(w.unboundSince); left > 0 {
		w.wakeIn(left)
		return false
	}
	w.r.k.opts.Metrics.rejectedPod(rejectUnbound)
	w.r.log.Warn("step's pod refused: jetway did not make it (not bound to jetway's create)", "pod", p.Name, "uid", string(p.UID),
		"why", w.r.k.opts.Pod.Key.Verdict(w.r.placed.Target, p))
	w.stop(&podFailed{steppod.PodNotBound})
	return true
}

// overrun is the backstop of the step's timeout, which the agent enforces:
// past it, the kill grace and a margin, the step is stopped from outside.
func (w *podWatch) overrun(ctx context.Context) bool {
	r := w.r
	limit := r.sum.timeout()
	r.mu.Lock()
	started := r.startedAt
	r.mu.Unlock()
	if limit == 0 || started.IsZero() {
		if limit > 0 && w.isRunning && w.wake == nil {
			w.wakeIn(time.Second) // look again once the process has started
		}
		return false
	}
	left := started.Add(limit + time.Duration(r.placed.KillGrace) + overrunMargin).Sub(r.k.opts.Now())
	if left > 0 {
		w.wakeIn(min(left, time.Second))
		return false
	}
	r.abort(ctx, true, errTimedOut, w.stop)
	return true
}

// overrunMargin lets the agent's own timeout win.
const overrunMargin = 30 * time.Second

// abort asks the agent to kill the process (it ends the step's log with
// the status) and, if the agent does not within the kill grace and a
// margin, stops the work with cause: the pod goes, and the process with it.
func (r *runner) abort(ctx context.Context, reachable bool, cause error, stop context.CancelCauseFunc) {
	if !reachable {
		stop(cause)
		return
	}
	deadline := time.NewTimer(time.Duration(r.placed.KillGrace) + 15*time.Second)
	defer deadline.Stop()
	for retryDelay := 100 * time.Millisecond; ; retryDelay = min(2*retryDelay, 2*time.Second) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.exec(actx, r.agent("abort"), nil, nopWriter{})
		cancel()
		if err == nil && !r.hasStarted() {
			stop(cause) // the agent will not start it now: nothing to wait for
			return
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("abort failed; retrying", "error", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			stop(cause)
			return
		case <-time.After(backoff.Jitter(retryDelay, 0.2)):
		}
	}
	select {
	case <-ctx.Done(): // the work ended: the agent delivered the status
	case <-deadline.C:
		stop(cause)
	}
}
