package concourse

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"code.cloudfoundry.org/garden"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// A volume holder keeps its volumes in an emptyDir, or, where the
// target's steps.volumeHolder.storage (or the gateway's
// volume-holder-storage-class) says so, on a PersistentVolumeClaim of its
// own (steppod.HolderClaim), made before the holder's first pod and
// mounted by every pod made after it: a holder pod deleted, evicted or
// drained is made again on the same claim, and its volumes are still
// there. Only an emptyDir's holder that goes is a worker without volumes;
// a claim's is away until its new pod runs, and the sweep reports nothing
// meanwhile rather than tell the web node its volumes are gone.

// awayHolder: cluster target's volume holder keeps its volumes on a claim,
// and has no pod (deleted, or being deleted): the volumes wait on the
// claim, and the next create or sweep makes a new pod. It is not
// errNoHolder: a request for a volume fails, naming the holder, rather
// than find none.
type awayHolder struct{ namespace, name string }

func (e *awayHolder) Error() string {
	return fmt.Sprintf("the volume holder pod %s/%s is not running: it is made again at the next volume create or sweep, "+
		"and the volumes on its claim %s/%s wait for it", e.namespace, e.name, e.namespace, e.name)
}

// listWithout is what List answers when target's volumes cannot be
// listed (err): nil (no volume) where the holder has none, an error
// (nothing reported, so nothing marked missing) where its volumes are
// away on a claim. A holder that ended, or whose claim waits without a
// pod, is made again now rather than at the web node's next create.
func (h *Holder) listWithout(ctx context.Context, target string, err error) error {
	var unbound *unboundHolder
	var lost *lostHolder
	var away *awayHolder
	switch {
	case errors.As(err, &lost):
		if t, terr := h.Targets.Target(target); terr == nil {
			if err := h.replaceLost(ctx, t, lost); err != nil {
				h.logger().Warn("volume holder not replaced; the next sweep or create tries again", "target", target, "error", err.Error())
			}
		}
		if lost.kept() {
			return fmt.Errorf("%w: its volumes are reported once the new one runs", lost)
		}
		return nil // its volumes are gone: none is reported
	case errors.As(err, &away):
		t, terr := h.Targets.Target(target)
		if terr != nil {
			return terr
		}
		return h.remakeAway(ctx, t, away)
	case errors.As(err, &unbound) && steppod.HolderClaimName(unbound.pod) != "":
		return fmt.Errorf("%w: its volumes are on its claim, reported once it is bound", unbound)
	case errors.Is(err, errNoHolder), errors.As(err, &unbound):
		// A pod not bound to jetway's create (made a moment ago and being
		// bound, or planted) never got a request: none of the web node's
		// volumes is in it.
		return nil
	}
	return err
}

// remakeAway answers what List tells the web node of t's holder whose
// pod is gone while it keeps its volumes on a claim (away): nil when
// there is no claim either (no volume was ever made, or they went with
// an emptyDir holder), else away (the volumes are there, not listed
// yet), having made a new pod on the claim.
func (h *Holder) remakeAway(ctx context.Context, t *targets.Target, away *awayHolder) error {
	exists, err := h.claimExists(ctx, t, away.name)
	if err != nil || !exists {
		return err
	}
	if err := h.makeAgain(ctx, t, away); err != nil {
		return err
	}
	return away
}

// makeAway makes the pod of t's holder that keeps its volumes on a claim
// and has none (away): its first, or a new one on the claim it had.
func (h *Holder) makeAway(ctx context.Context, t *targets.Target, away *awayHolder) error {
	exists, err := h.claimExists(ctx, t, away.name)
	if err != nil {
		return err
	}
	if exists {
		return h.makeAgain(ctx, t, away)
	}
	_, err = h.makeHolder(ctx, t)
	return err
}

