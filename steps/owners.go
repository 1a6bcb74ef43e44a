package steps

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/watchcache"
)

// Ownership. Every gateway process has an identity and a Lease of its
// own in the state namespace, which it renews while it runs and deletes
// when it stops. A step is driven by its owner alone (its record's
// Status.Owner, mirrored in its pod's owner label); another gateway takes
// it over only once the owner is gone: its Lease deleted (it stopped), or
// not renewed for a lease duration as the other gateway's own clock
// measures it (it died, or lost the state namespace). An owner that could
// not renew its Lease for leaseValid stops driving its steps before
// anyone may take them over.
const (
	// leaseDuration is how long a gateway's Lease may go unrenewed before
	// its steps are taken over.
	leaseDuration = 10 * time.Second
	// leaseRenew is how often a gateway renews it.
	leaseRenew = 2 * time.Second
	// leaseValid is how long after its last renewal a gateway still acts
	// as owner: less than leaseDuration, so it has stopped before others
	// start.
	leaseValid = leaseDuration - 3*time.Second
	// leaseUnknownGrace is how long an owner whose Lease was never seen is
	// taken as alive: a watch of Leases may lag one of records.
	leaseUnknownGrace = 2 * leaseRenew
	// leaseForgetAfter is how long a gateway's Lease may go unrenewed
	// before any gateway deletes it.
	leaseForgetAfter = 10 * time.Minute
)

// GatewayLeaseLabel marks a gateway's Lease; its value is the
// installation.
const GatewayLeaseLabel = "jetway-ci.dev/gateway-lease"

