package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// endAnnotation records on a kept step pod how its step ended (JSON End),
// beside targets.StepEndedAnnotation's time: for people reading the pod;
// jetway reads the record.
const endAnnotation = "jetway-ci.dev/step-end"

// concludeWait bounds how long a runner keeps trying to record its step's
// end; past it, the step's next owner (this gateway again, or another)
// finds the process ended and records it.
const concludeWait = 2 * time.Minute

// conclude records the step's end. Then its pod stops counting against
// its target (it is marked ended) or, when nothing in it matters (the
// process never ran), it is deleted: see finish.
func (r *runner) conclude(ctx context.Context, e wire.Event, keep bool) {
	count := r.logEvents
	if e.Type == wire.EventFailed && e.ExitStatus == nil {
		// The log's status was not read: count what the log holds now, so
		// the end's number follows every event a reader could have read.
		count = max(count, r.countLog(ctx))
	}
	at := e.Time
	if at.IsZero() {
		at = r.k.opts.Now().UTC()
	}
	end := &End{Phase: e.Phase, ExitStatus: e.ExitStatus, Reason: e.Reason, Message: e.Message, At: at.UTC(),
		LogEvents: count, Kept: keep && r.placed.Run == ""}
	released := false
	if !end.Kept && r.placed.Run == "" {
		// Nothing in the pod matters: it goes before the end shows, so
		// whoever sees the end sees it released. A pod on a target gone
		// from the directory is out of reach: released as it is.
		t, err := r.target()
		released = errors.Is(err, targets.ErrNotFound)
		if err == nil {
			if err := r.k.deletePod(ctx, t, r.placed.Pod); err == nil {
				released = true
			} else {
				r.log.Warn("step pod not deleted; its owner tries again", "error", err.Error())
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, concludeWait)
	defer cancel()
	var rec *Record
	for retryDelay := 100 * time.Millisecond; ; retryDelay = min(2*retryDelay, 5*time.Second) {
		var err error
		rec, err = r.k.opts.Records.Update(cctx, r.name, func(rec *Record) error {
			switch {
			case rec.Status.Owner != r.k.me:
				return errNotOwner
			case rec.Status.End != nil:
				return errUnchanged
			}
			rec.Status.End = end
			if released {
				rec.Status.Released = r.k.opts.Now().UTC()
			}
			if r.result != nil {
				rec.setResult(r.result)
			}
			return nil
		})
		if err == nil {
			break
		}
		if errors.Is(err, errNotOwner) || errors.Is(err, errRecordGone) || cctx.Err() != nil {
			r.log.Warn("step end not recorded", "error", err.Error(), "why", fmt.Sprint(context.Cause(cctx)))
			return
		}
		r.log.Warn("step end not recorded; retrying", "error", err.Error())
		if backoff.Sleep(cctx, backoff.Jitter(retryDelay, 0.2)) != nil {
			return
		}
	}
	r.tail.end(false)
	r.k.opts.Metrics.finished(r.sum.Type, end.Phase)
	_ = r.k.finish(ctx, rec) // what fails here, the reconcile tries again
}

// healthy says a check ended by its script's exit, not by its sandbox's
// failure, an abort or a lost contact: its sandbox is still good.
func healthy(e *End) bool { return e.ExitStatus != nil && e.Phase != wire.Aborted }

// forgetRun deletes an ended check's folder in its sandbox, and with it
// its log: it is released.
func (k *keeper) forgetRun(ctx context.Context, t *targets.Target, rec *Record) error {
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p := rec.Status.Placed
	return k.opts.Exec(fctx, t, p.Pod, steppod.StepContainer, agent("forget", "--run", p.Run), nil, nopWriter{})
}

// countLog is the number of events the step's log holds now (0 when it
// cannot be read): the agent skips them all and says where it is.
func (r *runner) countLog(ctx context.Context) int {
	t, err := r.target()
	if err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(r.k.execAny(ctx, t, r.placed.Pod, r.agent("tail", "--skip", "all"), pw))
	}()
	defer func() { cancel(); pr.Close(); <-done }()
	f, err := stepagent.ReadFrame(pr)
	if err != nil || f.Kind != stepagent.KindPosition {
		return 0
	}
	var p stepagent.Position
	if json.Unmarshal(f.Payload, &p) != nil {
		return 0
	}
	return p.Events
}

// finish does with an ended step's pod what its end says, as its owner:
// a kept pod is marked ended (it stops counting as an active container or
// task; its volumes count until it goes); another is deleted and the step
// marked released. The step's release (DELETE) deletes a kept one too. A
// pod gone makes the step released. Each move is repeated until it shows,
// by whichever owner the step has then.
func (k *keeper) finish(ctx context.Context, rec *Record) error {
	st := rec.Status
	if st.End == nil || st.Placed == nil || !st.Released.IsZero() {
		return nil
	}
	t, err := k.opts.Registry.Target(st.Placed.Target)
	if errors.Is(err, targets.ErrNotFound) {
		// Its target left the directory: its pod is out of reach (the
		// target's retire, or its namespace's deletion, takes it).
		return k.released(ctx, rec)
	}
	if err != nil {
		return err // an invalid entry: its pod waits for its clients
	}
	log := k.opts.Logger.With("target", st.Placed.Target, "pod", st.Placed.Pod, "handle", rec.Summary.Handle)
	p := t.CachedPod(st.Placed.Pod)
	switch {
	case gone(t, st.Placed.Pod):
		return k.released(ctx, rec)
	case st.Placed.Run != "":
		// A check's folder in its sandbox, its log with it, stays for
		// Retain (the sandbox's owner deletes the sandbox when it is idle).
		if k.opts.Now().Sub(st.End.At) < k.opts.Retain && !st.Release {
			return nil
		}
		if err := k.forgetRun(ctx, t, rec); err != nil && ctx.Err() == nil {
			log.Warn("check's folder in its sandbox not deleted", "error", err.Error())
			return err
		}
		return k.released(ctx, rec)
	case !st.End.Kept || st.Release || k.opts.Now().Sub(st.End.At) > k.opts.GCGrace:
		if err := k.deletePod(ctx, t, st.Placed.Pod); err != nil {
			log.Warn("step pod not deleted", "error", err.Error())
			return err
		}
		return k.released(ctx, rec)
	case p != nil && p.Annotations[targets.StepEndedAnnotation] == "":
		raw, _ := json.Marshal(st.End)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			targets.StepEndedAnnotation: st.End.At.Format(time.RFC3339Nano), endAnnotation: string(raw)}}})
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := t.Core.Pods(t.Namespace()).Patch(pctx, st.Placed.Pod, types.MergePatchType, patch, metav1.PatchOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			log.Warn("step end not marked on its pod", "error", err.Error())
			return err
		}
	}
	return nil
}