// makeAgain makes a new pod for t's holder on the claim it had, logged
// and counted when this gateway made it.
func (h *Holder) makeAgain(ctx context.Context, t *targets.Target, away *awayHolder) error {
	made, err := h.makeHolder(ctx, t)
	if made {
		h.logger().Warn("volume holder pod made again: it was gone; the volumes on its claim wait for it",
			"target", t.Name(), "pod", away.name, "claim", away.name)
		h.Metrics.holderReplaced("deleted", volumesKept)
	}
	return err
}

// claimExists reports whether t has the holder's claim name.
func (h *Holder) claimExists(ctx context.Context, t *targets.Target, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	_, err := t.Core.PersistentVolumeClaims(t.Namespace()).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("the volume holder's claim %s/%s: %w", t.Namespace(), name, err)
	}
	return true, nil
}

// ensureClaim makes t's holder's claim if it keeps its volumes on one and
// there is none, and returns it (nil for an emptyDir). A claim of that
// name jetway did not seal is refused, naming it; one whose class or size
// differs from the setting is used as it is (its volumes are there),
// with a warning saying how to take the new one.
func (h *Holder) ensureClaim(ctx context.Context, t *targets.Target, opts steppod.Options) (*corev1.PersistentVolumeClaim, error) {
	want, err := steppod.HolderClaim(t, opts)
	if err != nil || want == nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	claims := t.Core.PersistentVolumeClaims(t.Namespace())
	c, err := claims.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c, err = claims.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			h.logger().Info("volume holder claim made", "target", t.Name(), "claim", want.Name,
				"class", *want.Spec.StorageClassName, "size", sizeOf(want))
			return c, nil
		}
		if apierrors.IsAlreadyExists(err) {
			c, err = claims.Get(ctx, want.Name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the volume holder's claim %s/%s: %w", t.Namespace(), want.Name, err)
	}
	switch {
	case !opts.Key.Sealed(t.Name(), c):
		return nil, fmt.Errorf("the PersistentVolumeClaim %s/%s carries the volume holder's name but jetway did not make it: "+
			"left alone, and no volume is kept on this worker until it is gone: %w", t.Namespace(), c.Name, errNoHolder)
	case c.DeletionTimestamp != nil:
		return nil, fmt.Errorf("the volume holder's claim %s/%s is being deleted: a new holder is made once it is gone", t.Namespace(), c.Name)
	}
	wantSize, haveSize := steppod.ClaimSize(want), steppod.ClaimSize(c)
	if haveClass := ptrString(c.Spec.StorageClassName); haveClass != *want.Spec.StorageClassName || haveSize.Cmp(wantSize) != 0 {
		h.logger().Warn("volume holder claim used as it is: its class or size differs from the setting; "+
			"delete the claim, and the volumes on it, to take the new one",
			"target", t.Name(), "claim", c.Name, "class", haveClass, "size", haveSize.String(),
			"setting_class", *want.Spec.StorageClassName, "setting_size", wantSize.String())
	}
	return c, nil
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// replaceChanged replaces t's running holder pod name when where it keeps
// its volumes changed kind: an emptyDir's, now that the setting names a
// claim (its volumes are lost: the sweep reports them missing), or a
// claim's, now that it names none (the claim is deleted, with the
// volumes on it, once the pod is gone). A claim of another class or size
// is no change of kind: ensureClaim keeps it.
func (h *Holder) replaceChanged(ctx context.Context, t *targets.Target, opts steppod.Options, name string) error {
	p := t.CachedPod(name)
	if p == nil {
		return nil
	}
	class, _ := steppod.HolderStorage(t, opts)
	had := steppod.HolderClaimName(p)
	if (class != "") == (had != "") {
		return nil
	}
	if had == "" {
		h.logger().Warn("volume holder pod replaced: its storage is now a claim; the volumes in its emptyDir are gone, the web node makes them again",
			"target", t.Name(), "pod", name, "class", class)
		h.Metrics.holderReplaced("storage", volumesLost)
		return h.remake(ctx, t, p)
	}
	h.logger().Warn("volume holder pod replaced: its storage is now an emptyDir; its claim is deleted with the volumes on it, the web node makes them again",
		"target", t.Name(), "pod", name, "claim", had)
	h.Metrics.holderReplaced("storage", volumesLost)
	if err := h.remake(ctx, t, p); err != nil {
		return err
	}
	return deleteClaim(ctx, t, opts, had)
}

// deleteClaim deletes t's holder claim name if jetway sealed it; one
// already gone is no error.
func deleteClaim(ctx context.Context, t *targets.Target, opts steppod.Options, name string) error {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	claims := t.Core.PersistentVolumeClaims(t.Namespace())
	c, err := claims.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the volume holder's claim %s/%s: %w", t.Namespace(), name, err)
	}
	if !opts.Key.Sealed(t.Name(), c) {
		return nil // not jetway's: left alone
	}
	uid := c.UID
	err = claims.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete the volume holder's claim %s/%s: %w", t.Namespace(), name, err)
	}
	return nil
}

