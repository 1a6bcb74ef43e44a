package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/jetway-ci/jetway/targets"
)

// Land stops new work on a target: any state but landed becomes landing,
// and landing becomes landed once no unfinished step pod remains.
func (c *Controller) Land(ctx context.Context, name string) error {
	return c.decide(ctx, name, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		if cur.State == targets.StateLanded || cur.State == targets.StateLanding {
			return cur, false
		}
		return targets.Lifecycle{State: targets.StateLanding, Since: c.opts.Now()}, true
	})
}

// Release records that a Concourse web node released the worker of a
// landing, landed or retiring target: it landed or deleted it there once
// its builds drained. The containers the web node keeps (a check's, a
// failed build's) then hold the target no longer. A running target (the
// web node ended its registration first) is landed by the caller first.
func (c *Controller) Release(ctx context.Context, name string) error {
	return c.decide(ctx, name, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		switch cur.State {
		case targets.StateLanding, targets.StateLanded, targets.StateRetiring:
			if cur.Released.IsZero() {
				cur.Released = c.opts.Now()
				return cur, true
			}
		}
		return cur, false
	})
}

// Retire lands the target, then deletes everything jetway created in its
// namespace and forgets it.
func (c *Controller) Retire(ctx context.Context, name string) error {
	return c.decide(ctx, name, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		if cur.State == targets.StateRetiring {
			return cur, false
		}
		return targets.Lifecycle{State: targets.StateRetiring, Since: c.opts.Now()}, true
	})
}

// decide records an operator's decision in the target cluster and shows it
// at once; the next reconcile advances it.
func (c *Controller) decide(ctx context.Context, name string, mutate func(targets.Lifecycle) (targets.Lifecycle, bool)) error {
	k, err := c.kubeByName(name)
	if err != nil {
		return err
	}
	life, version, err := k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		if cur.State == targets.StateRetired {
			return cur, false
		}
		return mutate(cur)
	})
	if err != nil {
		return clusterError(err)
	}
	if life.State == targets.StateRetired {
		return targets.ErrNotFound
	}
	c.await(ctx, k, version)
	return nil
}

// await waits, within AwaitTimeout, until the target's watch has seen the
// record written at version, so the answer to the operator and the next
// list agree. If it is slower, the decision stands and shows a moment later.
func (c *Controller) await(ctx context.Context, k *kube, version string) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.AwaitTimeout)
	defer cancel()
	if err := k.t.AwaitRecord(ctx, version); err != nil {
		c.opts.Logger.Info("the target's watch has not shown the decision yet", "target", k.t.Name(), "error", err.Error())
	}
}

// Prune scopes: how far a prune reaches.
const (
	// PrunedEverywhere: recorded in the target cluster, so every replica
	// and restart agrees; the target stays pruned until its kubeconfig
	// changes or it is resumed.
	PrunedEverywhere = "installation"
	// PrunedHere: the target's cluster did not answer, so only this
	// replica forgets it, until the target answers a check again (then it
	// is back as it was, landed still landed).
	PrunedHere = "replica"
	// PrunedFromMesh: the worker is an agent's, which left the mesh, or
	// its owner is a member the mesh lost; the mesh forgets the worker
	// until its owner joins again and announces it.
	PrunedFromMesh = "mesh"
)

// Prune forgets a target that is not running and says how far the prune
// reaches (PrunedEverywhere or PrunedHere). A dead cluster can be pruned.
func (c *Controller) Prune(ctx context.Context, name string) (string, error) {
	t, reachable, err := c.opts.Registry.Prunable(name)
	if err != nil {
		return "", err
	}
	if reachable {
		err := c.recordPrune(ctx, newKube(t))
		if err == nil {
			c.opts.Metrics.acted("pruned")
			c.opts.Logger.Info("target pruned", "target", name, "scope", PrunedEverywhere)
			return PrunedEverywhere, nil
		}
		c.opts.Logger.Warn("cannot record the prune in the target cluster; pruning on this replica only",
			"target", name, "error", err.Error())
	}
	if err := c.opts.Registry.Prune(name); err != nil {
		return "", err
	}
	c.opts.Metrics.acted("pruned")
	return PrunedHere, nil
}

func (c *Controller) recordPrune(ctx context.Context, k *kube) error {
	_, version, err := k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		if cur.State == targets.StateRetired {
			return cur, false
		}
		cur.PrunedHash = k.t.Config.Hash()
		return cur, true
	})
	if err != nil {
		return err
	}
	c.await(ctx, k, version)
	return nil
}

// Resume undoes land, an unfinished retire and prune (kubectl's uncordon):
// the target takes work again once its checks pass. It is recorded in the
// target cluster like land, so every replica agrees.
func (c *Controller) Resume(ctx context.Context, name string) error {
	err := c.decide(ctx, name, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		return targets.Lifecycle{}, cur.State != "" || cur.PrunedHash != ""
	})
	if err != nil {
		return err
	}
	c.opts.Registry.Unprune(name)
	c.opts.Metrics.acted("resumed")
	c.opts.Logger.Info("target resumed", "target", name)
	return nil
}

// clusterError classifies a failure to record or act in a target cluster
// for the API: objects not ours and busy leases as they are, a refusal by
// the cluster's authorization as ErrDenied, anything else as ErrUnreachable.
func clusterError(err error) error {
	switch {
	case errors.Is(err, ErrNotOurs), errors.Is(err, ErrBusy), errors.Is(err, ErrDenied),
		errors.Is(err, ErrUnreachable), errors.Is(err, targets.ErrNotFound), errors.Is(err, targets.ErrInvalidEntry):
		return err
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, err)
}

// Sync deletes the target's step pods whose handles (pod names) the CI no
// longer wants, and returns the deleted ones.
func (c *Controller) Sync(ctx context.Context, name string, wanted []string) ([]string, error) {
	k, err := c.kubeByName(name)
	if err != nil {
		return nil, err
	}
	var deleted []string
	err = c.withLease(ctx, k, func(ctx context.Context) (bool, error) {
		pods, err := k.ownedPods(ctx)
		if err != nil {
			return false, err
		}
		var doomed []*corev1.Pod
		for _, p := range pods {
			if !slices.Contains(wanted, p.Name) && p.DeletionTimestamp == nil {
				doomed = append(doomed, p)
			}
		}
		deleted, err = c.deletePods(ctx, k, doomed, "sync", c.opts.Logger.With("target", name))
		return false, err
	})
	if deleted == nil {
		deleted = []string{}
	}
	if err != nil {
		return deleted, clusterError(err)
	}
	return deleted, nil
}
