package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/wire"
)

// podLookupTimeout bounds reading one pod from a target's API server.
const podLookupTimeout = 10 * time.Second

// authorize reads both pods of req and checks that the caller may touch
// each; it returns the destination pod, whose IP serves a direct stream.
// A pod missing or not the caller's fails with ErrNotFound; a pod that
// cannot be read fails with an *Error naming its side.
// A source owned by another gateway is checked there (Send).
func (s *Streamer) authorize(ctx context.Context, req Request) (*corev1.Pod, error) {
	if s.opts.Key.IsZero() {
		return nil, &Error{Side: SideDestination, Err: errNoKey}
	}
	if req.Source == nil {
		if _, err := s.check(ctx, req.Caller, SideSource, req.From); err != nil {
			return nil, err
		}
	}
	return s.check(ctx, req.Caller, SideDestination, req.To)
}

// check reads the pod of one side and checks the caller may touch it.
func (s *Streamer) check(ctx context.Context, c Caller, side string, e wire.Endpoint) (*corev1.Pod, error) {
	if s.opts.Key.IsZero() {
		return nil, &Error{Side: side, Err: errNoKey}
	}
	pod, err := s.pod(ctx, e)
	if err != nil {
		return nil, &Error{Side: side, Err: err}
	}
	if !s.mayTouch(c, e.Target, pod) {
		return nil, &Error{Side: side, Err: notFound(e)}
	}
	if err := s.trusted(e.Target, pod); err != nil {
		return nil, &Error{Side: side, Err: notFound(e)} // the caller learns nothing
	}
	return pod, nil
}

// trusted is nil when pod, of target, is the very pod jetway made under
// its name (ownership.Key.Bound); else the refusal, logged and counted.
// A pod with jetway's labels but not its seal (planted, or relabelled),
// or with a seal copied onto another pod of the name, gets no byte.
func (s *Streamer) trusted(target string, pod *corev1.Pod) error {
	why := s.opts.Key.Verdict(target, pod)
	if why == "" {
		return nil
	}
	s.opts.Metrics.reject(why)
	s.opts.Logger.Warn("pod refused: it carries jetway's labels but jetway did not make it", "target", target, "pod", pod.Name,
		"uid", string(pod.UID), "why", why)
	return fmt.Errorf("pod %s on target %s %w: jetway did not make it (%s), so it gets no request", pod.Name, target, errNotJetways, why)
}

// errNotJetways: a pod jetway does not trust (trusted).
var errNotJetways = errors.New("is not jetway's")

// pod reads a pod of an endpoint; a missing one is ErrNotFound.
func (s *Streamer) pod(ctx context.Context, e wire.Endpoint) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, podLookupTimeout)
	defer cancel()
	t, err := s.opts.Target(e.Target)
	if err != nil {
		return nil, err
	}
	pod, err := t.Pod(ctx, e.Pod)
	if apierrors.IsNotFound(err) {
		return nil, notFound(e)
	}
	if err != nil {
		return nil, fmt.Errorf("read pod %s on target %s: %w", e.Pod, e.Target, err)
	}
	return pod, nil
}

// notFound is the one answer for a pod missing and a pod not the caller's.
func notFound(e wire.Endpoint) error {
	return fmt.Errorf("pod %q %w on target %q", e.Pod, ErrNotFound, e.Target)
}

// mayTouch reports whether caller may stream from or into pod on target.
// The pod must carry jetway's ownership labels for target and this
// installation, so no stream reaches a pod jetway did not make. An admin
// may touch any such pod; a team only those labelled with its team, and a
// pod without a team label is for admins alone.
func (s *Streamer) mayTouch(c Caller, target string, pod *corev1.Pod) bool {
	if s.opts.Installation == "" || !hasLabel(pod, ownership.WorkerLabel, target) ||
		!hasLabel(pod, ownership.InstallationLabel, s.opts.Installation) {
		return false
	}
	return c.Admin || (c.Team != "" && hasLabel(pod, ownership.TeamLabel, c.Team))
}

func hasLabel(pod *corev1.Pod, key, want string) bool {
	v, ok := pod.Labels[key]
	return ok && v == want
}