// NewIdentity names a gateway process: its host name (the pod's, in a
// cluster) and a random suffix, so a restarted process is never taken for
// its predecessor. It is a DNS label and a label value.
func NewIdentity(host string) string {
	host = strings.Trim(nonLabel.ReplaceAllString(strings.ToLower(host), "-"), "-")
	if len(host) > 40 {
		host = strings.TrimRight(host[:40], "-")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if host == "" {
		host = "gateway"
	}
	return host + "-" + hex.EncodeToString(b)
}

var nonLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// OwnersOptions configure Owners.
type OwnersOptions struct {
	// Config reaches the cluster of the state namespace.
	Config       *rest.Config
	Namespace    string
	Installation string
	// Identity names this gateway (NewIdentity).
	Identity string
	Logger   *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Owners keeps this gateway's Lease and watches every gateway's. Start
// runs it; it deletes this gateway's Lease when it stops, so stop it after
// the steps it owns.
type Owners struct {
	leases coordinationv1client.LeaseInterface
	opts   OwnersOptions
	cache  *watchcache.Cache
	live   *liveness

	changes watchcache.Broadcast
}

// NewOwners builds Owners; it does not touch the network.
func NewOwners(o OwnersOptions) (*Owners, error) {
	rc := rest.CopyConfig(o.Config)
	c, err := coordinationv1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("gateway leases: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	w := &Owners{leases: c.Leases(o.Namespace), opts: o, live: newLiveness(o.Identity, o.Now)}
	w.cache = watchcache.New(w.observe)
	w.cache.OnChange(w.changes.Notify)
	return w, nil
}

// Me is this gateway's identity.
func (w *Owners) Me() string { return w.opts.Identity }

// Changed returns a channel closed at the next change of any gateway's
// liveness as seen here (a Lease renewed, gone, or this gateway's own
// renewal's validity).
func (w *Owners) Changed() <-chan struct{} { return w.changes.Wait() }

// Alive reports whether the gateway id may still own steps.
func (w *Owners) Alive(id string) bool { return w.live.alive(id) }

// Valid reports whether this gateway may act as an owner now: it renewed
// its Lease within leaseValid.
func (w *Owners) Valid() bool { return w.live.valid() }

// Synced reports whether the Leases were listed once.
func (w *Owners) Synced() bool {
	ok, _ := w.cache.Synced()
	return ok
}

// leaseName is the name of gateway id's Lease.
func (w *Owners) leaseName(id string) string {
	return "jetway-" + w.opts.Installation + "-gateway-" + id
}

// Start creates and renews this gateway's Lease and watches every
// gateway's until ctx ends; then it deletes its own, telling the others
// its steps are theirs to take.
func (w *Owners) Start(ctx context.Context) error {
	lw := watchcache.ListWatch(w.leases, watchcache.Labelled(GatewayLeaseLabel+"="+w.opts.Installation))
	var wg sync.WaitGroup
	wg.Go(func() { w.cache.Run(ctx, "gateway leases", lw, &coordinationv1.Lease{}) })
	w.renew(ctx)
	wg.Wait()
	w.release()
	return nil
}

// renew keeps this gateway's Lease fresh until ctx ends; a sweep deletes
// the Leases of gateways long gone.
func (w *Owners) renew(ctx context.Context) {
	tick := time.NewTicker(leaseRenew)
	defer tick.Stop()
	var lease *coordinationv1.Lease
	for {
		var err error
		if lease, err = w.renewOnce(ctx, lease); err != nil && ctx.Err() == nil {
			w.opts.Logger.Warn("gateway lease not renewed", "lease", w.leaseName(w.Me()), "error", err.Error())
		}
		w.sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// renewOnce writes the Lease with a new renew time, creating it when it
// is missing; it records a success for Valid.
func (w *Owners) renewOnce(ctx context.Context, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseRenew)
	defer cancel()
	now := metav1.NewMicroTime(w.opts.Now())
	secs := int32(leaseDuration / time.Second)
	var err error
	if lease != nil {
		next := lease.DeepCopy()
		next.Spec.RenewTime = &now
		lease, err = w.leases.Update(ctx, next, metav1.UpdateOptions{})
	}
	if lease == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		id := w.Me()
		lease, err = w.leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: w.leaseName(id), Labels: map[string]string{GatewayLeaseLabel: w.opts.Installation}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			lease, err = w.leases.Get(ctx, w.leaseName(id), metav1.GetOptions{})
			if err == nil {
				return w.renewOnce(ctx, lease)
			}
		}
	}
	if err != nil {
		w.changes.Notify() // Valid may turn false
		return nil, err
	}
	w.live.renewed()
	w.changes.Notify()
	return lease, nil
}

// sweep deletes the Leases not renewed for leaseForgetAfter: gateways
// killed without a chance to delete their own.
func (w *Owners) sweep(ctx context.Context) {
	for _, obj := range w.cache.List() {
		l := obj.(*coordinationv1.Lease)
		if l.Spec.HolderIdentity == nil || !w.live.forgotten(*l.Spec.HolderIdentity) {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, storeTimeout)
		uid, rv := l.UID, l.ResourceVersion
		err := w.leases.Delete(dctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		cancel()
		if err == nil {
			w.opts.Logger.Info("deleted the lease of a gateway long gone", "lease", l.Name)
		}
	}
}

// release deletes this gateway's Lease: it owns nothing from now on.
func (w *Owners) release() {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	w.live.stop()
	err := w.leases.Delete(ctx, w.leaseName(w.Me()), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		w.opts.Logger.Warn("gateway lease not deleted: others take its steps over once it lapses", "error", err.Error())
	}
}

// observe is the cache's view: it feeds every Lease seen to the liveness.
func (w *Owners) observe(items []any) any {
	held := map[string]string{}
	for _, it := range items {
		l := it.(*coordinationv1.Lease)
		if l.Spec.HolderIdentity != nil {
			held[*l.Spec.HolderIdentity] = l.ResourceVersion
		}
	}
	w.live.observe(held)
	return nil
}

// liveness tells, from what this gateway has seen of the Leases and by
// its own clock, whether a gateway is alive: its Lease changed within
// leaseDuration (or, never seen, it was named within leaseUnknownGrace).
// Comparing observations, not the Leases' own times, makes clock skew
// between gateways harmless.
type liveness struct {
	me  string
	now func() time.Time

	mu       sync.Mutex
	seen     map[string]seenLease // by identity
	unknown  map[string]time.Time // identities asked about and never seen: since when
	lastOK   time.Time            // this gateway's last renewal
	stopped  bool
	listedAt time.Time // when the Leases were first listed
}

type seenLease struct {
	version string
	at      time.Time // when version was first seen
	gone    bool      // its Lease was deleted
}

func newLiveness(me string, now func() time.Time) *liveness {
	return &liveness{me: me, now: now, seen: map[string]seenLease{}, unknown: map[string]time.Time{}}
}

// observe takes the Leases now held: identity to resource version.
func (l *liveness) observe(held map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.listedAt.IsZero() {
		l.listedAt = now
	}
	for id, s := range l.seen {
		if _, ok := held[id]; !ok && !s.gone {
			l.seen[id] = seenLease{version: s.version, at: now, gone: true}
		}
	}
	for id, v := range held {
		if s, ok := l.seen[id]; !ok || s.version != v || s.gone {
			l.seen[id] = seenLease{version: v, at: now}
		}
		delete(l.unknown, id)
	}
}

// alive reports whether gateway id may still own steps.
func (l *liveness) alive(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if id == l.me {
		return !l.stopped
	}
	if s, ok := l.seen[id]; ok {
		return !s.gone && now.Sub(s.at) < leaseDuration
	}
	since, ok := l.unknown[id]
	if !ok {
		since = now
		l.unknown[id] = now
	}
	return now.Sub(since) < leaseUnknownGrace
}

// forgotten reports whether gateway id's Lease went unrenewed so long that
// it may be deleted.
func (l *liveness) forgotten(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.seen[id]
	return ok && id != l.me && !s.gone && l.now().Sub(s.at) > leaseForgetAfter
}

func (l *liveness) renewed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastOK = l.now()
}

func (l *liveness) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.stopped && !l.lastOK.IsZero() && l.now().Sub(l.lastOK) < leaseValid
}

func (l *liveness) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
}

// errNotOwner: a change by a gateway that no longer owns the step.
var errNotOwner = errors.New("this gateway no longer owns the step")
