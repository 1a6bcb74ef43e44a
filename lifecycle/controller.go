// Package lifecycle lands, retires and prunes targets and collects their
// garbage. An operator's decision is recorded in the target cluster itself
// (a labelled ConfigMap per target, written with optimistic concurrency),
// so it survives restarts and every gateway replica reads the same state;
// whatever changes the cluster (landing -> landed, retiring, garbage
// collection) runs under a per-target Lease, so one replica acts at a time.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/targets"
)

// Targets is what the controller reads of the registry: each target's
// clients and cache, and the replica-local prune it falls back to.
type Targets interface {
	Target(name string) (*targets.Target, error)
	Prunable(name string) (t *targets.Target, reachable bool, err error)
	Prune(name string) error
	Unprune(name string)
}

// Options configure a Controller.
type Options struct {
	// Identity names this replica in Leases.
	Identity string
	Registry Targets
	// GCGrace is how long a finished step pod stays before it is deleted
	// without a sync.
	GCGrace time.Duration
	// Owned reports whether a step pod has an owner that collects it
	// itself (the step engine's live owner, which deletes its step's pod
	// gc-grace after the step's end): garbage collection leaves those
	// alone. Nil: none has.
	Owned func(p *corev1.Pod) bool
	// AwaitTimeout bounds how long a decision waits for the target's cache
	// to show it, so the next list does; default 5s.
	AwaitTimeout time.Duration
	// Claims names the PersistentVolumeClaims jetway may have made in a
	// target's namespace (its Concourse volume holder's, where it keeps
	// its volumes on one), deleted when it is retired. Nil: none.
	Claims  func(t *targets.Target) []string
	Logger  *slog.Logger
	Metrics *Metrics
	Now     func() time.Time
}

// Controller drives the targets' lifecycle. The registry calls Reconcile
// after each health check; the API calls Land, Retire, Resume, Prune and
// Sync. It keeps nothing per target: each target's record and step pods
// come from the target's watch, and decisions go to its cluster.
type Controller struct {
	opts Options
}

// New builds a Controller.
func New(opts Options) *Controller {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.AwaitTimeout <= 0 {
		opts.AwaitTimeout = 5 * time.Second
	}
	return &Controller{opts: opts}
}

func (c *Controller) kubeByName(name string) (*kube, error) {
	t, err := c.opts.Registry.Target(name)
	if err != nil {
		return nil, err
	}
	return newKube(t), nil
}

// Reconcile advances the target's recorded lifecycle, as its watch shows
// it: a landing target whose step pods are all finished becomes landed; a
// retiring one is cleaned up and retired; a retired or pruned one whose
// kubeconfig changed comes back as new; finished step pods older than
// GCGrace go. It reads nothing from the API server unless it acts, and
// does nothing for a target that failed its check or whose cache has not
// listed yet.
func (c *Controller) Reconcile(ctx context.Context, t *targets.Target, h targets.Health) error {
	life, listed := t.Lifecycle()
	if !h.OK() || !listed {
		return nil
	}
	k := newKube(t)
	log := c.opts.Logger.With("target", t.Name())
	err := c.reconcile(ctx, k, life, log)
	if errors.Is(err, ErrBusy) || ctx.Err() != nil {
		return nil
	}
	if err != nil {
		log.Warn("lifecycle reconcile failed", "error", err.Error())
	}
	return err
}

func (c *Controller) reconcile(ctx context.Context, k *kube, life targets.Lifecycle, log *slog.Logger) error {
	hash := k.t.Config.Hash()
	switch {
	case life.State == targets.StateRetired && life.ConfigHash != hash:
		log.Info("retired target has a new kubeconfig; it comes back as new")
		return k.forget(ctx)
	case life.State == targets.StateRetired:
		return nil
	case life.PrunedHash != "" && life.PrunedHash != hash:
		log.Info("pruned target has a new kubeconfig; it comes back")
		_, _, err := k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
			stale := cur.PrunedHash != "" && cur.PrunedHash != hash
			cur.PrunedHash = ""
			return cur, stale
		})
		return err
	}
	pods := k.t.Pods()
	released := !life.Released.IsZero()
	switch {
	case life.State == targets.StateLanding && len(unfinished(pods, released)) == 0:
		return c.withLease(ctx, k, c.land(k))
	case life.State == targets.StateRetiring && len(unfinished(pods, released)) == 0:
		return c.withLease(ctx, k, c.retire(k, log))
	}
	if stale := c.stale(pods); len(stale) > 0 {
		return c.withLease(ctx, k, func(ctx context.Context) (bool, error) {
			_, err := c.deletePods(ctx, k, stale, "gc", log)
			return false, err
		})
	}
	return nil
}

// land turns landing into landed, unless another replica already did.
func (c *Controller) land(k *kube) action {
	return func(ctx context.Context) (bool, error) {
		cur, err := k.read(ctx)
		if err != nil {
			return false, err
		}
		pods, err := k.ownedPods(ctx)
		if err != nil {
			return false, err
		}
		if len(unfinished(pods, !cur.Released.IsZero())) > 0 {
			return false, nil
		}
		var landed bool
		_, _, err = k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
			landed = cur.State == targets.StateLanding
			cur.State, cur.Since = targets.StateLanded, c.opts.Now() // a prune stays
			return cur, landed
		})
		if landed && err == nil {
			c.opts.Metrics.acted("landed")
			c.opts.Logger.Info("target landed", "target", k.t.Name())
		}
		return false, err
	}
}

