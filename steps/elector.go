package steps

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/jetway-ci/jetway/internal/watchcache"
)

// Leadership says whether this gateway is the installation's placer now:
// the one gateway that places steps, so that limits hold and the queue is
// served in order however many gateways take steps.
type Leadership interface {
	// Leading returns the context of the current leadership, which ends
	// when it is lost, and whether there is one.
	Leading() (context.Context, bool)
	// Changed returns a channel closed at the next change.
	Changed() <-chan struct{}
}

// ElectorOptions configure an Elector.
type ElectorOptions struct {
	Config       *rest.Config
	Namespace    string
	Installation string
	Identity     string
	Logger       *slog.Logger
}

// Elector holds the placer Lease of an installation (client-go leader
// election) while it can, and campaigns for it again when it loses it.
// A placer that stops releases the Lease at once; one that dies loses it
// after leaseDuration.
type Elector struct {
	opts   ElectorOptions
	leases coordinationv1client.CoordinationV1Interface

	mu      sync.Mutex
	lead    context.Context // nil while not leading
	changes watchcache.Broadcast
}

// NewElector builds an Elector; it does not touch the network.
func NewElector(o ElectorOptions) (*Elector, error) {
	c, err := coordinationv1client.NewForConfig(rest.CopyConfig(o.Config))
	if err != nil {
		return nil, fmt.Errorf("placer lease: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Elector{opts: o, leases: c}, nil
}

// Leading implements Leadership.
func (e *Elector) Leading() (context.Context, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lead, e.lead != nil
}

// Changed implements Leadership.
func (e *Elector) Changed() <-chan struct{} { return e.changes.Wait() }

func (e *Elector) set(ctx context.Context) {
	e.mu.Lock()
	e.lead = ctx
	e.mu.Unlock()
	e.changes.Notify()
}

// Start campaigns for the placer Lease until ctx ends, then releases it.
func (e *Elector) Start(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: "jetway-" + e.opts.Installation + "-placer", Namespace: e.opts.Namespace},
		Client:     e.leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.opts.Identity},
		Labels:     map[string]string{GatewayLeaseLabel + "-placer": e.opts.Installation},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: leaseValid, RetryPeriod: leaseRenew,
			ReleaseOnCancel: true, Name: "placer",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					e.opts.Logger.Info("this gateway places steps now", "identity", e.opts.Identity)
					e.set(lctx)
					<-lctx.Done()
				},
				OnStoppedLeading: func() { e.set(nil) },
			},
		})
		if err != nil {
			return err
		}
		le.Run(ctx) // returns once leadership is lost, or ctx ended
		e.set(nil)
	}
	return nil
}
