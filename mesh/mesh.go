package mesh

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/jetway-ci/jetway/internal/backoff"
)

// Options configure a Mesh.
type Options struct {
	// Identity is this member's certificate, key and mesh CA. Its name is
	// the member's name in the mesh.
	Identity *Identity
	// Kind is KindGateway (the default) or KindAgent; it must be the kind
	// Identity's certificate is for.
	Kind string
	// Listen is the address to accept peers on; empty: accept none (a
	// member behind NAT only dials out, and is a full member).
	Listen string
	// Peers are the addresses to dial: host:port, or dns:NAME:PORT for
	// every address NAME resolves to (a headless Service), resolved again
	// every ResolveEvery.
	Peers []string
	// ResolveEvery is how often dns: peers are resolved again; default 30s.
	ResolveEvery time.Duration
	// Resolve looks a host's addresses up; default net.DefaultResolver.
	Resolve func(ctx context.Context, host string) ([]string, error)
	// HTTP serves the HTTP requests peers send over the mesh; the peer's
	// name is in the request's context (Peer).
	HTTP http.Handler
	// Local is what this member announces: the targets it owns.
	Local Local
	// StallAfter is how long a lost peer's targets keep their last state
	// before they are listed stalled; default 15s.
	StallAfter time.Duration
	// LeaveOnStop tells the peers, when Start's context ends, that this
	// member leaves for good: they forget it and its targets at once
	// instead of keeping it as a lost peer. For members whose name never
	// comes back (a Deployment's pods, named after the pod).
	LeaveOnStop bool
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Dial connects to a peer's address; default a net.Dialer with TCP
	// keepalives.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// BulkConns is how many bulk sessions (docs/mesh.md) this member
	// dials beside each session it dialed, for volume streams; default 8.
	// Negative: none, volume streams share the session with calls.
	BulkConns int
	// MinBackoff and MaxBackoff bound the wait before a peer or a bulk
	// session is dialed again; default 100ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	Logger                 *slog.Logger
	Metrics                *Metrics
}

// Timeouts of the session setup; keepalives find a dead peer within
// keepAliveInterval + keepAliveTimeout.
const (
	dialTimeout       = 10 * time.Second
	handshakeTimeout  = 10 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveTimeout  = 5 * time.Second
	// stableSession is how long a session must last for the next dial
	// to start again from minBackoff.
	stableSession = time.Minute
)

// Each stream's receive window. One stream carries at most about
// window/2 per RTT, as yamux returns credit in half-window steps
// (docs/mesh.md, "yamux"; measured with make bench-mesh), so a volume stream's must be
// twice the bandwidth-delay product of the links between gateways: 16 MiB
// keeps up with a Linux-default TCP window (~4 MiB) at any RTT, and is 190
// MB/s at 40 ms. A session's own streams carry calls: a small window
// bounds what one large answer queues ahead of the others and the memory
// a slow reader pins.
// (Variables, so that the benchmark can measure others.)
var (
	callWindow uint32 = 1 << 20
	bulkWindow uint32 = 16 << 20
)

func yamuxConfig(window uint32) *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = keepAliveInterval
	c.ConnectionWriteTimeout = keepAliveTimeout
	c.MaxStreamWindowSize = window
	c.StreamOpenTimeout = handshakeTimeout
	c.LogOutput = io.Discard
	return c
}

// Mesh is this member's side of the mesh: the sessions with its peers,
// the routes they announced, and the streams between them.
type Mesh struct {
	opts Options
	name string

	mu  sync.Mutex
	ctx context.Context // Start's
	// live is the sessions' context: it ends once, Start's ended, the
	// calls under way have been answered.
	live     context.Context
	sessions map[string]*session  // live, by peer name
	lost     map[string]time.Time // peers whose session ended, and when
	learned  map[string][]Route   // what each peer announced, by peer
	addrs    map[string]string    // dialed address -> the peer found there
	changed  chan struct{}        // closed on any change of peers or routes
	wg       sync.WaitGroup

	conns     chan net.Conn   // HTTP streams for this member, to serve
	leave     atomic.Bool     // LeaveOnStop was called
	transport *http.Transport // API calls
	bulk      *http.Transport // volume streams
	ready     chan struct{}   // closed once Start listens
	addr      net.Addr
}

