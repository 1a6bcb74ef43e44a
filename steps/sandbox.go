package steps

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// A check step with a reuse_key runs in a warm sandbox: a pod of the
// check's image kept for checks of the same key (team, image, reuse key)
// on one target, each check in its own folder of the pod (step-agent
// --run). Checks run every minute per resource; a pod per check would be
// most of their cost.
//
// The placer keeps the sandboxes: it alone puts checks in them, so it
// alone may decide one is idle and delete it; a new placer takes the
// sandboxes of the targets it finds over (their owner label names it),
// those jetway sealed alone (ownership.Key): a pod planted with a
// sandbox's labels gets no check, and is counted. A
// check in a sandbox is driven by its own owner, as any step; whether a
// sandbox is in use, or broken, the placer reads from the records of the
// checks placed in it.
const (
	// SandboxLabel marks a sandbox pod, with a hash of its key.
	SandboxLabel = "jetway-ci.dev/sandbox"
	// sandboxKeyAnnotation holds the reuse key as given, for a new placer
	// to find the sandbox again.
	sandboxKeyAnnotation = "jetway-ci.dev/sandbox-key"
)

// DefaultSandboxTTL is how long an idle sandbox is kept.
const DefaultSandboxTTL = 10 * time.Minute

// sandboxKey is what checks share a sandbox by.
type sandboxKey struct{ team, image, reuse string }

func keyOf(sum Summary) sandboxKey { return sandboxKey{sum.Team, sum.Image, sum.ReuseKey} }

func (k sandboxKey) hash() string { return SandboxKeyHash(k.team, k.image, k.reuse) }

// SandboxKeyHash is the SandboxLabel of the sandbox of team's checks of
// image with reuse key reuse.
func SandboxKeyHash(team, image, reuse string) string {
	sum := sha256.Sum256([]byte(team + "\x00" + image + "\x00" + reuse))
	return hex.EncodeToString(sum[:])[:16]
}

// sandboxPodName is unique per sandbox: a replacement never meets the pod
// it replaces still terminating.
func sandboxPodName(k sandboxKey) string {
	return "check-" + k.hash()[:10] + "-" + strings.ToLower(rand.Text()[:6])
}

// runName is a check's folder in its sandbox: unique even when a handle
// is used again after the first step was forgotten.
func runName(handle string) string {
	return handle + "-" + strings.ToLower(rand.Text()[:8])
}

// sandbox is one sandbox pod, as the placer keeps it.
type sandbox struct {
	key      sandboxKey
	target   string
	pod      string
	made     time.Time // when this placer asked for it; zero if found
	seen     bool      // its target's watch has shown it
	lastUsed time.Time // when a check in it last ended (or it was made, or found)
	busy     int       // checks placed in it and not ended
	broken   bool      // never used again; deleted once idle
	deleting bool
	err      error // why it could not be made
}

// sandboxes are the placer's sandboxes, by key. They are the placer's
// loop's, but for what the creations and deletions it starts report
// under mu.
type sandboxes struct {
	p     *placer
	byKey map[sandboxKey][]*sandbox
	// gone are the sandbox pods this placer deleted, until the watch no
	// longer shows them: find takes none up again.
	gone map[string]bool
	// refused are the pods that look like sandboxes but are not jetway's
	// to use, counted once each while the watch shows them, and when they
	// were first refused.
	refused map[string]time.Time
	mu      sync.Mutex
}

func newSandboxes(p *placer) *sandboxes {
	return &sandboxes{p: p, byKey: map[sandboxKey][]*sandbox{}, gone: map[string]bool{}, refused: map[string]time.Time{}}
}

// tend brings the sandboxes up to what the targets and records show:
// sandbox pods found are taken over; each one's checks are counted; one
// a check broke (it ended by a pod failure, an abort, a lost contact) or
// whose pod went is broken; one nobody uses that is broken, idle past the
// TTL or on a target taking no new work is deleted.
func (s *sandboxes) tend(ctx context.Context, snap []targets.Status, recs []*Record, inflight map[string]Placed) {
	now := s.p.opts.Now()
	s.find(ctx, snap)
	byPod := map[string]*sandbox{}
	for _, list := range s.byKey {
		for _, sb := range list {
			sb.busy = 0
			byPod[sb.target+"/"+sb.pod] = sb
		}
	}
	uses := func(pl Placed, end *End) {
		sb := byPod[pl.Target+"/"+pl.Pod]
		if sb == nil || pl.Run == "" {
			return
		}
		if end == nil {
			sb.busy++
			return
		}
		if end.At.After(sb.lastUsed) {
			sb.lastUsed = end.At
		}
		if !healthy(end) {
			sb.broken = true
		}
	}
	for _, r := range recs {
		if pl := r.Status.Placed; pl != nil {
			uses(*pl, r.Status.End)
		}
	}
	for _, pl := range inflight {
		uses(pl, nil)
	}
	states := map[string]targets.State{}
	for _, st := range snap {
		states[st.Name] = st.State
	}
	for k, list := range s.byKey {
		kept := list[:0]
		for _, sb := range list {
			if why := s.expired(sb, states, now); why != "" {
				s.delete(ctx, sb, why)
				continue
			}
			kept = append(kept, sb)
		}
		if len(kept) == 0 {
			delete(s.byKey, k)
		} else {
			s.byKey[k] = kept
		}
	}
}

