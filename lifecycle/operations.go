package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
	life, err := k.update(ctx, func(cur targets.Lifecycle) (targets.Lifecycle, bool) {
		if cur.State == targets.StateRetired {
			return cur, false
		}
		return mutate(cur)
	})
	if errors.Is(err, ErrNotOurs) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	if life.State == targets.StateRetired {
		return targets.ErrNotFound
	}
	c.opts.Registry.SetLifecycle(name, k.cfg, life)
	return nil
}

// Prune forgets a target that is not running until its health next
// succeeds; it needs no access to the target, so a dead cluster can be
// pruned.
func (c *Controller) Prune(name string) error { return c.opts.Registry.Prune(name) }

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
		var doomed []string
		for _, p := range pods {
			if !slices.Contains(wanted, p.Name) && p.DeletionTimestamp == nil {
				doomed = append(doomed, p.Name)
			}
		}
		err = c.deletePods(ctx, k, doomed, "sync", c.opts.Logger.With("target", name))
		if err == nil {
			deleted = doomed
		}
		return false, err
	})
	if deleted == nil {
		deleted = []string{}
	}
	return deleted, err
}
