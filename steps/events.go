package steps

import (
	"context"
	"io"
	"strconv"
	"sync"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// A step's events are positions, the same on every gateway and after any
// restart:
//
//	head  its record's waiting events, placed, scheduled   0 .. h-1
//	log   the event frames of its agent's log (stepagent.IsEvent)
//	                                                       h .. h+L-1
//	end   exited or failed, from its record                h+L
//
// The head is final once the step is scheduled (nothing is logged before)
// or ended. Event k of the log is read from the pod, the agent skipping
// k event frames of it where it lies (step-agent tail --skip); the owner
// keeps the last few it read in a tail, for its own followers.

// tail keeps the last events of a step this gateway runs, for its
// followers here; older ones are read from the pod. It is bounded by
// tailEvents and tailBytes of output, whatever the step prints.
type tail struct {
	mu      sync.Mutex
	events  []wire.Event // consecutive, oldest first
	bytes   int
	next    int  // the number of the next event
	done    bool // the log ended (its status came)
	stopped bool // its runner stopped: followers read the pod
	changed chan struct{}
}

// Bounds of a tail.
const (
	tailEvents = 256
	tailBytes  = 512 << 10
)

func newTail(next int) *tail { return &tail{next: next, changed: make(chan struct{})} }

// add appends an event (numbered by the runner) and wakes followers.
func (t *tail) add(e wire.Event) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.N != t.next && len(t.events) > 0 {
		t.events, t.bytes = nil, 0 // a gap: start again from here
	}
	t.events = append(t.events, e)
	t.bytes += len(e.Data) + len(e.DataBase64)
	t.next = e.N + 1
	for len(t.events) > tailEvents || (t.bytes > tailBytes && len(t.events) > 1) {
		t.bytes -= len(t.events[0].Data) + len(t.events[0].DataBase64)
		t.events[0] = wire.Event{}
		t.events = t.events[1:]
	}
	t.notify()
}

// position moves the tail to the log's position next, before any event.
func (t *tail) position(next int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if next != t.next {
		t.events, t.bytes, t.next = nil, 0, next
		t.notify()
	}
}

func (t *tail) end(stopped bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if stopped {
		t.stopped = true
	} else {
		t.done = true
	}
	t.notify()
}

func (t *tail) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// count is the number of events the step has had, as far as the tail
// knows.
func (t *tail) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.next
}

// from returns the events from n on if the tail holds n (ok), whether the
// log has ended with them, and a channel closed at the next change.
func (t *tail) from(n int) (evs []wire.Event, ok, done bool, changed <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := t.next - len(t.events)
	if t.stopped || n < first || n > t.next {
		return nil, false, false, t.changed
	}
	return append([]wire.Event(nil), t.events[n-first:]...), true, t.done, t.changed
}

// The eventLog serves steps' events, by number, from their records and
// their logs in their pods; for the steps this gateway runs, from the
// tails their runners keep when those hold them.
type eventLog struct {
	*gateway
	mu    sync.Mutex
	tails map[string]*tail // of the steps this gateway runs, by record
}

func newEventLog(g *gateway) *eventLog { return &eventLog{gateway: g, tails: map[string]*tail{}} }

// open starts the tail of the step of record name, whose log's first
// event is number base: its runner reads the log.
func (l *eventLog) open(name string, base int) *tail {
	t := newTail(base)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tails[name] = t
	return t
}

