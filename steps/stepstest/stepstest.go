// Package stepstest has what tests of the step engine and of its users
// need in place of a state namespace and of clusters: records kept in
// memory, the gateways' liveness and the placer Lease as a test says, and
// targets whose clusters never answer. It is for pure logic; the real
// ones are tested against real API servers (integration).
package stepstest

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/watchcache"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Installation is the installation the helpers' records belong to.
const Installation = "jetway"

// Records keeps step records in memory, with the Store's semantics: names
// by steps.RecordName, a write at a version, a change after every write.
type Records struct {
	mu      sync.Mutex
	recs    map[string]*steps.Record
	data    map[string]map[string][]byte
	version int
	unread  bool
	changes watchcache.Broadcast
}

// NewRecords makes empty records, listed.
func NewRecords() *Records {
	return &Records{recs: map[string]*steps.Record{}, data: map[string]map[string][]byte{}}
}

// Unread makes Synced report false, as before a first list.
func (m *Records) Unread() { m.mu.Lock(); m.unread = true; m.mu.Unlock() }

func (m *Records) Synced() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.unread, nil
}

func (m *Records) Changed() <-chan struct{} { return m.changes.Wait() }

func (m *Records) Get(name string) (*steps.Record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[name]
	return r, ok
}

func (m *Records) List() []*steps.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*steps.Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r)
	}
	return out
}

func (m *Records) Create(_ context.Context, sum steps.Summary, st steps.Status, request []byte) (*steps.Record, bool, error) {
	name := steps.RecordName(Installation, sum.Team, sum.Handle)
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.recs[name]; ok {
		return r, false, nil
	}
	m.version++
	r := &steps.Record{Summary: sum, Status: st}
	r.Name, r.ResourceVersion = name, strconv.Itoa(m.version)
	m.recs[name] = r
	m.data[name] = map[string][]byte{"request": request}
	m.changes.Notify()
	return r, true, nil
}

func (m *Records) Update(_ context.Context, name string, change func(r *steps.Record) error) (*steps.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.recs[name]
	if !ok {
		return nil, steps.ErrRecordGone
	}
	next := cur.Copy()
	if err := change(next); err != nil {
		if errors.Is(err, steps.ErrUnchanged) {
			return cur, nil
		}
		return cur, err
	}
	m.version++
	next.ResourceVersion = strconv.Itoa(m.version)
	if res := next.NewResult(); res != nil {
		m.data[name]["result"] = res
	}
	m.recs[name] = next.Copy()
	m.changes.Notify()
	return m.recs[name], nil
}

func (m *Records) Request(_ context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data[name]["request"], nil
}

func (m *Records) Result(_ context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data[name]["result"], nil
}

func (m *Records) Delete(_ context.Context, r *steps.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, r.Name)
	m.changes.Notify()
	return nil
}

func (m *Records) Refresh(context.Context) error { return nil }

// Request is the request a record holds, decoded.
func (m *Records) DecodedRequest(t *testing.T, name string) wire.Request {
	raw, err := m.Request(context.Background(), name)
	require.NoError(t, err)
	var req wire.Request
	require.NoError(t, json.Unmarshal(raw, &req))
	return req
}

// Owners is the gateways' liveness as a test says it is.
type Owners struct {
	me string

	mu   sync.Mutex
	dead map[string]bool
	ch   watchcache.Broadcast
}

// NewOwners has every gateway alive; this one is me.
func NewOwners(me string) *Owners { return &Owners{me: me, dead: map[string]bool{}} }

func (o *Owners) Me() string { return o.me }
func (o *Owners) Alive(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.dead[id]
}
func (o *Owners) Valid() bool              { return o.Alive(o.me) }
func (o *Owners) Synced() bool             { return true }
func (o *Owners) Changed() <-chan struct{} { return o.ch.Wait() }

// Kill says gateway id is gone.
func (o *Owners) Kill(id string) {
	o.mu.Lock()
	o.dead[id] = true
	o.mu.Unlock()
	o.ch.Notify()
}

// Leading always leads.
type Leading struct{}

func (Leading) Leading() (context.Context, bool) { return context.Background(), true }
func (Leading) Changed() <-chan struct{}         { return nil }

// Registry has targets whose statuses the test sets; their watches never
// list, so every step placed on them counts as placed and unseen.
type Registry struct {
	host string // of the targets' API servers

	mu       sync.Mutex
	statuses []targets.Status
	targets  map[string]*targets.Target
	ch       watchcache.Broadcast
}

// NewRegistry has targets whose API servers refuse every connection: a
// step placed on them fails to make its pod.
func NewRegistry(t *testing.T, statuses ...targets.Status) *Registry {
	r := &Registry{host: "https://127.0.0.1:1", targets: map[string]*targets.Target{}}
	r.Set(t, statuses...)
	return r
}

// SilentRegistry has targets whose API servers take connections and never
// answer: a step placed on them stays starting.
func SilentRegistry(t *testing.T, statuses ...targets.Status) *Registry {
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
	r := &Registry{host: "https://" + ln.Addr().String(), targets: map[string]*targets.Target{}}
	r.Set(t, statuses...)
	return r
}

// Set makes the registry hold statuses.
func (r *Registry) Set(t *testing.T, statuses ...targets.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = statuses
	for _, st := range statuses {
		if r.targets[st.Name] == nil {
			tg, err := targets.NewTarget(&targets.Config{Name: st.Name, Meta: st.Meta, REST: &rest.Config{Host: r.host}}, Installation)
			require.NoError(t, err)
			r.targets[st.Name] = tg
		}
	}
	r.ch.Notify()
}

func (*Registry) Loaded() bool { return true }
func (r *Registry) Snapshot() []targets.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]targets.Status(nil), r.statuses...)
}
func (r *Registry) Target(name string) (*targets.Target, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.statuses {
		if st.Name == name {
			return r.targets[name], nil
		}
	}
	return nil, targets.ErrNotFound
}
func (r *Registry) Changed() <-chan struct{} { return r.ch.Wait() }

// Running is a running target's status; its platform linux unless meta
// says.
func Running(name string, meta targets.Metadata) targets.Status {
	if meta.Platform == "" {
		meta.Platform = "linux"
	}
	return targets.Status{Name: name, State: targets.StateRunning, Meta: meta}
}

// Manager is a steps.Manager over Records, started.
type Manager struct {
	*steps.Manager
	Records *Records
	Owners  *Owners
}

// Start starts a manager with opts over Records, Owners (this gateway
// gw-a) and Leading (and Registry with no targets if opts has none),
// stopped at the end of the test, and waits until it takes steps.
func Start(t *testing.T, opts steps.Options) Manager {
	t.Helper()
	recs, owners := NewRecords(), NewOwners("gw-a")
	if opts.Registry == nil {
		opts.Registry = NewRegistry(t)
	}
	opts.Records, opts.Owners, opts.Leader = recs, owners, Leading{}
	opts.Pod.Installation = Installation
	m := steps.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool { return m.Ready() == nil }, 5*time.Second, time.Millisecond)
	return Manager{Manager: m, Records: recs, Owners: owners}
}
