package steps

import (
	"context"
	"errors"
	"time"
)

// reconcile makes this gateway do its part for every record: take over
// the steps whose owner is gone, drive the placed steps it owns (a runner
// each), finish the ended ones (their pods marked or deleted, releases),
// and stop driving the steps it no longer owns. It reads the records and
// the Leases as they are; everything it starts is idempotent.
func (m *Manager) reconcile(ctx context.Context) {
	if ok, _ := m.opts.Records.Synced(); !ok || !m.opts.Owners.Synced() {
		return
	}
	valid := m.opts.Owners.Valid()
	m.mu.Lock()
	defer m.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	owned := map[string]bool{} // the runners may go on: the step is still this gateway's
	for _, r := range m.opts.Records.List() {
		st := &r.Status
		owned[r.Name] = valid && st.Owner == m.me
		if !st.Released.IsZero() {
			continue
		}
		if st.Owner != m.me {
			if valid && !m.opts.Owners.Alive(st.Owner) && !m.busy[r.Name] {
				m.task(ctx, r.Name, func(ctx context.Context) { m.takeOver(ctx, r) })
			}
			continue
		}
		if !valid || st.Placed == nil {
			continue // a gateway that cannot renew its Lease drives nothing
		}
		switch {
		case st.End == nil && m.runners[r.Name] == nil:
			m.startRunner(r)
		case st.End != nil && m.runners[r.Name] == nil && !m.busy[r.Name] && m.unfinished(r) && m.due(r.Name):
			m.task(ctx, r.Name, func(ctx context.Context) { m.failed(r.Name, m.finish(ctx, r)) })
		}
	}
	for name, run := range m.runners {
		if !owned[name] {
			run.cancel(errNotDriving)
		}
	}
	for name := range m.retry {
		if _, ok := owned[name]; !ok {
			delete(m.retry, name) // forgotten
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
// pause after its last failure. Called with m.mu held.
func (m *Manager) due(name string) bool {
	r, ok := m.retry[name]
	return !ok || !m.opts.Now().Before(r.at)
}

// failed notes how a record's housekeeping went: a failure pauses the
// next try, twice as long each time, up to maxRetryPause.
func (m *Manager) failed(name string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		delete(m.retry, name)
		return
	}
	pause := min(2*m.retry[name].pause, maxRetryPause)
	pause = max(pause, time.Second)
	m.retry[name] = retry{at: m.opts.Now().Add(jitter(pause)), pause: pause}
}

// task runs f for record name unless one runs for it already. Called
// with m.mu held.
func (m *Manager) task(ctx context.Context, name string, f func(ctx context.Context)) {
	m.busy[name] = true
	m.wg.Go(func() {
		defer func() {
			m.mu.Lock()
			delete(m.busy, name)
			m.mu.Unlock()
		}()
		f(ctx)
	})
}

// takeOver makes this gateway the owner of a step whose owner is gone;
// of two gateways trying, the record takes one.
func (m *Manager) takeOver(ctx context.Context, r *Record) {
	was := r.Status.Owner
	_, err := m.opts.Records.Update(ctx, r.Name, func(cur *Record) error {
		if cur.Status.Owner != was || m.opts.Owners.Alive(was) || !cur.Status.Released.IsZero() {
			return errUnchanged
		}
		cur.Status.Owner = m.me
		return nil
	})
	switch {
	case err == nil:
		if cur, ok := m.opts.Records.Get(r.Name); ok && cur.Status.Owner == m.me {
			m.opts.Metrics.tookOver()
			m.opts.Logger.Info("step taken over", "handle", r.Summary.Handle, "team", r.Summary.Team, "from", was)
		}
	case !errors.Is(err, errRecordGone) && ctx.Err() == nil:
		m.opts.Logger.Warn("step not taken over", "handle", r.Summary.Handle, "from", was, "error", err.Error())
	}
	m.wake()
}
