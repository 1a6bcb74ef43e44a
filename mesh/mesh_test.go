package mesh

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
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

// update changes every target's status as change says, and announces it.
func (l *fakeLocal) update(change func(*targets.Status)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.ts {
		change(&l.ts[i])
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// memberLogger logs to the test, and in JSON to also if set.
func memberLogger(t *testing.T, also io.Writer) *slog.Logger {
	if also == nil {
		return slog.New(slog.NewTextHandler(tWriter{t}, nil))
	}
	return slog.New(slog.NewJSONHandler(io.MultiWriter(tWriter{t}, also), nil))
}

// tWriter logs to the test.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
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
	hello    string                                                            // the kind its hello says, if not kind (a peer that lies)
	bulk     int                                                               // Options.BulkConns
	backoff  time.Duration                                                     // Options.MinBackoff and MaxBackoff
	handler  http.Handler                                                      // instead of the echo
	dial     func(ctx context.Context, network, addr string) (net.Conn, error) // Options.Dial
	leave    bool                                                              // Options.LeaveOnStop
	log      io.Writer                                                         // also gets the member's log, in JSON
}

// startMember starts a member named name of the mesh of c, owning the
// targets named owns; it answers HTTP with its own name and the caller's.
func startMember(t *testing.T, c *ca, name string, o memberOpts, owns ...string) *member {
	t.Helper()
	id := o.identity
	switch {
	case id == nil && o.kind == KindAgent:
		id = issuedAs(t, c, name, roleAgent, scopeGlobal)
	case id == nil:
		id = issued(t, c, name, time.Now().Add(time.Hour))
	}
	reg := prometheus.NewRegistry()
	mb := &member{local: newLocal(owns...), metrics: NewMetrics(reg), reg: reg}
	opts := Options{Identity: id, Kind: o.kind, Peers: o.peers, Local: mb.local, Now: o.now, Metrics: mb.metrics,
		Logger:    memberLogger(t, o.log).With("member", name),
		BulkConns: o.bulk, MinBackoff: o.backoff, MaxBackoff: o.backoff, Dial: o.dial,
		HTTP: o.handler, LeaveOnStop: o.leave}
	if opts.HTTP == nil {
		opts.HTTP = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			peer, _ := Peer(r.Context())
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s from %s: %s", name, r.URL.Path, peer, body)
		})
	}
	if o.listen {
		opts.Listen = "127.0.0.1:0"
	}
	m, err := New(opts)
	require.NoError(t, err)
	if o.hello != "" {
		m.opts.Kind = o.hello
	}
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
// not depend on it). a dials; its bulk sessions' connections are of the
// same kind.
func testConnTypes(t *testing.T, f func(t *testing.T, a, b *member)) {
	for _, kind := range []connKind{pipeConns, tcpConns, tlsConns} {
		t.Run(kind.name, func(t *testing.T) {
			c := newCA(t, "mesh-ca")
			a := startMember(t, c, "a", memberOpts{}, "a1")
			b := startMember(t, c, "b", memberOpts{}, "b1", "b2")
			kind.connect(t, a, b)
			f(t, a, b)
		})
	}
}

// A connKind connects two members, a dialing, over one kind of
// connection.
type connKind struct {
	name string
	// pair makes a connection: a's end, b's end.
	pair func() (net.Conn, net.Conn, error)
	tls  bool
}

var (
	pipeConns = connKind{name: "pipe", pair: func() (net.Conn, net.Conn, error) {
		p, q := net.Pipe()
		return p, q, nil
	}}
	tcpConns = connKind{name: "tcp", pair: tcpPair}
	tlsConns = connKind{name: "tls", pair: tcpPair, tls: true}
)

