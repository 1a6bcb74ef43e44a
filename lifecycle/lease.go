package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Lease timing. A replica that dies while acting loses the lease after
// leaseDuration; acquiring gives up after acquireTimeout, meaning another
// replica is acting.
const (
	leaseDuration  = 15 * time.Second
	renewDeadline  = 10 * time.Second
	retryPeriod    = 2 * time.Second
	acquireTimeout = 2*retryPeriod + time.Second
)

// ErrBusy means another gateway replica holds the target's lease.
var ErrBusy = errors.New("another gateway replica is acting on this target; retry")

// action runs while holding the target's lease. It returns whether the
// lease itself should be deleted afterwards (the target was retired).
type action func(ctx context.Context) (deleteLease bool, err error)

// withLease runs fn while this replica holds the target's Lease (client-go
// leader election on a Lease carrying the ownership labels), so replicas
// never act on one target at once. It returns ErrBusy when another replica
// keeps the lease for acquireTimeout.
func (c *Controller) withLease(ctx context.Context, k *kube, fn action) error {
	existing, err := k.leases.Leases(k.ns).Get(ctx, k.name, metav1.GetOptions{})
	switch {
	case err == nil:
		if err := k.mine("lease", existing.ObjectMeta); err != nil {
			return err
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("lease of %s: %w", k.t.Name(), err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: k.name, Namespace: k.ns},
		Client:     k.leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.opts.Identity},
		Labels:     k.labels,
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		deleteLease bool
		fnErr       error
		started     = make(chan struct{})
		done        = make(chan struct{})
	)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: true,
		Name:            k.t.Name(),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				close(started)
				defer close(done)
				deleteLease, fnErr = fn(lctx)
				cancel()
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return err
	}
	acquire := time.AfterFunc(acquireTimeout, func() {
		if !elector.IsLeader() {
			cancel()
		}
	})
	elector.Run(runCtx) // returns once released
	acquire.Stop()
	select {
	case <-started:
		<-done
	default:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrBusy
	}
	if fnErr == nil && deleteLease {
		return c.deleteLease(context.WithoutCancel(ctx), k)
	}
	return fnErr
}

// deleteLease deletes the target's Lease unless another replica has taken
// it since: the delete is conditional on the version this replica left.
func (c *Controller) deleteLease(ctx context.Context, k *kube) error {
	l, err := k.leases.Leases(k.ns).Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := k.mine("lease", l.ObjectMeta); err != nil {
		return err
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" && *h != c.opts.Identity {
		return nil // another replica holds it now
	}
	err = k.leases.Leases(k.ns).Delete(ctx, k.name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
	if gone(err) {
		return nil
	}
	return err
}