// unfinished reports whether finish has something to do for an ended
// step, as the caches show it.
func (k *keeper) unfinished(rec *Record) bool {
	st := rec.Status
	if st.End == nil || st.Placed == nil || !st.Released.IsZero() {
		return false
	}
	t, err := k.opts.Registry.Target(st.Placed.Target)
	switch {
	case errors.Is(err, targets.ErrNotFound):
		return true
	case err != nil:
		return false
	case gone(t, st.Placed.Pod):
		return true
	case st.Placed.Run != "":
		return k.opts.Now().Sub(st.End.At) >= k.opts.Retain || st.Release
	case !st.End.Kept || st.Release || k.opts.Now().Sub(st.End.At) > k.opts.GCGrace:
		return true
	}
	p := t.CachedPod(st.Placed.Pod)
	return p != nil && p.Annotations[targets.StepEndedAnnotation] == ""
}

// deletePod deletes a step pod this gateway owns (its record, or the
// sandboxes, say so): read fresh, it is made to name this gateway first if
// it names the owner this gateway took it from, and it is deleted at the
// version read, so a pod changed meanwhile is read again. The pod's owner
// label says who deleted it.
func (g *gateway) deletePod(ctx context.Context, t *targets.Target, name string) error {
	for attempt := 0; attempt < 10; attempt++ {
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		p, err := t.Pod(gctx, name)
		cancel()
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read pod %s: %w", name, err)
		}
		if !g.opts.Pod.Key.Sealed(t.Name(), p) {
			// Not jetway's, whatever its labels say (planted under the
			// step's name): none of the step's to delete.
			g.opts.Logger.Warn("pod left alone: it has a step's name but not jetway's seal", "target", t.Name(), "pod", name)
			return nil
		}
		if p.Labels[ownership.OwnerLabel] != g.me {
			if err := g.relabel(ctx, t, p); err != nil && !apierrors.IsConflict(err) {
				return err
			}
			continue
		}
		uid, rv := p.UID, p.ResourceVersion
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = t.Core.Pods(t.Namespace()).Delete(dctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		cancel()
		if err == nil || apierrors.IsNotFound(err) {
			g.opts.Metrics.podDeleted()
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
	}
	return fmt.Errorf("delete pod %s: it keeps changing", name)
}

// deleteUnbound deletes p, a pod sealed but not bound that is in a step's
// way (never used: jetway uses only bound pods), as it was read: made this
// gateway's first (its owner label, as for every pod a gateway deletes),
// then deleted at that version, and returns once it is gone. A Conflict
// says it changed since it was read (its maker bound it, say): read it
// again. Gone already is done.
//
// It gets a second's grace, not forced: forced, its object goes at once
// while its containers may run on (a planted pod may ask for an hour's
// grace and trap TERM), and a pod of its name made meanwhile is not safe:
// the kubelet finds the pod it execs and port-forwards into by name among
// the pods it runs. Only one still there unboundGone later (its kubelet
// unreachable: it runs nothing a request could reach) is forced.
func (g *gateway) deleteUnbound(ctx context.Context, t *targets.Target, p *corev1.Pod) error {
	pods := t.Core.Pods(t.Namespace())
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": p.UID, "resourceVersion": p.ResourceVersion,
		"labels": map[string]string{ownership.OwnerLabel: g.me}}})
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	mine, err := pods.Patch(pctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("delete pod %s, unbound in the step's way: %w", p.Name, err)
	}
	uid, rv := mine.UID, &mine.ResourceVersion
	del := func(grace int64) error {
		err := pods.Delete(pctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace,
			Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s, unbound in the step's way: %w", p.Name, err)
		}
		return nil
	}
	if err := del(1); err != nil {
		return err
	}
	g.opts.Metrics.podDeleted()
	if err := awaitGone(ctx, t, uid, unboundGone); err != nil && ctx.Err() == nil {
		g.opts.Logger.Warn("pod in the step's way not gone after its grace: deleted by force (its kubelet may be unreachable)",
			"target", t.Name(), "pod", p.Name, "uid", string(uid), "waited", unboundGone.String())
		rv = nil // its deletion changed its version: the UID alone
		if err := del(0); err != nil {
			return err
		}
		return awaitGone(ctx, t, uid, 30*time.Second)
	}
	return ctx.Err()
}