// New returns a Mesh; Start runs it.
func New(opts Options) (*Mesh, error) {
	if opts.Identity == nil {
		return nil, errors.New("mesh: no identity (--mesh-ca, --mesh-cert, --mesh-key)")
	}
	var err error
	if opts.Kind, err = opts.Identity.memberKind(opts.Kind); err != nil {
		return nil, err
	}
	if opts.ResolveEvery <= 0 {
		opts.ResolveEvery = 30 * time.Second
	}
	if opts.Resolve == nil {
		opts.Resolve = net.DefaultResolver.LookupHost
	}
	if opts.StallAfter <= 0 {
		opts.StallAfter = 15 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HTTP == nil {
		opts.HTTP = http.NotFoundHandler()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Dial == nil {
		opts.Dial = (&net.Dialer{KeepAlive: keepAliveInterval}).DialContext
	}
	if opts.BulkConns == 0 {
		opts.BulkConns = defaultBulkConns
	}
	opts.BulkConns = max(opts.BulkConns, 0)
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	for _, p := range opts.Peers {
		if _, _, _, err := splitPeer(p); err != nil {
			return nil, err
		}
	}
	opts.Identity.Observe(reportCertificate(opts.Logger, opts.Metrics))
	m := &Mesh{
		opts: opts, name: opts.Identity.Name(),
		sessions: map[string]*session{}, lost: map[string]time.Time{}, addrs: map[string]string{},
		learned: map[string][]Route{},
		changed: make(chan struct{}), conns: make(chan net.Conn), ready: make(chan struct{}),
	}
	m.transport, m.bulk = m.newTransport(streamHTTP), m.newTransport(streamVolume)
	return m, nil
}

// SetHTTP sets the handler of the calls peers send, before Start; for a
// handler that needs the Mesh first (the API forwards through it).
func (m *Mesh) SetHTTP(h http.Handler) { m.opts.HTTP = h }

// LeaveOnStop makes this member leave for good when Start's context ends,
// as Options.LeaveOnStop does: for a member that learns only while it
// runs that it will not come back (an agent that was retired).
func (m *Mesh) LeaveOnStop() { m.leave.Store(true) }

func (m *Mesh) leaving() bool { return m.opts.LeaveOnStop || m.leave.Load() }

// Metrics are the mesh's, for the API's forwarded calls.
func (m *Mesh) Metrics() *Metrics { return m.opts.Metrics }

// Name is this member's name in the mesh.
func (m *Mesh) Name() string { return m.name }

// Start listens and dials until ctx ends. Then it answers the calls under
// way (for at most stopGrace), closes every session, saying it leaves if
// it does, and returns once all its goroutines have.
func (m *Mesh) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("mesh: Start called twice")
	}
	m.ctx = ctx
	live, endSessions := context.WithCancel(context.WithoutCancel(ctx))
	defer endSessions()
	m.live = live
	m.mu.Unlock()
	var ln net.Listener
	if m.opts.Listen != "" {
		var err error
		if ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", m.opts.Listen); err != nil {
			return fmt.Errorf("mesh: listen on %s: %w", m.opts.Listen, err)
		}
		m.opts.Logger.Info("mesh listening", "address", ln.Addr().String(), "name", m.name)
		m.addr = ln.Addr()
		m.wg.Go(func() { m.accept(ctx, ln) })
	}
	close(m.ready)
	for _, p := range m.opts.Peers {
		host, port, dns, _ := splitPeer(p)
		if dns {
			m.wg.Go(func() { m.resolveLoop(ctx, host, port) })
			continue
		}
		m.wg.Go(func() { m.dialLoop(ctx, net.JoinHostPort(host, port)) })
	}
	m.wg.Go(func() { m.announceLoop(ctx) })
	served := make(chan struct{})
	m.wg.Go(func() {
		defer close(served)
		m.serve(ctx)
	})
	<-ctx.Done()
	m.transport.CloseIdleConnections()
	m.bulk.CloseIdleConnections()
	if ln != nil {
		ln.Close()
	}
	<-served // the calls under way answered, within stopGrace
	endSessions()
	if !m.leaving() { // else each session says so, then closes
		m.mu.Lock()
		for _, s := range m.sessions {
			s.close()
		}
		m.mu.Unlock()
	}
	m.wg.Wait()
	return nil
}