// close stops t, the tail of the step of record name: its followers read
// the pod from where they are.
func (l *eventLog) close(name string, t *tail) {
	if t == nil {
		return
	}
	t.end(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tails[name] == t {
		delete(l.tails, name)
	}
}

// tail is the tail of the step of record name, if this gateway runs it.
func (l *eventLog) tail(name string) *tail {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tails[name]
}

// journal is a gateway's step as a Journal: its record, and its pod's
// log (or this gateway's tail of it).
type journal struct {
	l    *eventLog
	name string
}

func (j journal) State() ([]wire.Event, bool, *wire.Event, <-chan struct{}, bool) {
	changed := j.l.opts.Records.Changed()
	r, ok := j.l.opts.Records.Get(j.name)
	if !ok {
		return nil, false, nil, changed, false
	}
	head, final := r.Head()
	end, ended := r.EndEvent()
	logged := final && (ended || !r.Status.Started.IsZero())
	if !ended {
		return head, logged, nil, changed, true
	}
	return head, logged, &end, changed, true
}

func (j journal) ReadLog(ctx context.Context, base, n int, send func([]wire.Event) error) (int, error) {
	r, ok := j.l.opts.Records.Get(j.name)
	if !ok {
		return n, steppod.ErrLogGone
	}
	return j.l.readLog(ctx, r, base, n, send)
}

// follow sends the events of the step of record name from n on: see
// FollowJournal.
func (l *eventLog) follow(ctx context.Context, name string, n int, send func([]wire.Event) error) error {
	return steppod.FollowJournal(ctx, journal{l, name}, n, send)
}

// readLog sends the step's log events from n on (base is the number of
// its first), from this gateway's tail when it holds them, else from the
// pod, until the log's status. It returns the number of the next event
// to send.
func (l *eventLog) readLog(ctx context.Context, r *Record, base, n int, send func([]wire.Event) error) (int, error) {
	for {
		t := l.tail(r.Name)
		if t == nil {
			return l.readPod(ctx, r, base, n, send)
		}
		evs, ok, done, changed := t.from(n)
		if !ok {
			return l.readPod(ctx, r, base, n, send)
		}
		if len(evs) > 0 {
			if err := send(evs); err != nil {
				return n, &steppod.SendError{Err: err}
			}
			n = evs[len(evs)-1].N + 1
			continue
		}
		if done {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-changed:
		}
	}
}

// readPod reads the step's log from its pod, from event n on, until its
// status; it hands over to this gateway's tail when that holds the next
// event (the runner caught up with it).
func (l *eventLog) readPod(ctx context.Context, r *Record, base, n int, send func([]wire.Event) error) (int, error) {
	p := r.Status.Placed
	t, err := l.opts.Registry.Target(p.Target)
	if err != nil {
		return n, err
	}
	if gone(t, p.Pod) {
		return n, steppod.ErrLogGone
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	cmd := agent("tail", "--offset", "0", "--events", "0", "--skip", strconv.Itoa(n-base))
	if p.Run != "" {
		cmd = append(cmd, "--run", p.Run)
	}
	var wg sync.WaitGroup
	wg.Go(func() { pw.CloseWithError(l.execAny(ctx, t, p.Pod, cmd, pw)) })
	defer func() {
		cancel()
		pr.Close() // the exec's writes fail: it returns
		wg.Wait()
	}()
	return steppod.ReadEvents(pr, base, n, send, func(next int) bool {
		if tl := l.tail(r.Name); tl != nil {
			_, ok, _, _ := tl.from(next)
			return ok
		}
		return false
	})
}

// execAny runs an agent command in the step container, or in the volume
// sidecar when the step's container cannot take it (it ended: an OOM
// kill, say); both see the pod's emptyDir.
func (g *gateway) execAny(ctx context.Context, t *targets.Target, pod string, cmd []string, out io.Writer) error {
	err := g.opts.Exec(ctx, t, pod, steppod.StepContainer, cmd, nil, out)
	if err == nil || ctx.Err() != nil {
		return err
	}
	if _, coded := stepagent.ExitCode(err); coded {
		return err // the agent ran, and answered
	}
	if p := t.CachedPod(pod); p != nil && steppod.Terminated(p, steppod.StepContainer) {
		return g.opts.Exec(ctx, t, pod, steppod.SidecarContainer, cmd, nil, out)
	}
	return err
}

// gone reports whether a target's synced watch no longer shows a pod.
func gone(t *targets.Target, pod string) bool {
	ok, _ := t.Synced()
	return ok && t.CachedPod(pod) == nil
}