// unboundGone bounds the wait for an unbound pod in a step's way to be
// stopped by its kubelet after its second's grace.
const unboundGone = 20 * time.Second

// awaitGone waits until t's pod cache shows no pod of uid, for at most
// wait.
func awaitGone(ctx context.Context, t *targets.Target, uid types.UID, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return t.AwaitPodGone(ctx, uid)
}

// relabel makes a step pod name this gateway as its owner, at the version
// read.
func (g *gateway) relabel(ctx context.Context, t *targets.Target, p *corev1.Pod) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": p.ResourceVersion,
		"labels": map[string]string{ownership.OwnerLabel: g.me}}})
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := t.Core.Pods(t.Namespace()).Patch(pctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err == nil {
		g.opts.Logger.Info("step pod taken over", "target", t.Name(), "pod", p.Name, "was", p.Labels[ownership.OwnerLabel])
	}
	return err
}

// released records that an ended step's pod, and its outputs, are gone.
func (k *keeper) released(ctx context.Context, rec *Record) error {
	now := k.opts.Now().UTC()
	_, err := k.opts.Records.Update(ctx, rec.Name, func(r *Record) error {
		switch {
		case r.Status.Owner != k.me:
			return errNotOwner
		case !r.Status.Released.IsZero():
			return errUnchanged
		}
		r.Status.Released = now
		return nil
	})
	if err != nil && !errors.Is(err, errNotOwner) && !errors.Is(err, errRecordGone) {
		k.opts.Logger.Warn("step release not recorded", "handle", rec.Summary.Handle, "error", err.Error())
		return err
	}
	return nil
}