// whyNotRunning says why t's holder pod name does not run, for the error
// of a holder that did not come up in time: its phase, what the
// scheduler or its container said, and its claim's phase when it has
// one (a claim no volume is bound to keeps it Pending).
func (h *Holder) whyNotRunning(ctx context.Context, t *targets.Target, name string) string {
	p := t.CachedPod(name)
	if p == nil {
		return "not listed"
	}
	why := []string{string(p.Status.Phase)}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			why = append(why, fmt.Sprintf("%s: %s", c.Type, c.Message))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			why = append(why, fmt.Sprintf("container %s waits: %s %s", cs.Name, w.Reason, w.Message))
		}
	}
	claim := steppod.HolderClaimName(p)
	if claim == "" {
		return strings.Join(why, "; ")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holderCall)
	defer cancel()
	c, err := t.Core.PersistentVolumeClaims(t.Namespace()).Get(ctx, claim, metav1.GetOptions{})
	switch {
	case err != nil:
		why = append(why, fmt.Sprintf("its claim %s: %v", claim, err))
	case c.Status.Phase != corev1.ClaimBound:
		why = append(why, fmt.Sprintf("its claim %s/%s is %s: no volume is bound to it; does StorageClass %q exist, and can it provide "+
			"%s ReadWriteOnce on a node the holder may run on? (kubectl describe pvc %s)",
			t.Namespace(), claim, c.Status.Phase, ptrString(c.Spec.StorageClassName), sizeOf(c), claim))
	default:
		why = append(why, fmt.Sprintf("its claim %s is bound to %s", claim, c.Spec.VolumeName))
	}
	return strings.Join(why, "; ")
}

func sizeOf(c *corev1.PersistentVolumeClaim) string {
	q := steppod.ClaimSize(c)
	return q.String()
}

// wentWithHolder is the error of ct's mount bm whose volume its holder
// does not have (err, of Holder.Volume, is errVolumeNotFound) though its
// source is a path of a holder's volume: it went with the holder
// (deleted, evicted, lost), and the step fails naming it rather than run
// on, or end, without it. nil for any other err or mount.
func (c *Containers) wentWithHolder(ct *Container, bm garden.BindMount, err error) error {
	if !errors.Is(err, errVolumeNotFound) || !heldPath(bm.SrcPath) {
		return nil
	}
	return fmt.Errorf("container %s: volume %s (%s) is not in target %s's volume holder pod %s: it went with "+
		"the holder (deleted, evicted or lost); the web node makes it again: %w",
		ct.Handle(), path.Base(bm.SrcPath), bm.DstPath, ct.Target, steppod.HolderName(c.Pod().Installation), err)
}

// heldPath reports whether a bind mount's source is a path of a volume in
// a holder (where the holder's volumes are, in its pod), not one of the
// web node's worker host: a mount of one the holder no longer has is a
// volume that went with it.
func heldPath(src string) bool {
	for _, root := range []string{stepagent.Root, stepagent.LegacyRoot} {
		dir := root + "/" + stepagent.VolumesDir
		if strings.HasPrefix(path.Clean(src)+"/", dir+"/") && path.Clean(src) != dir {
			return true
		}
	}
	return false
}