// retire deletes every object the target owns but its record, verifies by
// listing that nothing is left, then records it retired.
func (c *Controller) retire(k *kube, log *slog.Logger) action {
	return func(ctx context.Context) (bool, error) {
		cur, err := k.read(ctx)
		if err != nil {
			return false, err
		}
		if cur.State == targets.StateRetired {
			return true, nil // another replica finished; drop the lease we took
		}
		if cur.State != targets.StateRetiring {
			return false, nil
		}
		pods, err := k.ownedPods(ctx)
		if err != nil {
			return false, err
		}
		if len(unfinished(pods, !cur.Released.IsZero())) > 0 {
			return false, nil
		}
		if _, err := c.deletePods(ctx, k, pods, "retire", log); err != nil {
			return false, err
		}
		if err := c.deleteOwned(ctx, k); err != nil {
			return false, err
		}
		if err := c.deleteClaims(ctx, k); err != nil {
			return false, err
		}
		if left, err := c.leftovers(ctx, k); err != nil || len(left) > 0 {
			return false, errors.Join(err, fmt.Errorf("retire %s: still present: %v", k.t.Name(), left))
		}
		if _, _, err := k.update(ctx, func(targets.Lifecycle) (targets.Lifecycle, bool) {
			return targets.Lifecycle{State: targets.StateRetired, Since: c.opts.Now(), ConfigHash: k.t.Config.Hash()}, true
		}); err != nil {
			return false, err
		}
		c.opts.Metrics.acted("retired")
		log.Info("target retired")
		return true, nil
	}
}

// deleteOwned deletes the target's ConfigMaps and Leases but its record
// and the lease being held.
func (c *Controller) deleteOwned(ctx context.Context, k *kube) error {
	cms, err := k.core.ConfigMaps(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.sel})
	if err != nil {
		return err
	}
	for _, cm := range cms.Items {
		if cm.Name != k.name {
			if err := k.core.ConfigMaps(k.ns).Delete(ctx, cm.Name, uidPrecondition(cm.UID)); !gone(err) && err != nil {
				return err
			}
		}
	}
	leases, err := k.leases.Leases(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.sel})
	if err != nil {
		return err
	}
	for _, l := range leases.Items {
		if l.Name != k.name {
			if err := k.leases.Leases(k.ns).Delete(ctx, l.Name, uidPrecondition(l.UID)); !gone(err) && err != nil {
				return err
			}
		}
	}
	return nil
}

// leftovers lists what the target still owns besides its record and lease,
// waiting briefly for deleted pods to go.
func (c *Controller) leftovers(ctx context.Context, k *kube) ([]string, error) {
	var left []string
	for attempt := 0; attempt < 50; attempt++ {
		left = nil
		pods, err := k.ownedPods(ctx)
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			left = append(left, "pod/"+p.Name)
		}
		cms, err := k.core.ConfigMaps(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.sel})
		if err != nil {
			return nil, err
		}
		for _, cm := range cms.Items {
			if cm.Name != k.name {
				left = append(left, "configmap/"+cm.Name)
			}
		}
		leases, err := k.leases.Leases(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.sel})
		if err != nil {
			return nil, err
		}
		for _, l := range leases.Items {
			if l.Name != k.name {
				left = append(left, "lease/"+l.Name)
			}
		}
		claims, err := c.claimsLeft(ctx, k)
		if err != nil {
			return nil, err
		}
		left = append(left, claims...)
		if len(left) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return left, nil
}

// stale lists finished step pods older than GCGrace.
func (c *Controller) stale(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if c.opts.Owned != nil && c.opts.Owned(p) {
			continue
		}
		if targets.Finished(p) && p.DeletionTimestamp == nil && c.opts.Now().Sub(finishedAt(p)) > c.opts.GCGrace {
			out = append(out, p)
		}
	}
	return out
}

// deletePods deletes the listed step pods and returns the names of those
// it deleted. Each delete is conditional on the UID listed: a pod deleted
// and made again under the same name meanwhile (jetway's or not) stays.
func (c *Controller) deletePods(ctx context.Context, k *kube, pods []*corev1.Pod, reason string, log *slog.Logger) ([]string, error) {
	var deleted []string
	for _, p := range pods {
		name := p.Name
		err := k.core.Pods(k.ns).Delete(ctx, name, uidPrecondition(p.UID))
		if gone(err) {
			if apierrors.IsConflict(err) {
				log.Info("step pod was replaced since it was listed; left alone", "pod", name)
			}
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("delete step pod %s/%s: %w", k.ns, name, err)
		}
		deleted = append(deleted, name)
		c.opts.Metrics.deleted(reason)
		log.Info("deleted step pod", "pod", name, "reason", reason)
	}
	return deleted, nil
}

func uidPrecondition(uid types.UID) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
}

// gone reports whether a conditional delete found the object gone, or
// replaced by another of the same name (its UID precondition failed).
func gone(err error) bool { return apierrors.IsNotFound(err) || apierrors.IsConflict(err) }

// unfinished names the step pods that hold a landing target: unfinished
// ones and those being deleted, but, once a web node released the
// target's worker, the pods of the containers it keeps.
func unfinished(pods []*corev1.Pod, released bool) []string {
	var out []string
	for _, p := range pods {
		if targets.IsVolumeHolder(p) {
			continue // deleted with the rest once the steps ended
		}
		if released && targets.IsConcourseContainer(p) {
			continue // kept by the web node for its checks and failed builds, which no longer hold the target
		}
		if !targets.Finished(p) || p.DeletionTimestamp != nil {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}