// Ready is closed once Start listens (and Addr answers).
func (m *Mesh) Ready() <-chan struct{} { return m.ready }

// Addr is where the mesh listens, once Ready; nil without --mesh-listen.
func (m *Mesh) Addr() net.Addr { return m.addr }

func (m *Mesh) accept(ctx context.Context, ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				m.opts.Logger.Error("mesh listener failed", "error", err.Error())
			}
			return
		}
		m.wg.Go(func() {
			if _, err := m.establish(ctx, tls.Server(conn, m.opts.Identity.ServerConfig()), nil); err != nil {
				m.opts.Logger.Warn("mesh peer refused", "remote", conn.RemoteAddr().String(), "error", err.Error())
			}
		})
	}
}

// dialLoop keeps a session with the peer at addr: it dials while there is
// none with whoever answers there, with jittered exponential backoff.
func (m *Mesh) dialLoop(ctx context.Context, addr string) {
	retryDelay := m.opts.MinBackoff
	for {
		if name := m.peerAt(addr); name == m.name {
			m.opts.Logger.Debug("mesh peer address is this member; not dialing it", "address", addr)
			return
		} else if name != "" {
			m.waitDown(ctx, name) // whichever side dialed it
		}
		if ctx.Err() != nil {
			return
		}
		start := m.opts.Now()
		s, err := m.dial(ctx, addr)
		if err != nil && ctx.Err() == nil {
			m.opts.Logger.Warn("mesh dial failed", "address", addr, "error", err.Error(), "retry_in", retryDelay.String())
		}
		if s != nil {
			select {
			case <-s.done:
			case <-ctx.Done():
			}
		}
		if m.opts.Now().Sub(start) > stableSession {
			retryDelay = m.opts.MinBackoff
		}
		if backoff.Sleep(ctx, backoff.Jitter(retryDelay*3/4, 1.0/3)) != nil {
			return
		}
		retryDelay = min(2*retryDelay, m.opts.MaxBackoff)
	}
}

// dial connects to addr and sets a session up.
func (m *Mesh) dial(ctx context.Context, addr string) (*session, error) {
	conn, err := m.dialTLS(ctx, addr, alpnSession)
	if err != nil {
		return nil, err
	}
	s, err := m.establish(ctx, conn, m.bulkDialer(addr))
	dup, isDup := errors.AsType[*DuplicateError](err)
	if s != nil || isDup || errors.Is(err, errSelf) {
		name := m.name
		switch {
		case s != nil:
			name = s.peer
		case isDup:
			name = dup.Peer // a peer reached at another address too: wait for that session
		}
		m.mu.Lock()
		m.addrs[addr] = name
		m.mu.Unlock()
	}
	if errors.Is(err, errSelf) {
		return nil, nil
	}
	return s, err
}

// dialTLS connects to addr, TLS offering the ALPN protocol alpn:
// alpnSession or alpnBulk.
func (m *Mesh) dialTLS(ctx context.Context, addr, alpn string) (*tls.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := m.opts.Dial(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := m.opts.Identity.ClientConfig()
	cfg.NextProtos = []string{alpn}
	return tls.Client(conn, cfg), nil
}

// errSelf is a dial that reached this member.
var errSelf = errors.New("mesh: dialed this member itself")

// establish runs the TLS handshake on conn, then sets the session up.
// redial is set when this side dialed: it makes the connections of bulk
// sessions. On the accepting side, a connection whose ALPN protocol is
// alpnBulk is a bulk session's.
func (m *Mesh) establish(ctx context.Context, conn *tls.Conn, redial redialFunc) (*session, error) {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		conn.Close()
		var refused *RefusedError
		if errors.As(err, &refused) {
			m.opts.Metrics.handshakeFailed(refused.Reason)
			return nil, err
		}
		m.opts.Metrics.handshakeFailed("tls")
		return nil, fmt.Errorf("TLS handshake with %s: %w", conn.RemoteAddr(), err)
	}
	peer := peerCertOf(conn.ConnectionState())
	if redial == nil && conn.ConnectionState().NegotiatedProtocol == alpnBulk {
		return nil, m.acceptBulk(ctx, conn, peer)
	}
	return m.setup(ctx, conn, peer, redial != nil, redial)
}

