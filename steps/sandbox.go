package steps

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/targets"
)

// A check step with a reuse_key runs in a warm sandbox: a pod of the
// check's image kept for checks of the same key (team, image, reuse key)
// on one target, each check in its own folder of the pod (step-agent
// --run). Checks run every minute per resource; a pod per check would be
// most of their cost.
const (
	// SandboxLabel marks a sandbox pod, with a hash of its key.
	SandboxLabel = "jetway-ci.dev/sandbox"
	// sandboxKeyAnnotation holds the reuse key as given, for a restarted
	// gateway to find the sandbox again.
	sandboxKeyAnnotation = "jetway-ci.dev/sandbox-key"
)

// DefaultSandboxTTL is how long an idle sandbox is kept.
const DefaultSandboxTTL = 10 * time.Minute

// sandboxKey is what checks share a sandbox by.
type sandboxKey struct{ team, image, reuse string }

func (k sandboxKey) hash() string {
	sum := sha256.Sum256([]byte(k.team + "\x00" + k.image + "\x00" + k.reuse))
	return hex.EncodeToString(sum[:])[:16]
}

// sandbox is one sandbox pod. Its fields below ready are the manager's,
// under m.mu.
type sandbox struct {
	key    sandboxKey
	target string
	pod    string
	ready  chan struct{} // closed once the pod was made (or found)
	err    error         // why it could not be made; set before ready closes

	busy     int       // checks running in it
	lastUsed time.Time // when the last check in it ended (or it was made)
	made     time.Time // when this gateway asked for it; zero if adopted
	seen     bool      // the target's watch has shown it
	broken   bool      // never used again; deleted once idle
	sess     *session  // the checks' session, once one ran
}

// sandboxPodName is unique per sandbox: a replacement never meets the pod
// it replaces still terminating.
func sandboxPodName(k sandboxKey) string {
	return "check-" + k.hash()[:10] + "-" + strings.ToLower(rand.Text()[:6])
}

// runName is a check's folder in its sandbox: unique even when a handle
// is used again after the first step was forgotten.
func runName(s *step) string {
	return s.key.handle + "-" + strings.ToLower(rand.Text()[:8])
}

// takeSandbox finds a live sandbox for s, on a target that may run it
// now, and counts s in it; else nil. Called with m.mu held.
func (m *Manager) takeSandbox(s *step, candidates []selection.Candidate) *sandbox {
	k := sandboxKey{s.req.Team, s.req.Image, s.req.ReuseKey}
	for _, sb := range m.sandboxes[k] {
		if sb.broken || !m.usable(sb) || !m.fits(s, sb.target, candidates) {
			continue
		}
		sb.busy++
		m.opts.Metrics.sandboxUsed(true)
		return sb
	}
	return nil
}

// usable looks at a sandbox's pod in its target's watch, marking it broken
// when the pod went or cannot run. Called with m.mu held.
func (m *Manager) usable(sb *sandbox) bool {
	t, err := m.opts.Registry.Target(sb.target)
	if err != nil {
		sb.broken = true
		return false
	}
	p := t.CachedPod(sb.pod)
	switch {
	case p == nil && (sb.seen || !sb.made.IsZero() && m.opts.Now().Sub(sb.made) > appearTimeout):
		sb.broken = true
	case p == nil: // made a moment ago: the watch has not shown it yet
		return true
	case p.DeletionTimestamp != nil || targets.Finished(p):
		sb.broken = true
	default:
		if _, failed := podFailure(p); failed {
			sb.broken = true
		}
		sb.seen = true
	}
	return !sb.broken
}

// fits reports whether target may run s by the placement chain, its
// limits aside: a check in a sandbox adds no pod.
func (m *Manager) fits(s *step, target string, candidates []selection.Candidate) bool {
	for _, c := range candidates {
		if c.Name == target {
			st := selection.Step{Type: s.req.Type, Team: s.req.Team, Tags: s.req.Tags, Platform: s.req.Platform}
			d := selection.Place(st, []selection.Candidate{c}, selection.Options{Chain: m.opts.Placement.Chain(s.req.Type, false), Top: 1})
			return len(d.Order) == 1
		}
	}
	return false
}

// newSandbox records a sandbox to be made on target for s, with s in it.
// Called with m.mu held.
func (m *Manager) newSandbox(s *step, target string) *sandbox {
	k := sandboxKey{s.req.Team, s.req.Image, s.req.ReuseKey}
	now := m.opts.Now()
	sb := &sandbox{key: k, target: target, pod: sandboxPodName(k), ready: make(chan struct{}), busy: 1, made: now, lastUsed: now}
	m.sandboxes[k] = append(m.sandboxes[k], sb)
	m.opts.Metrics.sandboxUsed(false)
	return sb
}