// connect sets a session up from a to b; its bulk sessions connect the
// same way.
func (k connKind) connect(t *testing.T, a, b *member) {
	t.Helper()
	ca, cb, err := k.pair()
	require.NoError(t, err)
	var accepting sync.WaitGroup
	t.Cleanup(accepting.Wait)
	errc := make(chan error, 1)
	accepting.Go(func() {
		var err error
		if k.tls {
			_, err = b.establish(context.Background(), tls.Server(cb, b.opts.Identity.ServerConfig()), nil)
		} else {
			_, err = b.setup(context.Background(), cb, a.cert(), false, nil)
		}
		errc <- err
	})
	redial := k.redial(a, b, &accepting)
	if k.tls {
		_, err = a.establish(context.Background(), tls.Client(ca, a.clientConfig(alpnSession)), redial)
	} else {
		_, err = a.setup(context.Background(), ca, b.cert(), true, redial)
	}
	require.NoError(t, err)
	require.NoError(t, <-errc)
}

// redial makes a's bulk connections to b; b takes each in a goroutine of
// accepting.
func (k connKind) redial(a, b *member, accepting *sync.WaitGroup) redialFunc {
	return func(ctx context.Context) (net.Conn, peerCert, error) {
		ca, cb, err := k.pair()
		if err != nil {
			return nil, peerCert{}, err
		}
		if !k.tls {
			accepting.Go(func() { _ = b.acceptBulk(ctx, cb, a.cert()) })
			return ca, b.cert(), nil
		}
		accepting.Go(func() {
			_, _ = b.establish(ctx, tls.Server(cb, b.opts.Identity.ServerConfig()), nil)
		})
		c := tls.Client(ca, a.clientConfig(alpnBulk))
		if err := c.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, peerCert{}, err
		}
		return c, peerCertOf(c.ConnectionState()), nil
	}
}

// cert is what m's certificate says, as a peer's handshake finds it.
func (m *member) cert() peerCert {
	return peerCert{name: m.Name(), kind: m.opts.Identity.Kind()}
}

func (m *member) clientConfig(alpn string) *tls.Config {
	cfg := m.opts.Identity.ClientConfig()
	cfg.NextProtos = []string{alpn}
	return cfg
}

// tcpPair is connPair without a test to fail.
func tcpPair() (net.Conn, net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		acc <- accepted{c, err}
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	b := <-acc
	if b.err != nil {
		a.Close()
		return nil, nil, b.err
	}
	return a, b.c, nil
}

// connect sets a session up over a plain connection, each side taking the
// other's name as authenticated; it has no bulk sessions.
func connect(t *testing.T, a, b *member, ca, cb net.Conn) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := b.setup(context.Background(), cb, a.cert(), false, nil)
		errc <- err
	}()
	_, err := a.setup(context.Background(), ca, b.cert(), true, nil)
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
		_, _ = s.ctrl.Write([]byte{0xff, 0xff, 0xff, 0xff}) // b may close the session before Write returns
		s.wmu.Unlock()

		eventually(t, b, "a's session closed", func() bool { return b.session("a") == nil })
		assert.NotNil(t, b.session("d"), "d's session is not touched")
		assert.Equal(t, 1.0, testutil.ToFloat64(b.metrics.malformedFrames))
		resp, err := b.Client().Get("http://d/still")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	})
}

func TestSimultaneousDialsResolveToOneSession(t *testing.T) {
	c := newCA(t, "mesh-ca")
	// Each listens and dials the other: both keep the same session.
	a := startMember(t, c, "a", memberOpts{listen: true}, "a1")
	b := startMember(t, c, "b", memberOpts{listen: true, peers: []string{a.Addr().String()}}, "b1")
	// a learns b's address only now, as an operator adding it would.
	a2 := startMember(t, c, "c", memberOpts{peers: []string{a.Addr().String(), b.Addr().String()}}, "c1")
	eventually(t, a2, "c sees every target", func() bool { return len(a2.Remotes()) == 2 })
	eventually(t, a, "a has both peers", func() bool { return len(a.Peers()) == 2 })
	sa, sb := a.session("b"), b.session("a")
	require.NotNil(t, sa)
	require.NotNil(t, sb)
	assert.Equal(t, sa.dialer, sb.dialer, "both sides keep the session one side dialed")
}