// find takes up the sandbox pods of the targets that the placer does not
// know: a new placer's, made by the one before.
func (s *sandboxes) find(ctx context.Context, snap []targets.Status) {
	if s.p.opts.Pod.Key.IsZero() {
		return // no seal can be told from none yet
	}
	known := map[string]bool{}
	for _, list := range s.byKey {
		for _, sb := range list {
			known[sb.target+"/"+sb.pod] = true
		}
	}
	for k := range s.gone {
		known[k] = true
	}
	seen := map[string]bool{}
	for _, st := range snap {
		t, err := s.p.opts.Registry.Target(st.Name)
		if err != nil {
			continue
		}
		for _, p := range t.Pods() {
			seen[st.Name+"/"+p.Name] = true
			if p.Labels[SandboxLabel] == "" || known[st.Name+"/"+p.Name] || p.DeletionTimestamp != nil || len(p.Spec.Containers) == 0 {
				continue
			}
			k := sandboxKey{p.Labels[ownership.TeamLabel], p.Spec.Containers[0].Image, p.Annotations[sandboxKeyAnnotation]}
			if k.hash() != p.Labels[SandboxLabel] {
				continue // not one of jetway's: its labels do not match its key
			}
			if why := s.p.opts.Pod.Key.Verdict(st.Name, p); why != "" {
				// It claims to be a team's sandbox, but jetway did not make
				// it so (no seal), or not this very pod (a seal copied onto
				// a pod of a gone sandbox's name, or its maker stopped
				// before it bound it): it gets no check (and no check's
				// source).
				s.refuse(ctx, t, p, k.team, why)
				continue
			}
			sb := &sandbox{key: k, target: st.Name, pod: p.Name, seen: true, lastUsed: s.p.opts.Now()}
			s.byKey[k] = append(s.byKey[k], sb)
			if p.Labels[ownership.OwnerLabel] != s.p.me {
				s.p.wg.Go(func() { s.own(ctx, t, p.Name) })
			}
			s.p.opts.Logger.Info("check sandbox taken over", "target", st.Name, "pod", p.Name, "team", k.team)
		}
	}
	for k := range s.gone {
		if !seen[k] {
			delete(s.gone, k)
		}
	}
	for k := range s.refused {
		if !seen[k] {
			delete(s.refused, k)
		}
	}
}

// refuse counts and logs, once, a pod with a sandbox's labels that is not
// jetway's to use (why: ownership.Unsealed or Unbound). One that is
// sealed but still not bound appearTimeout after it was first refused
// (its maker had that long to bind it) is deleted: sealed, it is jetway's
// to delete, and no check ever ran in it.
func (s *sandboxes) refuse(ctx context.Context, t *targets.Target, p *corev1.Pod, team, why string) {
	key := t.Name() + "/" + p.Name
	since, ok := s.refused[key]
	if !ok {
		since = s.p.opts.Now()
		s.refused[key] = since
		s.p.opts.Metrics.rejectedPod(why)
		s.p.opts.Logger.Warn("pod refused as a check sandbox: it has a sandbox's labels but jetway did not make it",
			"target", t.Name(), "pod", p.Name, "uid", string(p.UID), "team", team, "why", why)
	}
	if why == ownership.Unbound && s.p.opts.Now().Sub(since) >= appearTimeout && !s.gone[key] {
		s.gone[key] = true
		s.p.wg.Go(func() {
			if err := s.p.deleteUnbound(ctx, t, p); err != nil && ctx.Err() == nil {
				s.p.opts.Logger.Warn("unbound check sandbox not deleted", "target", t.Name(), "pod", p.Name, "error", err.Error())
			}
		})
	}
}

// own makes a sandbox pod the placer's: its owner label names it.
func (s *sandboxes) own(ctx context.Context, t *targets.Target, pod string) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{ownership.OwnerLabel: s.p.me}}})
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := t.Core.Pods(t.Namespace()).Patch(pctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && ctx.Err() == nil {
		s.p.opts.Logger.Warn("check sandbox's owner not written", "target", t.Name(), "pod", pod, "error", err.Error())
	}
}

// expired says why a sandbox goes now (broken, idle or target), or ""
// while it stays.
func (s *sandboxes) expired(sb *sandbox, states map[string]targets.State, now time.Time) string {
	switch {
	case sb.busy > 0:
		return ""
	case sb.broken || !s.usable(sb):
		return "broken"
	case now.Sub(sb.lastUsed) > s.p.opts.SandboxTTL:
		return "idle"
	}
	switch states[sb.target] {
	case targets.StateLanding, targets.StateLanded, targets.StateRetiring, targets.StateRetired, "":
		return "target"
	}
	return ""
}