// makeSandbox creates the sandbox's pod and tells the checks waiting for it.
func (r *runner) makeSandbox(ctx context.Context) {
	sb := r.s.sandbox
	pod := buildPod(&r.s.req, r.s.caller, r.t, r.s.snapshot().PlacedAt, r.m.opts.Pod)
	pod.Name = sb.pod
	delete(pod.Labels, HandleLabel)
	pod.Labels[SandboxLabel] = sb.key.hash()
	pod.Annotations = map[string]string{sandboxKeyAnnotation: sb.key.reuse}
	pod.Spec.Containers = pod.Spec.Containers[:1] // checks have no volumes to serve
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := r.t.Core.Pods(r.t.Namespace()).Create(cctx, pod, metav1.CreateOptions{}); err != nil {
		sb.err = fmt.Errorf("create sandbox pod %s: %w", sb.pod, err)
	}
	r.m.mu.Lock()
	sb.broken = sb.err != nil
	r.m.mu.Unlock()
	close(sb.ready)
}

// leaveSandbox ends a check's use of its sandbox: a check that did not end
// by its script's exit (its pod failed, it was aborted or lost) breaks it.
func (m *Manager) leaveSandbox(sb *sandbox, healthy bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb.busy--
	sb.lastUsed = m.opts.Now()
	if !healthy {
		sb.broken = true
	}
	m.wake() // a broken one goes now
}

// tendSandboxes deletes the sandboxes nobody uses that are broken, idle
// past the TTL, or on a target that is landing or retiring (or gone): a
// landing target must not wait ten minutes for them. A stalled target's
// sandboxes stay: its API may be back in a moment.
func (m *Manager) tendSandboxes() {
	now := m.opts.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, list := range m.sandboxes {
		kept := list[:0]
		for _, sb := range list {
			reason := m.expired(sb, now)
			if reason == "" {
				kept = append(kept, sb)
				continue
			}
			if sb.sess != nil {
				sb.sess.close(errors.New("sandbox deleted"))
			}
			m.opts.Metrics.sandboxDeleted(reason)
			m.opts.Logger.Info("check sandbox deleted", "target", sb.target, "pod", sb.pod, "team", k.team, "why", reason)
			m.wg.Go(func() { m.deleteSandbox(sb) })
		}
		if len(kept) == 0 {
			delete(m.sandboxes, k)
		} else {
			m.sandboxes[k] = kept
		}
	}
}

// expired says why a sandbox goes now (broken, idle or target), or ""
// while it stays. Called with m.mu held.
func (m *Manager) expired(sb *sandbox, now time.Time) string {
	switch {
	case sb.busy > 0:
		return ""
	case sb.broken || !m.usable(sb):
		return "broken"
	case now.Sub(sb.lastUsed) > m.opts.SandboxTTL:
		return "idle"
	}
	t, err := m.opts.Registry.Target(sb.target)
	if err != nil {
		return "target"
	}
	switch life, _ := t.Lifecycle(); life.State {
	case targets.StateLanding, targets.StateLanded, targets.StateRetiring, targets.StateRetired:
		return "target"
	}
	return ""
}

// deleteSandbox deletes a sandbox's pod, once it was made.
func (m *Manager) deleteSandbox(sb *sandbox) {
	ctx := m.ctx
	select {
	case <-sb.ready:
	case <-ctx.Done():
		return
	}
	if sb.err != nil {
		return
	}
	t, err := m.opts.Registry.Target(sb.target)
	if err != nil {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = t.Core.Pods(t.Namespace()).Delete(dctx, sb.pod, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		m.opts.Logger.Warn("check sandbox not deleted", "target", sb.target, "pod", sb.pod, "error", err.Error())
	}
}

// adoptSandbox takes up a sandbox pod a restarted gateway finds. Checks
// that ran in it then are not picked up again: their callers ask again.
// Called with m.mu held.
func (m *Manager) adoptSandbox(t *targets.Target, p *corev1.Pod) {
	if len(p.Spec.Containers) == 0 {
		return
	}
	k := sandboxKey{p.Labels[ownership.TeamLabel], p.Spec.Containers[0].Image, p.Annotations[sandboxKeyAnnotation]}
	if k.hash() != p.Labels[SandboxLabel] {
		m.opts.Logger.Warn("sandbox pod not adopted: its labels do not match its key", "target", t.Name(), "pod", p.Name)
		return
	}
	sb := &sandbox{key: k, target: t.Name(), pod: p.Name, ready: make(chan struct{}), seen: true, lastUsed: m.opts.Now()}
	close(sb.ready)
	m.sandboxes[k] = append(m.sandboxes[k], sb)
	m.opts.Logger.Info("check sandbox adopted", "target", t.Name(), "pod", p.Name, "team", k.team)
}