// setup runs yamux and the hello over conn, whose peer is authenticated by
// its certificate as peer, and registers the session. dialed says this
// side dialed; redial, if set, makes its bulk sessions' connections.
func (m *Mesh) setup(ctx context.Context, conn net.Conn, peer peerCert, dialed bool, redial redialFunc) (*session, error) {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	fail := func(reason string, err error) (*session, error) {
		conn.Close()
		m.opts.Metrics.handshakeFailed(reason)
		return nil, err
	}
	mux, err := newMux(conn, dialed)
	if err != nil {
		return fail("yamux", err)
	}
	var ctrl net.Conn
	if dialed {
		ctrl, err = mux.OpenStream()
	} else {
		ctrl, err = mux.AcceptStreamWithContext(hctx)
	}
	if err != nil {
		mux.Close()
		return fail("hello", fmt.Errorf("mesh control stream with %q: %w", peer.name, err))
	}
	ctrl.SetDeadline(time.Now().Add(handshakeTimeout))
	ours := hello{Version: Version, Name: m.name, Kind: m.opts.Kind, Session: rand.Text()}
	theirs, err := greet(ctrl, ours, peer)
	ctrl.SetDeadline(time.Time{})
	switch {
	case err == nil && theirs.Name == m.name:
		mux.Close()
		return nil, errSelf
	case err == nil && theirs.Session == "":
		err = fmt.Errorf("mesh hello: peer %q names no session", theirs.Name)
		fallthrough
	case err != nil:
		mux.Close()
		return fail(helloFailure(err), err)
	}
	dialer := peer.name
	if dialed {
		dialer = m.name
	}
	s := &session{m: m, peer: theirs.Name, kind: theirs.Kind, scope: peer.scope, dialer: dialer, mux: mux, ctrl: ctrl,
		since: m.opts.Now(), done: make(chan struct{}), ours: ours.Session, theirs: theirs.Session, redial: redial}
	s.ctx, s.cancel = context.WithCancel(m.live)
	if err := m.register(s); err != nil {
		if _, dup := errors.AsType[*DuplicateError](err); dup {
			m.opts.Metrics.handshakeFailed(RefusedDuplicate)
		}
		return nil, err
	}
	return s, nil
}

func newMux(conn net.Conn, dialed bool) (*yamux.Session, error) {
	if dialed {
		return yamux.Client(conn, yamuxConfig(callWindow))
	}
	return yamux.Server(conn, yamuxConfig(callWindow))
}

// DuplicateError is a session refused because one with its peer is live:
// the old one answered a ping. Whoever holds a member's key, a step on
// an agent's machine say, cannot take its place while it is there.
type DuplicateError struct{ Peer string }

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("mesh: a live session with %q exists; a second one is refused until it ends", e.Peer)
}

// register makes s the session with its peer, unless another one is live:
// of two sessions dialed by each side at once, both sides keep the one
// dialed by the member whose name sorts first; a session dialed by the
// same side as the one it finds replaces it only if the old one no
// longer answers a ping (that side lost it), else it is refused.
func (m *Mesh) register(s *session) error {
	m.mu.Lock()
	old := m.sessions[s.peer]
	m.mu.Unlock()
	replaced := false
	if old != nil {
		if _, err := old.mux.Ping(); err != nil {
			old.close()
			<-old.done
			replaced = true
		}
	}
	m.mu.Lock()
	old = m.sessions[s.peer]
	var err error
	switch {
	case m.ctx.Err() != nil:
		err = m.ctx.Err()
	case old != nil && old.dialer == s.dialer:
		err = &DuplicateError{Peer: s.peer}
	case old != nil && old.dialer < s.dialer:
		err = fmt.Errorf("mesh: a session with %q that %s dialed wins over the one %s dialed", s.peer, old.dialer, s.dialer)
	}
	if err != nil {
		m.mu.Unlock()
		s.mux.Close()
		s.cancel()
		return err
	}
	m.sessions[s.peer] = s
	delete(m.lost, s.peer)
	m.notify()
	m.mu.Unlock()
	if old != nil {
		old.close()
	}
	if replaced {
		m.opts.Logger.Warn("mesh peer's session replaced: the old one no longer answered", "peer", s.peer, "kind", s.kind, "dialed_by", s.dialer)
	}
	m.opts.Logger.Info("mesh peer joined", "peer", s.peer, "kind", s.kind, "dialed_by", s.dialer)
	m.opts.Metrics.sessionsChanged(m)
	m.wg.Go(s.run)
	return nil
}

