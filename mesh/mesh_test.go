package mesh

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/targets"
)

// fakeLocal is a member's own targets.
type fakeLocal struct {
	mu      sync.Mutex
	ts      []targets.Status
	changed chan struct{}
}

func newLocal(names ...string) *fakeLocal {
	l := &fakeLocal{changed: make(chan struct{})}
	for _, n := range names {
		l.ts = append(l.ts, targets.Status{Name: n, Server: "https://" + n + ".example:6443", State: targets.StateRunning,
			Meta: targets.Metadata{Namespace: "ci", Team: "main", Platform: "linux"}})
	}
	return l
}

func (l *fakeLocal) Snapshot() []targets.Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]targets.Status(nil), l.ts...)
}

func (l *fakeLocal) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *fakeLocal) set(state targets.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.ts {
		l.ts[i].State = state
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// member is a started Mesh and what it was given.
type member struct {
	*Mesh
	local   *fakeLocal
	metrics *Metrics
	reg     *prometheus.Registry
	stop    func()
}

type memberOpts struct {
	listen   bool
	peers    []string
	now      func() time.Time
	identity *Identity
	kind     string
}

// startMember starts a member named name of the mesh of c, owning the
// targets named owns; it answers HTTP with its own name and the caller's.
func startMember(t *testing.T, c *ca, name string, o memberOpts, owns ...string) *member {
	t.Helper()
	id := o.identity
	if id == nil {
		id = c.member(t, name, time.Now().Add(time.Hour))
	}
	reg := prometheus.NewRegistry()
	mb := &member{local: newLocal(owns...), metrics: NewMetrics(reg), reg: reg}
	opts := Options{Identity: id, Kind: o.kind, Peers: o.peers, Local: mb.local, Now: o.now, Metrics: mb.metrics,
		HTTP: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			peer, _ := Peer(r.Context())
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s from %s: %s", name, r.URL.Path, peer, body)
		})}
	if o.listen {
		opts.Listen = "127.0.0.1:0"
	}
	m, err := New(opts)
	require.NoError(t, err)
	mb.Mesh = m
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	select {
	case <-m.Ready():
	case err := <-done:
		t.Fatalf("start %s: %v", name, err)
	}
	var once sync.Once
	mb.stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(mb.stop)
	return mb
}

// eventually waits for cond, each time the mesh changes or 10 ms pass.
func eventually(t *testing.T, m *member, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-m.Changed():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func remoteNames(m *member) []string {
	var out []string
	for _, r := range m.Remotes() {
		out = append(out, r.Owner+"/"+r.Target.Name+"="+r.Target.State)
	}
	return out
}

// testConnTypes runs f with a session between two members over each kind
// of connection yamux's own tests use: net.Pipe, loopback TCP, and TLS
// over it (the only kind the mesh dials; the others show the sessions do
// not depend on it).
func testConnTypes(t *testing.T, f func(t *testing.T, a, b *member)) {
	kinds := map[string]func(t *testing.T, a, b *member){
		"pipe": func(t *testing.T, a, b *member) {
			ca, cb := net.Pipe()
			connect(t, a, b, ca, cb)
		},
		"tcp": func(t *testing.T, a, b *member) {
			ca, cb := connPair(t)
			connect(t, a, b, ca, cb)
		},
		"tls": func(t *testing.T, a, b *member) {
			ca, cb := connPair(t)
			errc := make(chan error, 1)
			go func() {
				_, err := b.establish(context.Background(), tls.Server(cb, b.opts.Identity.ServerConfig()), false)
				errc <- err
			}()
			_, err := a.establish(context.Background(), tls.Client(ca, a.opts.Identity.ClientConfig()), true)
			require.NoError(t, err)
			require.NoError(t, <-errc)
		},
	}
	for _, kind := range []string{"pipe", "tcp", "tls"} {
		t.Run(kind, func(t *testing.T) {
			c := newCA(t, "mesh-ca")
			a := startMember(t, c, "a", memberOpts{}, "a1")
			b := startMember(t, c, "b", memberOpts{}, "b1", "b2")
			kinds[kind](t, a, b)
			f(t, a, b)
		})
	}
}

// connect sets a session up over a plain connection, each side taking the
// other's name as authenticated.
func connect(t *testing.T, a, b *member, ca, cb net.Conn) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := b.setup(context.Background(), cb, a.Name(), false)
		errc <- err
	}()
	_, err := a.setup(context.Background(), ca, b.Name(), true)
	require.NoError(t, err)
	require.NoError(t, <-errc)
}

func TestSessionsCarryRoutesAndCalls(t *testing.T) {
	testConnTypes(t, func(t *testing.T, a, b *member) {
		eventually(t, a, "b's targets at a", func() bool { return len(a.Remotes()) == 2 })
		eventually(t, b, "a's targets at b", func() bool { return len(b.Remotes()) == 1 })
		assert.Equal(t, []string{"b/b1=running", "b/b2=running"}, remoteNames(a))
		assert.Equal(t, []string{"a/a1=running"}, remoteNames(b))

		// A change is announced.
		b.local.set(targets.StateLanding)
		eventually(t, a, "b's targets landing", func() bool {
			return strings.Join(remoteNames(a), ",") == "b/b1=landing,b/b2=landing"
		})

		// An HTTP call goes to its member, which knows who sent it.
		resp, err := a.Client().Post("http://b/api/v1/x", "text/plain", strings.NewReader("hi"))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, "b /api/v1/x from a: hi", string(body))
		assert.Positive(t, testutil.ToFloat64(a.metrics.streams))
	})
}

func TestAMalformedFrameClosesThatSessionOnly(t *testing.T) {
	testConnTypes(t, func(t *testing.T, a, b *member) {
		c := newCA(t, "other")
		d := startMember(t, c, "d", memberOpts{}, "d1")
		p, q := net.Pipe()
		connect(t, b, d, p, q)
		eventually(t, b, "both peers' targets", func() bool { return len(b.Remotes()) == 2 })

		// a writes a frame longer than any may be on its control stream.
		s := a.session("b")
		require.NotNil(t, s)
		s.wmu.Lock()
		_, err := s.ctrl.Write([]byte{0xff, 0xff, 0xff, 0xff})
		s.wmu.Unlock()
		require.NoError(t, err)

		eventually(t, b, "a's session closed", func() bool { return b.session("a") == nil })
		assert.NotNil(t, b.session("d"), "d's session is not touched")
		assert.Equal(t, 1.0, testutil.ToFloat64(b.metrics.malformedFrames))
		resp, err := b.Client().Get("http://d/still")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	})
}
