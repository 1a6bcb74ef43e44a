package steps

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/watchcache"
	"github.com/jetway-ci/jetway/targets"
)

// memRecords keeps records in memory, with the Store's semantics: names
// by RecordName, writes at a version, a change after every write. It is
// for the package's pure logic; the Store is tested against real API
// servers (integration).
type memRecords struct {
	installation string

	mu      sync.Mutex
	recs    map[string]*Record
	data    map[string]map[string][]byte
	version int
	unread  bool // Synced reports false
	changes watchcache.Broadcast
}

func newMemRecords() *memRecords {
	return &memRecords{installation: "jetway", recs: map[string]*Record{}, data: map[string]map[string][]byte{}}
}

func (m *memRecords) Synced() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.unread, nil
}

func (m *memRecords) Changed() <-chan struct{} { return m.changes.Wait() }

func (m *memRecords) Get(name string) (*Record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[name]
	return r, ok
}

func (m *memRecords) List() []*Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r)
	}
	return out
}

func (m *memRecords) Create(_ context.Context, sum Summary, st Status, request []byte) (*Record, bool, error) {
	name := RecordName(m.installation, sum.Team, sum.Handle)
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.recs[name]; ok {
		return r, false, nil
	}
	m.version++
	r := &Record{Summary: sum, Status: st}
	r.Name, r.ResourceVersion = name, strconv.Itoa(m.version)
	m.recs[name] = r
	m.data[name] = map[string][]byte{requestKey: request}
	m.changes.Notify()
	return r, true, nil
}

func (m *memRecords) Update(_ context.Context, name string, change func(r *Record) error) (*Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.recs[name]
	if !ok {
		return nil, errRecordGone
	}
	next := &Record{ObjectMeta: cur.ObjectMeta, Summary: cur.Summary, Status: cur.Status.clone()}
	if err := change(next); err != nil {
		if err == errUnchanged {
			return cur, nil
		}
		return cur, err
	}
	m.version++
	next.ResourceVersion = strconv.Itoa(m.version)
	if next.result != nil {
		m.data[name][resultKey] = next.result
		next.result = nil
	}
	m.recs[name] = next
	m.changes.Notify()
	return next, nil
}

func (m *memRecords) Request(_ context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data[name][requestKey], nil
}

func (m *memRecords) Result(_ context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data[name][resultKey], nil
}

func (m *memRecords) Delete(_ context.Context, r *Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, r.Name)
	m.changes.Notify()
	return nil
}

func (m *memRecords) Refresh(context.Context) error { return nil }

// request is what a record holds of its step's request.
func (m *memRecords) request(t *testing.T, name string) Request {
	raw, err := m.Request(context.Background(), name)
	require.NoError(t, err)
	var req Request
	require.NoError(t, json.Unmarshal(raw, &req))
	return req
}

// fakeOwners is the gateways' liveness as a test says it is.
type fakeOwners struct {
	me string

	mu   sync.Mutex
	dead map[string]bool
	ch   watchcache.Broadcast
}

func newFakeOwners(me string) *fakeOwners { return &fakeOwners{me: me, dead: map[string]bool{}} }

func (o *fakeOwners) Me() string { return o.me }
func (o *fakeOwners) Alive(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.dead[id]
}
func (o *fakeOwners) Valid() bool              { return o.Alive(o.me) }
func (o *fakeOwners) Synced() bool             { return true }
func (o *fakeOwners) Changed() <-chan struct{} { return o.ch.Wait() }

// kill says gateway id is gone.
func (o *fakeOwners) kill(id string) {
	o.mu.Lock()
	o.dead[id] = true
	o.mu.Unlock()
	o.ch.Notify()
}

// leading always leads.
type leading struct{}

func (leading) Leading() (context.Context, bool) { return context.Background(), true }
func (leading) Changed() <-chan struct{}         { return nil }

// fakeRegistry has targets whose statuses the test sets; their watches
// never list (their clusters do not answer), so every step placed on
// them counts as placed and unseen.
type fakeRegistry struct {
	host string // of the targets' API servers

	mu       sync.Mutex
	statuses []targets.Status
	targets  map[string]*targets.Target
	ch       watchcache.Broadcast
}

func newFakeRegistry(t *testing.T, statuses ...targets.Status) *fakeRegistry {
	r := &fakeRegistry{host: "https://127.0.0.1:1", targets: map[string]*targets.Target{}}
	r.set(t, statuses...)
	return r
}

// silentRegistry is a fakeRegistry whose API servers take connections
// and never answer: a step placed on its targets stays starting.
func silentRegistry(t *testing.T, statuses ...targets.Status) *fakeRegistry {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	r := &fakeRegistry{host: "https://" + ln.Addr().String(), targets: map[string]*targets.Target{}}
	r.set(t, statuses...)
	return r
}

func (r *fakeRegistry) set(t *testing.T, statuses ...targets.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = statuses
	for _, st := range statuses {
		if r.targets[st.Name] == nil {
			tg, err := targets.NewTarget(&targets.Config{Name: st.Name, Meta: st.Meta, REST: &rest.Config{Host: r.host}}, "jetway")
			require.NoError(t, err)
			r.targets[st.Name] = tg
		}
	}
	r.ch.Notify()
}

func (*fakeRegistry) Loaded() bool { return true }
func (r *fakeRegistry) Snapshot() []targets.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]targets.Status(nil), r.statuses...)
}
func (r *fakeRegistry) Target(name string) (*targets.Target, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.statuses {
		if st.Name == name {
			return r.targets[name], nil
		}
	}
	return nil, targets.ErrNotFound
}
func (r *fakeRegistry) Changed() <-chan struct{} { return r.ch.Wait() }

// running is a running target's status; its platform linux unless meta
// says.
func running(name string, meta targets.Metadata) targets.Status {
	if meta.Platform == "" {
		meta.Platform = "linux"
	}
	return targets.Status{Name: name, State: targets.StateRunning, Meta: meta}
}

// testManager is a Manager over memRecords, started, stopped at the end
// of the test.
type testManager struct {
	*Manager
	records *memRecords
	owners  *fakeOwners
}

func startTestManager(t *testing.T, opts Options) testManager {
	t.Helper()
	recs, owners := newMemRecords(), newFakeOwners("gw-a")
	if opts.Registry == nil {
		opts.Registry = newFakeRegistry(t)
	}
	opts.Records, opts.Owners, opts.Leader = recs, owners, leading{}
	opts.Pod.Installation = "jetway"
	m := New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool { return m.Ready() == nil }, 5*time.Second, time.Millisecond)
	return testManager{Manager: m, records: recs, owners: owners}
}
