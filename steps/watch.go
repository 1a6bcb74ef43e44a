package steps

import (
	"context"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// appearTimeout is how long a pod just made may stay out of the target's
// watch before the watcher asks the API server whether it still exists.
const appearTimeout = 30 * time.Second

// watch follows the step's pod in the target's watch until ctx ends: it
// reports the pod scheduled, closes running once the pod runs, and stops
// the work with the reason when Kubernetes says the pod cannot go on, when
// the step is aborted, or when the agent overran the step's timeout.
func (r *runner) watch(ctx context.Context, stop context.CancelCauseFunc, running chan struct{}) {
	w := podWatch{r: r, stop: stop, running: running}
	appear := time.NewTimer(appearTimeout)
	defer appear.Stop()
	abort := r.s.abort
	for {
		changed := r.t.PodsChanged()
		if w.observe(ctx, r.t.CachedPod(r.pod)) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-w.timer():
		case <-appear.C:
			if !w.seen {
				if _, err := r.t.Pod(ctx, r.pod); apierrors.IsNotFound(err) {
					stop(&podFailed{failure{Reason: "PodDeleted", Message: "the step's pod was deleted before it ran"}})
					return
				}
			}
		case <-abort:
			abort = nil
			r.abort(ctx, w.isRunning, errAborted, stop)
		}
	}
}

// podWatch is the watcher's memory of the pod.
type podWatch struct {
	r         *runner
	stop      context.CancelCauseFunc
	running   chan struct{}
	seen      bool      // the watch has shown the pod
	scheduled bool      // the scheduled event went out
	isRunning bool      // running is closed
	pullSince time.Time // first sight of a pull failing for a passing reason
	wake      *time.Timer
}

// timer fires when the watcher must look again without a pod change: the
// image-pull grace ending, or the step's timeout overrun.
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
			w.stop(&podFailed{failure{Reason: "PodDeleted", Message: "the step's pod was deleted by someone else"}})
			return true
		}
		return false
	}
	w.seen = true
	if !w.scheduled && p.Spec.NodeName != "" {
		w.scheduled = true
		r.s.emit(Event{Type: EventScheduled, Time: scheduledAt(p), Node: p.Spec.NodeName})
	}
	if f, ok := podFailure(p); ok {
		if !f.Transient {
			w.stop(&podFailed{f})
			return true
		}
		now := r.m.opts.Now()
		if w.pullSince.IsZero() {
			w.pullSince = now
		}
		if left := r.m.opts.ImagePullGrace - now.Sub(w.pullSince); left > 0 {
			w.wakeIn(left)
			return false
		}
		f.Message += " (still failing after the image-pull grace of " + r.m.opts.ImagePullGrace.String() + ")"
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

// overrun is the backstop of the step's timeout, which the agent enforces:
// past it, the kill grace and a margin, the step is stopped from outside.
func (w *podWatch) overrun(ctx context.Context) bool {
	r := w.r
	limit := r.s.req.timeout()
	r.mu.Lock()
	started := r.startedAt
	r.mu.Unlock()
	if limit == 0 || started.IsZero() {
		if limit > 0 && w.isRunning && w.wake == nil {
			w.wakeIn(time.Second) // look again once the process has started
		}
		return false
	}
	left := started.Add(limit + r.m.opts.KillGrace + overrunMargin).Sub(r.m.opts.Now())
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
	deadline := time.NewTimer(r.m.opts.KillGrace + 15*time.Second)
	defer deadline.Stop()
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.m.opts.Exec(actx, r.t, r.pod, r.agent("abort"), nil, nopWriter{})
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		r.m.opts.Logger.Warn("abort failed; retrying", "target", r.t.Name(), "pod", r.pod, "error", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			stop(cause)
			return
		case <-time.After(jitter(backoff)):
		}
	}
	select {
	case <-ctx.Done(): // the work ended: the agent delivered the status
	case <-deadline.C:
		stop(cause)
	}
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// scheduledAt is when the scheduler bound the pod, as the pod says.
func scheduledAt(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.UTC()
		}
	}
	return time.Time{}
}

// jitter spreads d by ±20%, so retries of many steps do not align.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}