// ended drops s, if it is still the session with its peer: a peer that
// said it leaves is forgotten with its routes, any other is lost.
func (m *Mesh) ended(s *session, err error) {
	left := errors.Is(err, errLeft)
	m.mu.Lock()
	current := m.sessions[s.peer] == s
	if current {
		delete(m.sessions, s.peer)
		if left {
			delete(m.learned, s.peer)
		} else {
			m.lost[s.peer] = m.opts.Now()
		}
		m.notify()
	}
	m.mu.Unlock()
	switch {
	case current && left:
		m.opts.Logger.Info("mesh peer left", "peer", s.peer)
		m.opts.Metrics.sessionsChanged(m)
	case current:
		m.opts.Logger.Warn("mesh peer lost", "peer", s.peer, "error", err.Error())
		m.opts.Metrics.sessionsChanged(m)
	}
}

// notify wakes whoever waits on a change. Called with m.mu held.
func (m *Mesh) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Changed is closed at the next change of peers or routes.
func (m *Mesh) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *Mesh) peerAt(addr string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addrs[addr]
}

// waitDown returns once there is no live session with peer.
func (m *Mesh) waitDown(ctx context.Context, peer string) {
	for {
		m.mu.Lock()
		s := m.sessions[peer]
		m.mu.Unlock()
		if s == nil {
			return
		}
		select {
		case <-s.done:
		case <-ctx.Done():
			return
		}
	}
}

// Peers are the members with a live session now, by name.
func (m *Mesh) Peers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.sessions))
	for name := range m.sessions {
		out = append(out, name)
	}
	return out
}

func (m *Mesh) session(peer string) *session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[peer]
}

// resolveLoop dials every address host resolves to, resolving it again
// every ResolveEvery: a new address gets a dial loop, a gone one's ends.
func (m *Mesh) resolveLoop(ctx context.Context, host, port string) {
	loops := map[string]context.CancelFunc{}
	defer func() {
		for _, cancel := range loops {
			cancel()
		}
	}()
	tick := time.NewTicker(m.opts.ResolveEvery)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, dialTimeout)
		addrs, err := m.opts.Resolve(rctx, host)
		cancel()
		if err != nil && ctx.Err() == nil {
			m.opts.Logger.Warn("mesh peers not resolved", "name", host, "error", err.Error())
		}
		if err == nil {
			seen := map[string]bool{}
			for _, a := range addrs {
				addr := net.JoinHostPort(a, port)
				seen[addr] = true
				if loops[addr] == nil {
					lctx, cancel := context.WithCancel(ctx)
					loops[addr] = cancel
					m.wg.Go(func() { m.dialLoop(lctx, addr) })
				}
			}
			for addr, cancel := range loops {
				if !seen[addr] {
					cancel()
					delete(loops, addr)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// splitPeer checks a --mesh-peers entry: host:port, or dns:NAME:PORT
// (dns).
func splitPeer(p string) (host, port string, dns bool, err error) {
	rest, dns := strings.CutPrefix(p, "dns:")
	host, port, err = net.SplitHostPort(rest)
	if err != nil || host == "" || port == "" {
		return "", "", false, fmt.Errorf("mesh peer %q: want host:port or dns:NAME:PORT", p)
	}
	return host, port, dns, nil
}