func TestDialsEachOtherAtOnce(t *testing.T) {
	c := newCA(t, "mesh-ca")
	for range 5 {
		// Listeners first, then two members dialing each other at once.
		la, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lb, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addrA, addrB := la.Addr().String(), lb.Addr().String()
		la.Close()
		lb.Close()
		ida, idb := issued(t, c, "a", time.Now().Add(time.Hour)), issued(t, c, "b", time.Now().Add(time.Hour))
		a := startAt(t, ida, addrA, addrB)
		b := startAt(t, idb, addrB, addrA)
		eventually(t, a, "a and b joined", func() bool { return a.session("b") != nil && b.session("a") != nil })
		// Whatever raced, they settle on one session, and stay on it: a's,
		// as a sorts first. (b's may be the only one for a moment, at both
		// sides, while a's dial is still under way.)
		eventually(t, a, "one session", func() bool {
			sa, sb := a.session("b"), b.session("a")
			return sa != nil && sb != nil && sa.dialer == "a" && sb.dialer == "a"
		})
		resp, err := a.Client().Get("http://b/x")
		require.NoError(t, err)
		resp.Body.Close()
		a.stop()
		b.stop()
	}
}

// startAt starts a member with id listening on listen and dialing peers.
func startAt(t *testing.T, id *Identity, listen string, peers ...string) *member {
	t.Helper()
	m, err := New(Options{Identity: id, Listen: listen, Peers: peers,
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil)).With("member", id.Name())})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	select {
	case <-m.Ready():
	case err := <-done:
		t.Fatalf("start: %v", err)
	}
	var once sync.Once
	mb := &member{Mesh: m, stop: func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}}
	t.Cleanup(mb.stop)
	return mb
}

func TestStrangersAreRefusedAndSeeNoTarget(t *testing.T) {
	c, foreign := newCA(t, "mesh-ca"), newCA(t, "foreign-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	cases := map[string]struct {
		id     *Identity
		reason string
	}{
		"foreign CA": {memberTrusting(t, foreign, c, "intruder", time.Now().Add(time.Hour)), RefusedUnknownCA},
		"expired":    {issued(t, c, "late", time.Now().Add(-time.Minute)), RefusedExpired},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := startMember(t, c, "x", memberOpts{identity: tc.id, peers: []string{hub.Addr().String()}}, "x1")
			eventually(t, hub, "the refusal counted", func() bool {
				return testutil.ToFloat64(hub.metrics.handshakes.WithLabelValues(tc.reason)) >= 1
			})
			assert.Empty(t, m.Remotes(), "a refused peer learns no target")
			assert.Empty(t, hub.Peers())
			m.stop()
		})
	}
}

// A peer presenting a certificate that does not say what it is for is
// refused and counted by its reason.
func TestBadCertificatesAreCounted(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	for name, tt := range badCertificates {
		t.Run(name, func(t *testing.T) {
			before := testutil.ToFloat64(hub.metrics.handshakes.WithLabelValues(tt.reason))
			cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{alpnSession},
				Certificates: []tls.Certificate{presentingWith(t, c, "odd", tt.change)}}
			conn, err := tls.Dial("tcp", hub.Addr().String(), cfg)
			if err == nil {
				_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the refusal comes as an alert
				conn.Close()
			}
			assert.Error(t, err)
			eventually(t, hub, "the refusal counted", func() bool {
				return testutil.ToFloat64(hub.metrics.handshakes.WithLabelValues(tt.reason)) == before+1
			})
			assert.Empty(t, hub.Peers())
		})
	}
}

