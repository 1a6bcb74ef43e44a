package steps

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
)

// conclude ends the step with e and records the end on its pod, so that
// the pod stops counting against the target and a restarted gateway knows.
// A pod whose process never ran (unschedulable, an image that cannot be
// pulled) is deleted instead: nothing in it matters, and it must not start
// later.
func (r *runner) conclude(ctx context.Context, e Event, keep bool) {
	now := r.m.opts.Now().UTC()
	if r.s.sandbox != nil { // the pod is the sandbox's, not the step's
		if r.s.finish(e, now) {
			r.m.ended(r.s)
		}
		r.m.released(r.s)
		return
	}
	if !keep {
		// Gone before the end shows, so that whoever sees the end sees
		// the pod released.
		if err := r.m.release(ctx, r.s); err != nil {
			r.m.opts.Logger.Warn("step pod not released", "target", r.t.Name(), "pod", r.pod, "error", err.Error())
		}
		if r.s.finish(e, now) {
			r.m.ended(r.s)
		}
		return
	}
	r.s.update(func(v *View) { v.Outputs = OutputVolumes(r.s.req.Outputs, r.t.Name(), r.pod) })
	if !r.s.finish(e, now) {
		return
	}
	r.m.ended(r.s)
	r.m.wake()
	v := r.s.snapshot()
	raw, _ := json.Marshal(end{Phase: v.Phase, ExitStatus: v.ExitStatus, Reason: v.Reason, Message: v.Message,
		StartedAt: v.StartedAt, FinishedAt: now})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		targets.StepEndedAnnotation: now.Format(time.RFC3339Nano), endAnnotation: string(raw)}}})
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := r.t.Core.Pods(r.t.Namespace()).Patch(pctx, r.pod, types.MergePatchType, patch, metav1.PatchOptions{})
		cancel()
		if err == nil || apierrors.IsNotFound(err) || ctx.Err() != nil {
			return
		}
		r.m.opts.Logger.Warn("step end not recorded on its pod; retrying", "target", r.t.Name(), "pod", r.pod, "error", err.Error())
		if sleep(ctx, jitter(backoff)) != nil {
			return
		}
	}
}

// OutputVolumes are a step's outputs as volumes of its pod.
func OutputVolumes(outs []Output, target, pod string) []Volume {
	var vs []Volume
	for _, o := range outs {
		vs = append(vs, Volume{Name: o.Name, Target: target, Pod: pod, Handle: OutputVolume(o.Name)})
	}
	return vs
}

// ended reads how a step pod's step ended, if it did.
func ended(p *corev1.Pod) (end, bool) {
	raw, ok := p.Annotations[endAnnotation]
	if !ok {
		return end{}, false
	}
	var e end
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return end{Phase: Errored, Reason: "Unknown", Message: "the step's recorded end does not parse"}, true
	}
	return e, true
}

// replay rebuilds an ended step's events after a gateway restart: from its
// pod, and from the agent's log while the pod still runs.
func (r *runner) replay(ctx context.Context, e end) {
	r.emitPlaced()
	p := r.adopted
	if p.Spec.NodeName != "" {
		r.s.emit(Event{Type: EventScheduled, Time: scheduledAt(p), Node: p.Spec.NodeName})
	}
	if p.Status.Phase == corev1.PodRunning {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, _, err := r.attach(tctx, r.agent("tail", "--offset", "0"), nil)
		cancel()
		if err != nil {
			r.m.opts.Logger.Warn("ended step's log not replayed", "target", r.t.Name(), "pod", r.pod, "error", err.Error())
		}
	}
	typ := EventFailed
	if e.Phase == Succeeded || e.Phase == Failed {
		typ = EventExited
	}
	r.s.update(func(v *View) {
		v.Outputs = OutputVolumes(r.s.req.Outputs, r.t.Name(), r.pod)
		v.StartedAt = e.StartedAt
		if r.s.req.Resource != nil && e.Phase == Succeeded {
			v.Result, _ = resourceResult(r.s.req.Type, r.answer)
		}
	})
	r.s.finish(Event{Type: typ, Phase: e.Phase, ExitStatus: e.ExitStatus, Reason: e.Reason, Message: e.Message}, e.FinishedAt)
}

// recovered is the step a restarted gateway finds in pod p of target.
func recovered(k key, p *corev1.Pod, target string) (*step, error) {
	var in info
	if err := json.Unmarshal([]byte(p.Annotations[infoAnnotation]), &in); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", infoAnnotation, err)
	}
	req := Request{Handle: k.handle, Type: in.Type, Team: k.team, Outputs: in.Outputs, Inputs: in.Inputs, Timeout: in.Timeout}
	if in.Resource {
		req.Resource = &Resource{} // its answer is read from the log again
	}
	s := newStep(k, req, in.Caller, p.CreationTimestamp.UTC())
	s.view.Phase, s.view.Target, s.view.Pod, s.view.PlacedAt = Starting, target, p.Name, in.PlacedAt
	return s, nil
}

// release deletes the step's pod, and with it its outputs.
func (m *Manager) release(ctx context.Context, s *step) error {
	v := s.snapshot()
	if v.Pod != "" && !v.Released && s.sandbox == nil {
		t, err := m.opts.Registry.Target(v.Target)
		if err == nil {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = t.Core.Pods(t.Namespace()).Delete(dctx, v.Pod, metav1.DeleteOptions{})
			cancel()
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete pod %s: %w", v.Pod, err)
			}
		}
	}
	m.released(s)
	return nil
}

// released marks a step's pod gone; the step is forgotten after Retain.
func (m *Manager) released(s *step) {
	forget := m.opts.Now().Add(m.opts.Retain)
	s.update(func(v *View) { v.Released, v.Outputs = v.Pod != "", nil })
	s.mu.Lock()
	s.forget = forget
	s.mu.Unlock()
}

// streamInputs copies each input into its volume in the step's pod, as
// the step's submitter: a team's step reads only its team's pods.
func (r *runner) streamInputs(ctx context.Context) ([]stepagent.Input, error) {
	caller := streams.Caller{Admin: r.s.caller.Admin, Team: r.s.key.team}
	out := []stepagent.Input{}
	for _, in := range r.s.req.Inputs {
		if in.From.Upload {
			got, err := r.awaitUpload(ctx, in.Name)
			if err != nil {
				return nil, err
			}
			out = append(out, got)
			continue
		}
		req := streams.Request{
			From:     streams.Endpoint{Target: in.From.Target, Pod: in.From.Pod, Handle: in.From.Handle, Path: in.From.Path},
			To:       streams.Endpoint{Target: r.t.Name(), Pod: r.pod, Handle: InputVolume(in.Name)},
			Encoding: "raw", Caller: caller,
		}
		res, err := r.m.opts.Streamer.Stream(ctx, req, nil)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", in.Name, err)
		}
		out = append(out, stepagent.Input{Name: in.Name, Bytes: res.Bytes, SHA256: res.SHA256})
	}
	return out, nil
}
