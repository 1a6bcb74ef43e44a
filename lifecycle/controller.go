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
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/targets"
)

// Options configure a Controller.
type Options struct {
	// Installation names this jetway installation in ownership labels and
	// object names; two installations never touch each other's objects.
	Installation string
	// Identity names this replica in Leases.
	Identity string
	Registry *targets.Registry
	// LandTimeout is how long landing may take before the API and logs name
	// the step pods still holding the target.
	LandTimeout time.Duration
	// GCGrace is how long a finished step pod stays before it is deleted
	// without a sync.
	GCGrace time.Duration
	Logger  *slog.Logger
	Metrics *Metrics
	Now     func() time.Time
}

// Controller drives the targets' lifecycle. The registry calls Reconcile
// after each health check; the API calls Land, Retire, Prune and Sync.
type Controller struct {
	opts Options

	mu      sync.Mutex
	clients map[string]*kube // by target name, for the current config
	overdue map[string]bool  // targets whose overdue landing was logged
}

// New builds a Controller.
func New(opts Options) *Controller {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Controller{opts: opts, clients: map[string]*kube{}, overdue: map[string]bool{}}
}

func (c *Controller) kube(cfg *targets.Config) (*kube, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k, ok := c.clients[cfg.Name]; ok && k.cfg == cfg {
		return k, nil
	}
	k, err := newKube(cfg, c.opts.Installation)
	if err != nil {
		return nil, err
	}
	c.clients[cfg.Name] = k
	return k, nil
}

func (c *Controller) kubeByName(name string) (*kube, error) {
	cfg, err := c.opts.Registry.Config(name)
	if err != nil {
		return nil, err
	}
	return c.kube(cfg)
}

// Reconcile reads the target's recorded lifecycle and advances it: a
// landing target whose step pods are all finished becomes landed; a
// retiring one is cleaned up and retired; a retired one whose kubeconfig
// changed comes back as new; finished step pods older than GCGrace go.
// Unreachable targets keep what was last read.
func (c *Controller) Reconcile(ctx context.Context, cfg *targets.Config, h targets.Health) {
	if !h.OK() {
		return
	}
	log := c.opts.Logger.With("target", cfg.Name)
	if err := c.reconcile(ctx, cfg, log); err != nil && !errors.Is(err, ErrBusy) && ctx.Err() == nil {
		c.opts.Registry.SetLifecycleError(cfg.Name, cfg, err)
		log.Warn("lifecycle reconcile failed", "error", err.Error())
	}
}

func (c *Controller) reconcile(ctx context.Context, cfg *targets.Config, log *slog.Logger) error {
	k, err := c.kube(cfg)
	if err != nil {
		return err
	}
	life, err := k.read(ctx)
	if err != nil {
		return err
	}
	if life.State == targets.StateRetired {
		if life.ConfigHash != cfg.Hash() {
			log.Info("retired target has a new kubeconfig; it comes back as new")
			if err := k.forget(ctx); err != nil {
				return err
			}
			life = targets.Lifecycle{}
		}
		c.opts.Registry.SetLifecycle(cfg.Name, cfg, life)
		return nil
	}
	if life.PrunedHash != "" && life.PrunedHash != cfg.Hash() {
		log.Info("pruned target has a new kubeconfig; it comes back")
		if life, err = k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
			stale := cur.PrunedHash != "" && cur.PrunedHash != cfg.Hash()
			cur.PrunedHash = ""
			return cur, stale
		}); err != nil {
			return err
		}
	}
	pods, err := k.ownedPods(ctx)
	if err != nil {
		return err
	}
	holding := unfinished(pods)
	var act action
	switch {
	case life.State == targets.StateLanding && len(holding) == 0:
		act = c.land(k)
	case life.State == targets.StateRetiring && len(holding) == 0:
		act = c.retire(k, log)
	}
	if act != nil {
		if err := c.withLease(ctx, k, act); err != nil {
			return err
		}
		if life, err = k.read(ctx); err != nil {
			return err
		}
	}
	if life.State == targets.StateLanding || life.State == targets.StateRetiring {
		life.Holding = holding
	}
	if life.State == targets.StateLanding {
		c.checkOverdue(cfg.Name, &life, log)
	}
	c.opts.Registry.SetLifecycle(cfg.Name, cfg, life)
	if life.State == targets.StateRetired {
		return nil
	}
	if stale := c.stale(pods); len(stale) > 0 {
		return c.withLease(ctx, k, func(ctx context.Context) (bool, error) {
			_, err := c.deletePods(ctx, k, stale, "gc", log)
			return false, err
		})
	}
	return nil
}

func (c *Controller) checkOverdue(name string, life *targets.Lifecycle, log *slog.Logger) {
	life.Overdue = c.opts.LandTimeout > 0 && c.opts.Now().Sub(life.Since) > c.opts.LandTimeout
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case life.Overdue && !c.overdue[name]:
		c.overdue[name] = true
		log.Warn("landing is taking longer than the land timeout", "since", life.Since, "pods", life.Holding)
	case !life.Overdue:
		delete(c.overdue, name)
	}
}

// land turns landing into landed, unless another replica already did.
func (c *Controller) land(k *kube) action {
	return func(ctx context.Context) (bool, error) {
		pods, err := k.ownedPods(ctx)
		if err != nil {
			return false, err
		}
		if len(unfinished(pods)) > 0 {
			return false, nil
		}
		var landed bool
		_, err = k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
			landed = cur.State == targets.StateLanding
			cur.State, cur.Since = targets.StateLanded, c.opts.Now() // a prune stays
			return cur, landed
		})
		if landed && err == nil {
			c.opts.Metrics.acted("landed")
			c.opts.Logger.Info("target landed", "target", k.cfg.Name)
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
		if len(unfinished(pods)) > 0 {
			return false, nil
		}
		if _, err := c.deletePods(ctx, k, pods, "retire", log); err != nil {
			return false, err
		}
		if err := c.deleteOwned(ctx, k); err != nil {
			return false, err
		}
		if left, err := c.leftovers(ctx, k); err != nil || len(left) > 0 {
			return false, errors.Join(err, fmt.Errorf("retire %s: still present: %v", k.cfg.Name, left))
		}
		if _, err := k.update(ctx, func(targets.Lifecycle) (targets.Lifecycle, bool) {
			return targets.Lifecycle{State: targets.StateRetired, Since: c.opts.Now(), ConfigHash: k.cfg.Hash()}, true
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
func (c *Controller) stale(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for i := range pods {
		p := &pods[i]
		if finished(p) && p.DeletionTimestamp == nil && c.opts.Now().Sub(finishedAt(p)) > c.opts.GCGrace {
			out = append(out, *p)
		}
	}
	return out
}

// deletePods deletes the listed step pods and returns the names of those
// it deleted. Each delete is conditional on the UID listed: a pod deleted
// and made again under the same name meanwhile (jetway's or not) stays.
func (c *Controller) deletePods(ctx context.Context, k *kube, pods []corev1.Pod, reason string, log *slog.Logger) ([]string, error) {
	var deleted []string
	for i := range pods {
		name := pods[i].Name
		err := k.core.Pods(k.ns).Delete(ctx, name, uidPrecondition(pods[i].UID))
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

func unfinished(pods []corev1.Pod) []string {
	var out []string
	for i := range pods {
		if !finished(&pods[i]) || pods[i].DeletionTimestamp != nil {
			out = append(out, pods[i].Name)
		}
	}
	slices.Sort(out)
	return out
}

// Forget drops the clients and notes kept for a target that left the
// targets directory.
func (c *Controller) Forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.clients, name)
	delete(c.overdue, name)
}
