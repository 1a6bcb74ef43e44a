package steps

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
)

// The keeper does this gateway's part for the steps it owns: it takes
// over the steps whose owner is gone, runs a runner for each placed step
// it owns, and finishes the ended ones (their pods marked or deleted,
// their releases), trying again, later each time, what fails.
type keeper struct {
	*gateway
	events   *eventLog
	sessions *sessions
	kick     chan struct{}

	mu      sync.Mutex
	runners map[string]*runner // the steps this gateway drives now, by record
	busy    map[string]bool    // records with a housekeeping task under way
	retry   map[string]retry   // records whose last housekeeping failed: when to try again
	wg      sync.WaitGroup     // runners and tasks
}

func newKeeper(g *gateway, events *eventLog, sessions *sessions) *keeper {
	return &keeper{gateway: g, events: events, sessions: sessions, kick: make(chan struct{}, 1),
		runners: map[string]*runner{}, busy: map[string]bool{}, retry: map[string]retry{}}
}

// run reconciles whenever the records, the Leases or the targets change
// (and each second: Leases lapse without a change to see) until ctx
// ends; then it stops its runners and returns once they and its tasks
// have.
func (k *keeper) run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		records, owners := k.opts.Records.Changed(), k.opts.Owners.Changed()
		registry := k.opts.Registry.Changed()
		k.reconcile(ctx)
		select {
		case <-ctx.Done():
			k.stopRunners()
			k.wg.Wait()
			return
		case <-records:
		case <-owners:
		case <-registry:
		case <-k.kick:
		case <-tick.C:
		}
	}
}

// wake makes the keeper reconcile now.
func (k *keeper) wake() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// reconcile makes this gateway do its part for every record: take over
// the steps whose owner is gone, drive the placed steps it owns (a runner
// each), finish the ended ones (their pods marked or deleted, releases),
// and stop driving the steps it no longer owns. It reads the records and
// the Leases as they are; everything it starts is idempotent.
func (k *keeper) reconcile(ctx context.Context) {
	if ok, _ := k.opts.Records.Synced(); !ok || !k.opts.Owners.Synced() {
		return
	}
	valid := k.opts.Owners.Valid()
	k.mu.Lock()
	defer k.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	owned := map[string]bool{} // the runners may go on: the step is still this gateway's
	for _, r := range k.opts.Records.List() {
		st := &r.Status
		owned[r.Name] = valid && st.Owner == k.me
		if !st.Released.IsZero() {
			continue
		}
		if st.Owner != k.me {
			if valid && !k.opts.Owners.Alive(st.Owner) && !k.busy[r.Name] {
				k.task(ctx, r.Name, func(ctx context.Context) { k.takeOver(ctx, r) })
			}
			continue
		}
		if !valid || st.Placed == nil {
			continue // a gateway that cannot renew its Lease drives nothing
		}
		switch {
		case st.End == nil && k.runners[r.Name] == nil:
			k.startRunner(ctx, r)
		case st.End != nil && k.runners[r.Name] == nil && !k.busy[r.Name] && k.unfinished(r) && k.due(r.Name):
			k.task(ctx, r.Name, func(ctx context.Context) { k.failed(r.Name, k.finish(ctx, r)) })
		}
	}
	for name, run := range k.runners {
		if !owned[name] {
			run.cancel(errNotDriving)
		}
	}
	for name := range k.retry {
		if _, ok := owned[name]; !ok {
			delete(k.retry, name) // forgotten
		}
	}
}

// retry is when a record's failed housekeeping is tried again.
type retry struct {
	at    time.Time
	pause time.Duration
}

// maxRetryPause bounds the pause before housekeeping that keeps failing
// (a pod its owner may not delete, say) is tried again.
const maxRetryPause = 5 * time.Minute

// due says whether a record's housekeeping may run now: not before the
// pause after its last failure. Called with k.mu held.
func (k *keeper) due(name string) bool {
	r, ok := k.retry[name]
	return !ok || !k.opts.Now().Before(r.at)
}

// failed notes how a record's housekeeping went: a failure pauses the
// next try, twice as long each time, up to maxRetryPause.
func (k *keeper) failed(name string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err == nil {
		delete(k.retry, name)
		return
	}
	pause := min(2*k.retry[name].pause, maxRetryPause)
	pause = max(pause, time.Second)
	k.retry[name] = retry{at: k.opts.Now().Add(backoff.Jitter(pause, 0.2)), pause: pause}
}

// task runs f for record name unless one runs for it already. Called
// with k.mu held.
func (k *keeper) task(ctx context.Context, name string, f func(ctx context.Context)) {
	k.busy[name] = true
	k.wg.Go(func() {
		defer func() {
			k.mu.Lock()
			delete(k.busy, name)
			k.mu.Unlock()
		}()
		f(ctx)
	})
}

// takeOver makes this gateway the owner of a step whose owner is gone;
// of two gateways trying, the record takes one.
func (k *keeper) takeOver(ctx context.Context, r *Record) {
	was := r.Status.Owner
	_, err := k.opts.Records.Update(ctx, r.Name, func(cur *Record) error {
		if cur.Status.Owner != was || k.opts.Owners.Alive(was) || !cur.Status.Released.IsZero() {
			return errUnchanged
		}
		cur.Status.Owner = k.me
		return nil
	})
	switch {
	case err == nil:
		if cur, ok := k.opts.Records.Get(r.Name); ok && cur.Status.Owner == k.me {
			k.opts.Metrics.tookOver()
			k.opts.Logger.Info("step taken over", "handle", r.Summary.Handle, "team", r.Summary.Team, "from", was)
		}
	case !errors.Is(err, errRecordGone) && ctx.Err() == nil:
		k.opts.Logger.Warn("step not taken over", "handle", r.Summary.Handle, "from", was, "error", err.Error())
	}
	k.wake()
}

// startRunner drives the step of r, which this gateway owns. Called with
// k.mu held.
func (k *keeper) startRunner(ctx context.Context, r *Record) {
	ctx, cancel := context.WithCancelCause(ctx)
	run := &runner{k: k, name: r.Name, sum: r.Summary, placed: *r.Status.Placed, cancel: cancel, done: make(chan struct{}),
		log: k.opts.Logger.With("target", r.Status.Placed.Target, "pod", r.Status.Placed.Pod, "team", r.Summary.Team, "handle", r.Summary.Handle)}
	run.startedAt = r.Status.Started
	k.runners[r.Name] = run
	k.wg.Go(func() {
		run.run(ctx)
		k.mu.Lock()
		if k.runners[r.Name] == run {
			delete(k.runners, r.Name)
		}
		k.mu.Unlock()
		k.events.close(r.Name, run.tail)
		k.wake() // what follows the step's end (its release, say) need not wait for its last exec to close
		if run.closing != nil {
			run.closing()
		}
		cancel(errRunnerDone)
		close(run.done)
	})
}

// stopRunners stops every runner and waits for them.
func (k *keeper) stopRunners() {
	k.mu.Lock()
	var all []*runner
	for _, r := range k.runners {
		r.cancel(errStopping)
		all = append(all, r)
	}
	k.mu.Unlock()
	for _, r := range all {
		<-r.done
	}
}