// usable looks at a sandbox's pod in its target's watch, marking it broken
// when the pod went or cannot run.
func (s *sandboxes) usable(sb *sandbox) bool {
	s.mu.Lock()
	failed := sb.err != nil
	s.mu.Unlock()
	t, err := s.p.opts.Registry.Target(sb.target)
	if err != nil || failed {
		sb.broken = true
		return false
	}
	p := t.CachedPod(sb.pod)
	switch {
	case p == nil && (sb.seen || !sb.made.IsZero() && s.p.opts.Now().Sub(sb.made) > appearTimeout):
		sb.broken = true
	case p == nil: // made a moment ago: the watch has not shown it yet
		return true
	case p.DeletionTimestamp != nil || targets.Finished(p):
		sb.broken = true
	default:
		if _, failed := steppod.PodFailure(p); failed {
			sb.broken = true
		}
		sb.seen = true
	}
	return !sb.broken
}

// take finds a live sandbox for a check, on a target whose placement
// rules take it (not its limits: a check in a sandbox adds no pod), and
// counts the check in it; else nil.
func (s *sandboxes) take(sum Summary, cands map[string]selection.Candidate) *sandbox {
	for _, sb := range s.byKey[keyOf(sum)] {
		if sb.broken || sb.deleting || !s.usable(sb) {
			continue
		}
		c, ok := cands[sb.target]
		if !ok {
			continue
		}
		d := selection.Place(stepOf(sum), []selection.Candidate{c},
			selection.Options{Chain: s.p.opts.Placement.Chain(sum.Type, false), Top: 1})
		if len(d.Order) == 1 {
			sb.busy++
			s.p.opts.Metrics.sandboxUsed(true)
			return sb
		}
	}
	return nil
}

// make starts a new sandbox on target for a check, with the check in it.
func (s *sandboxes) make(sum Summary, target string) *sandbox {
	k := keyOf(sum)
	now := s.p.opts.Now()
	sb := &sandbox{key: k, target: target, pod: sandboxPodName(k), busy: 1, made: now, lastUsed: now}
	s.byKey[k] = append(s.byKey[k], sb)
	s.p.opts.Metrics.sandboxUsed(false)
	ctx := s.p.leadCtx
	s.p.wg.Go(func() {
		err := s.create(ctx, sum, sb)
		if err != nil && ctx.Err() == nil {
			s.p.opts.Logger.Warn("check sandbox not made", "target", target, "pod", sb.pod, "error", err.Error())
		}
		s.mu.Lock()
		sb.err = err
		s.mu.Unlock()
		s.p.wake()
	})
	return sb
}

// create makes a sandbox's pod, and binds it (ownership.Bind): a step pod
// of the check's image, one container, no volume sidecar (checks have no
// volumes), owned by this placer.
func (s *sandboxes) create(ctx context.Context, sum Summary, sb *sandbox) error {
	t, err := s.p.opts.Registry.Target(sb.target)
	if err != nil {
		return err
	}
	if err := awaitKey(ctx, s.p.opts.Pod.Key); err != nil {
		return err
	}
	pod := buildPod(&sum, s.p.me, t, Placed{Target: sb.target, Pod: sb.pod}, s.p.opts.Pod)
	delete(pod.Labels, HandleLabel)
	pod.Labels[SandboxLabel] = sb.key.hash()
	pod.Annotations[sandboxKeyAnnotation] = sb.key.reuse
	pod.Spec.Containers = pod.Spec.Containers[:1]
	pods := t.Core.Pods(t.Namespace())
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	created, err := pods.Create(cctx, pod, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return err
	}
	_, err = ownership.Bind(ctx, pods, s.p.opts.Pod.Key, sb.target, created)
	return err
}

// delete deletes a sandbox's pod, once made.
func (s *sandboxes) delete(ctx context.Context, sb *sandbox, why string) {
	p := s.p
	sb.deleting = true
	s.gone[sb.target+"/"+sb.pod] = true
	p.opts.Metrics.sandboxDeleted(why)
	p.opts.Logger.Info("check sandbox deleted", "target", sb.target, "pod", sb.pod, "team", sb.key.team, "why", why)
	p.sessions.close(sb.target, sb.pod)
	t, err := p.opts.Registry.Target(sb.target)
	if err != nil {
		return
	}
	p.wg.Go(func() {
		if err := p.deletePod(ctx, t, sb.pod); err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			p.opts.Logger.Warn("check sandbox not deleted", "target", sb.target, "pod", sb.pod, "error", err.Error())
		}
	})
}

// sandboxPod reports whether p is a check sandbox's pod.
func sandboxPod(p *corev1.Pod) bool { return p.Labels[SandboxLabel] != "" }