func TestALostPeerRedialsAndItsTargetsStallMeanwhile(t *testing.T) {
	c := newCA(t, "mesh-ca")
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	hubID := issued(t, c, "hub", time.Now().Add(time.Hour))
	hub := startMember(t, c, "hub", memberOpts{listen: true, identity: hubID}, "h1")
	addr := hub.Addr().String()
	spoke := startMember(t, c, "spoke", memberOpts{peers: []string{addr}, now: clock}, "s1")
	eventually(t, spoke, "the hub's targets", func() bool { return len(spoke.Remotes()) == 1 })

	hub.stop()
	eventually(t, spoke, "the hub lost", func() bool { return len(spoke.Peers()) == 0 })
	r := spoke.Remotes()
	require.Len(t, r, 1)
	assert.Equal(t, "running", r[0].Target.State, "within the stall threshold a lost peer's targets keep their state")
	assert.False(t, r[0].Reachable)
	_, err := spoke.Client().Get("http://hub/x")
	assert.ErrorIs(t, err, ErrUnreachable, "a call to a lost member fails at once")
	assert.ErrorContains(t, err, `"hub" is unreachable since`)

	mu.Lock()
	now = now.Add(16 * time.Second)
	mu.Unlock()
	r = spoke.Remotes()
	require.Len(t, r, 1)
	assert.Equal(t, StateStalled, r[0].Target.State)
	assert.Contains(t, r[0].Target.Error, "its owner hub is unreachable")

	// The hub comes back on its address; the spoke dials it again.
	startAt(t, hubID, addr)
	eventually(t, spoke, "the hub back", func() bool { return len(spoke.Peers()) == 1 })
	resp, err := spoke.Client().Get("http://hub/x")
	require.NoError(t, err)
	resp.Body.Close()
}

// TestALeavingPeerIsForgotten: a member stopping with LeaveOnStop (a pod
// whose name never returns) says so, and its peers forget it and its
// targets at once; neither lost nor stalled, it leaves no ghost behind.
// Without LeaveOnStop the same stop leaves a lost peer (the test above).
func TestALeavingPeerIsForgotten(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	pod := startMember(t, c, "jetway-7d9f-abcde", memberOpts{peers: []string{hub.Addr().String()}, leave: true}, "p1")
	eventually(t, hub, "the pod's targets", func() bool { return len(hub.Remotes()) == 1 })

	pod.stop()
	eventually(t, hub, "the pod gone", func() bool { return len(hub.Peers()) == 0 })
	assert.Empty(t, hub.Remotes(), "a peer that left is forgotten with its targets")
	assert.Equal(t, 0.0, testutil.ToFloat64(hub.metrics.peers.WithLabelValues("lost")))
}

// answerPad is 8 call windows (callWindow) of answer.
const answerPad = 8 << 20

// A member that stops answers the calls under way before its sessions
// close, leaving or not: an agent that a call retires answers that call,
// then leaves.
func TestAStoppingMemberAnswersTheCallsUnderWay(t *testing.T) {
	for _, leave := range []bool{true, false} {
		t.Run(fmt.Sprintf("leave=%v", leave), func(t *testing.T) {
			c := newCA(t, "mesh-ca")
			hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
			var pod *member
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				go pod.stop() // as a retired agent does
				<-pod.ctx.Done()
				// An answer many flow-control windows long: it gets
				// through only if the session outlives the stop's start.
				w.Write(bytes.Repeat([]byte{'.'}, answerPad))
				fmt.Fprint(w, "retired")
			})
			pod = startMember(t, c, "pod", memberOpts{peers: []string{hub.Addr().String()}, leave: leave, handler: handler}, "p1")
			eventually(t, hub, "the pod's targets", func() bool { return len(hub.Remotes()) == 1 })

			resp, err := hub.Client().Post("http://pod/retire", "text/plain", nil)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Len(t, body, answerPad+len("retired"))
			assert.Equal(t, "retired", string(body[answerPad:]))
			eventually(t, hub, "the pod gone", func() bool { return hub.session("pod") == nil })
			assert.Equal(t, !leave, len(hub.Remotes()) == 1, "a leaving member is forgotten, another is lost")
		})
	}
}

func TestAStarListsEveryTargetAndRelaysCalls(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	a := startMember(t, c, "a", memberOpts{peers: []string{hub.Addr().String()}}, "a1")
	b := startMember(t, c, "b", memberOpts{peers: []string{hub.Addr().String()}}, "b1", "b2")
	for _, m := range []*member{hub, a, b} {
		eventually(t, m, m.Name()+" lists every target", func() bool { return len(m.Remotes())+len(m.local.ts) == 4 })
	}
	assert.Equal(t, []string{"b/b1=running", "b/b2=running", "hub/h1=running"}, remoteNames(a))
	for _, r := range a.Remotes() {
		assert.Equal(t, "hub", r.Via)
	}

	resp, err := a.Client().Post("http://b/steps", "text/plain", strings.NewReader("through the hub"))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "b /steps from a: through the hub", string(body), "b sees who made the call")

	// A spoke gone: the other's call through the hub fails, naming it.
	b.stop()
	eventually(t, hub, "b lost at the hub", func() bool { return hub.session("b") == nil })
	eventually(t, a, "b unreachable at a", func() bool {
		for _, r := range a.Remotes() {
			if r.Owner == "b" && r.Reachable {
				return false
			}
		}
		return true
	})
	resp, err = a.Client().Get("http://b/x")
	if err == nil {
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assert.Contains(t, string(body), `mesh member \"b\" is unreachable`)
	} else {
		assert.ErrorIs(t, err, ErrUnreachable)
	}
}

func TestAPeerSpeakingANewerVersionIsRefused(t *testing.T) {
	c := newCA(t, "mesh-ca")
	a := startMember(t, c, "a", memberOpts{}, "a1")
	p, q := net.Pipe()
	errc := make(chan error, 1)
	go func() {
		_, err := a.setup(context.Background(), p, peerCert{name: "b", kind: KindGateway}, false, nil)
		errc <- err
	}()
	mux, err := newMux(q, true)
	require.NoError(t, err)
	defer mux.Close()
	ctrl, err := mux.OpenStream()
	require.NoError(t, err)
	// The fake peer's side may see the session closed before a's hello.
	_, _ = greet(ctrl, hello{Version: Version + 1, Name: "b", Kind: KindGateway}, a.cert())
	err = <-errc
	assert.ErrorIs(t, err, ErrVersion)
	assert.ErrorContains(t, err, `peer "b" speaks mesh version 2`)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.handshakes.WithLabelValues("version")))
}

func TestAnnouncementsAPeerMayNotMakeAreRefused(t *testing.T) {
	c := newCA(t, "mesh-ca")
	a := startMember(t, c, "a", memberOpts{}, "a1")
	b := startMember(t, c, "b", memberOpts{}, "b1")
	p, q := net.Pipe()
	connect(t, a, b, p, q)
	eventually(t, a, "b's target", func() bool { return len(a.Remotes()) == 1 })
	s := b.session("a")
	s.announce([]Route{
		{Owner: "b", Target: Target{Name: "b1", State: "running"}},
		{Owner: "a", Target: Target{Name: "a1", State: "stalled"}}, // a's own
		{Owner: "b", Target: Target{}},                             // no name
	})
	eventually(t, a, "refusals counted", func() bool {
		return testutil.ToFloat64(a.metrics.refused.WithLabelValues(refusedOurs)) == 1 &&
			testutil.ToFloat64(a.metrics.refused.WithLabelValues(refusedInvalid)) == 1
	})
	assert.Equal(t, []string{"b/b1=running"}, remoteNames(a))
}

// TestARouteCarriesTheTargetsPrivilegePolicy: a target's
// steps.allowPrivileged goes out in its route and comes back in its
// status, so every gateway places a privileged step only where it may run.
func TestARouteCarriesTheTargetsPrivilegePolicy(t *testing.T) {
	for _, allow := range []bool{true, false} {
		st := targets.Status{Name: "eu-1", State: targets.StateRunning,
			Meta: targets.Metadata{Namespace: "ci", Platform: "linux", Steps: targets.StepPolicy{AllowPrivileged: allow}}}
		assert.Equal(t, allow, announced(st).Status().Meta.Steps.AllowPrivileged)
	}
}
