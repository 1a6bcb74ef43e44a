package mesh

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Stream types (docs/mesh.md). Every stream but the control stream starts
// with a header naming its type and the member it is for. Both carry one
// HTTP exchange: streamHTTP an API call, streamVolume a volume stream's
// bytes (bulk, which must not hold calls up).
const (
	streamHTTP   = "http"
	streamVolume = "volume"
)

// header opens a stream.
type header struct {
	Type string `json:"type"`
	// To is the member the stream is for: the peer that accepts it, or a
	// member it relays to (one hop).
	To string `json:"to"`
	// From and FromKind, on a stream a gateway relays, are the member it
	// relays it for and its kind: the origin of the calls it carries.
	// Believed only from a gateway.
	From     string `json:"from,omitempty"`
	FromKind string `json:"from_kind,omitempty"`
}

// origin is the member that made the calls a stream carries: the peer
// that opened it, or the member a gateway relays it for.
type origin struct{ name, kind string }

// errForgedOrigin is a stream header naming an origin its sender may not
// name: only a gateway relays.
var errForgedOrigin = fmt.Errorf("%w: a stream header names an origin its sender may not", ErrMalformed)

// originOf is the origin of a stream that came from s with header h.
func originOf(s *session, h header) (origin, error) {
	switch {
	case h.From == "" && h.FromKind == "":
		return origin{s.peer, s.kind}, nil
	case s.kind != KindGateway:
		return origin{}, fmt.Errorf("%w: %s %q named %q of kind %q; only a gateway relays", errForgedOrigin, s.kind, s.peer, h.From, h.FromKind)
	case h.From == "" || h.FromKind != KindGateway && h.FromKind != KindAgent:
		return origin{}, fmt.Errorf("%w: %q named %q of kind %q", errForgedOrigin, s.peer, h.From, h.FromKind)
	}
	return origin{h.From, h.FromKind}, nil
}

// ErrUnreachable is a member no live session leads to.
var ErrUnreachable = errors.New("unreachable over the mesh")

// UnreachableError names the member that cannot be reached, and since when.
type UnreachableError struct {
	Member string
	Since  time.Time // zero: never reached
}

func (e *UnreachableError) Error() string {
	if e.Since.IsZero() {
		return fmt.Sprintf("mesh member %q is unreachable: no session leads to it", e.Member)
	}
	return fmt.Sprintf("mesh member %q is unreachable since %s", e.Member, e.Since.UTC().Format(time.RFC3339))
}

func (e *UnreachableError) Unwrap() error { return ErrUnreachable }

// route picks the live session that leads to member: its own, else that
// of a peer that relays its routes; on an agent, which learns no routes,
// that of a gateway, which relays or refuses.
func (m *Mesh) route(member string) (*session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[member]; s != nil {
		return s, nil
	}
	for via, routes := range m.learned {
		if s := m.sessions[via]; s != nil && s.kind == KindGateway {
			for _, r := range routes {
				if r.Owner == member {
					return s, nil
				}
			}
		}
	}
	if m.opts.Kind == KindAgent { // it learns no routes: a gateway relays
		var gws []string
		for name, s := range m.sessions {
			if s.kind == KindGateway {
				gws = append(gws, name)
			}
		}
		if len(gws) > 0 {
			return m.sessions[slices.Min(gws)], nil
		}
	}
	return nil, &UnreachableError{Member: member, Since: m.lost[member]}
}

// open opens a stream of type typ to member.
func (m *Mesh) open(ctx context.Context, typ, member string) (net.Conn, error) {
	s, err := m.route(member)
	if err != nil {
		return nil, err
	}
	return s.open(ctx, header{Type: typ, To: member})
}

// open opens a stream on the session, or one of its bulk sessions, and
// writes its header. A bulk session that fails (its connection died, and
// it has not noticed yet) leaves the stream to the session itself.
func (s *session) open(ctx context.Context, h header) (net.Conn, error) {
	mux, picked := s.streams(h.Type)
	c, err := s.openOn(ctx, mux, picked, h)
	if err != nil && mux != s.mux && ctx.Err() == nil {
		return s.openOn(ctx, s.mux, func() {}, h)
	}
	return c, err
}

// openOn opens a stream on mux and writes its header; it honours ctx
// while it waits for the stream to be accepted. picked is called once the
// stream is open, or failed to.
func (s *session) openOn(ctx context.Context, mux *yamux.Session, picked func(), h header) (net.Conn, error) {
	octx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	type opened struct {
		c   net.Conn
		err error
	}
	done := make(chan opened, 1)
	go func() {
		st, err := mux.OpenStream()
		picked()
		if err == nil {
			st.SetWriteDeadline(time.Now().Add(handshakeTimeout))
			if err = writeMessage(st, h); err != nil {
				st.Close()
			}
			st.SetWriteDeadline(time.Time{})
		}
		done <- opened{&stream{Conn: st, m: s.m.opts.Metrics}, err}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			return nil, fmt.Errorf("mesh stream to %q: %w", h.To, o.err)
		}
		s.m.opts.Metrics.streamOpened()
		return o.c, nil
	case <-octx.Done():
		go func() {
			if o := <-done; o.err == nil {
				o.c.Close()
			}
		}()
		return nil, fmt.Errorf("mesh stream to %q: %w", h.To, octx.Err())
	}
}

// serveStream reads a stream's header and serves it: an HTTP exchange
// for this member, or a relay to the member it is for.
func (m *Mesh) serveStream(ctx context.Context, s *session, st net.Conn) {
	st.SetReadDeadline(time.Now().Add(handshakeTimeout))
	var h header
	err := readMessage(st, &h)
	st.SetReadDeadline(time.Time{})
	if err != nil {
		m.opts.Logger.Warn("mesh stream without a header; closed", "peer", s.peer, "error", err.Error())
		st.Close()
		return
	}
	c := &stream{Conn: st, m: m.opts.Metrics}
	from, err := originOf(s, h)
	switch {
	case h.Type != streamHTTP && h.Type != streamVolume:
		m.opts.Logger.Warn("mesh stream of an unknown type; closed", "peer", s.peer, "type", h.Type)
		st.Close()
	case err != nil:
		m.opts.Logger.Error("mesh stream header is malformed; closed", "peer", s.peer, "error", err.Error())
		m.opts.Metrics.malformed()
		st.Close()
	case h.To == m.name || h.To == "":
		m.serveHTTP(ctx, from, c)
	default:
		m.relay(ctx, from, h, c)
	}
}

// relay carries a stream on to the member it is for, when this member is
// a gateway with a session with it, naming the stream's origin in the
// header; else it answers 502 naming who is unreachable. A stream from an
// agent to an agent is not relayed: agents never talk to each other.
func (m *Mesh) relay(ctx context.Context, from origin, h header, in net.Conn) {
	defer in.Close()
	to := m.session(h.To)
	switch {
	case to == nil || m.opts.Kind != KindGateway:
		err := &UnreachableError{Member: h.To, Since: m.lostSince(h.To)}
		writeHTTPError(in, http.StatusBadGateway, fmt.Sprintf("mesh: %s, from %s: %v", h.To, m.name, err))
		return
	case from.kind == KindAgent && to.kind == KindAgent:
		writeHTTPError(in, http.StatusForbidden, fmt.Sprintf("mesh: %s relays no stream from agent %s to agent %s: agents never talk to each other",
			m.name, from.name, h.To))
		return
	}
	h.From, h.FromKind = from.name, from.kind
	out, err := to.open(ctx, h)
	if err != nil {
		writeHTTPError(in, http.StatusBadGateway, fmt.Sprintf("mesh: relay from %s: %v", m.name, err))
		return
	}
	defer out.Close()
	splice(in, out)
}

func (m *Mesh) lostSince(member string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost[member]
}

// splice copies both ways until both directions ended, half-closing each
// after its copy.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		_, err := copyBuffered(dst, src)
		if err != nil {
			a.Close()
			b.Close()
			return
		}
		closeWrite(dst)
	}
	wg.Go(func() { one(a, b) })
	wg.Go(func() { one(b, a) })
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// writeHTTPError answers an HTTP request that cannot be carried on.
func writeHTTPError(c net.Conn, code int, msg string) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	br := bufio.NewReader(c)
	if req, err := http.ReadRequest(br); err == nil {
		req.Body.Close()
	}
	b, _ := json.Marshal(map[string]string{"error": msg})
	body := string(b) + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// maxWrite caps what one Write gives a yamux stream. yamux sends
// min(window, len(b)) as one frame, and a frame holds the session's one
// send loop while it goes out, ahead of other streams' frames, window
// updates and pings: 128 KiB is 1.3 ms at 100 MB/s, where a 16 MiB frame
// would be 0.17 s. 64 to 256 KiB measured the same throughput
// (make bench-mesh; docs/mesh.md).
const maxWrite = 128 << 10

// copyBuffers are the buffers streams are copied with: yamux's Stream
// has no ReadFrom, so io.Copy would write 32 KiB frames.
var copyBuffers = sync.Pool{New: func() any { return new([maxWrite]byte) }}

// copyBuffered copies src to dst in maxWrite pieces.
func copyBuffered(dst io.Writer, src io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[maxWrite]byte)
	defer copyBuffers.Put(buf)
	// The wrappers hide dst's ReadFrom and src's WriteTo, which would
	// call back here or pick their own buffer.
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf[:])
}

// stream is a mesh stream as the HTTP transport, the HTTP server and a
// relay see it: its writes are capped at maxWrite, copies into it use
// maxWrite buffers, and its bytes are counted in the metrics.
type stream struct {
	net.Conn
	m *Metrics
}

func (c *stream) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.m.read(n)
	return n, err
}

func (c *stream) Write(p []byte) (int, error) {
	var written int
	for len(p) > 0 {
		n, err := c.Conn.Write(p[:min(len(p), maxWrite)])
		written += n
		c.m.wrote(n)
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// ReadFrom is how io.Copy writes to the stream (the HTTP transport copies
// a request body with it).
func (c *stream) ReadFrom(r io.Reader) (int64, error) { return copyBuffered(c, r) }

func (c *stream) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// peerKey carries the origin of an HTTP request in its context.
type peerKey struct{}

// Peer is the mesh member that made an HTTP request served over the mesh,
// if it came that way: the peer that sent it, or, on a stream a gateway
// relayed, the member the gateway relayed it for.
func Peer(ctx context.Context) (string, bool) {
	o, ok := ctx.Value(peerKey{}).(origin)
	return o.name, ok
}

// PeerKind is the kind (KindGateway or KindAgent) of the member Peer
// names; "" for a request that did not come over the mesh.
func PeerKind(ctx context.Context) string {
	o, _ := ctx.Value(peerKey{}).(origin)
	return o.kind
}

// peerConn is an HTTP stream and the origin of its calls.
type peerConn struct {
	net.Conn
	from origin
}

// serveHTTP hands an HTTP stream to the mesh's HTTP server.
func (m *Mesh) serveHTTP(ctx context.Context, from origin, c net.Conn) {
	select {
	case m.conns <- &peerConn{Conn: c, from: from}:
	case <-ctx.Done():
		c.Close()
	}
}

// connListener is the HTTP server's listener: the HTTP streams peers open.
type connListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return meshAddr{} }

type meshAddr struct{}

func (meshAddr) Network() string { return "mesh" }
func (meshAddr) String() string  { return "mesh" }

// serve runs the HTTP server of the mesh's streams until ctx ends; the
// requests under way get stopGrace to finish.
func (m *Mesh) serve(ctx context.Context) {
	l := &connListener{conns: m.conns, closed: make(chan struct{})}
	srv := &http.Server{
		Handler:           m.opts.HTTP,
		ReadHeaderTimeout: handshakeTimeout,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if pc, ok := c.(*peerConn); ok {
				return context.WithValue(ctx, peerKey{}, pc.from)
			}
			return ctx
		},
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(l)
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopGrace)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	<-served
}

// stopGrace is what requests under way get to finish at stop.
const stopGrace = 5 * time.Second

// Client is an HTTP client whose requests go over the mesh: the URL's host
// is the member the request is for (http://NAME/path).
func (m *Mesh) Client() *http.Client {
	return &http.Client{Transport: m.transport}
}

// BulkClient is Client for volume streams: requests whose bodies are
// large, carried on streams of type volume.
func (m *Mesh) BulkClient() *http.Client {
	return &http.Client{Transport: m.bulk}
}

func (m *Mesh) newTransport(typ string) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			return m.open(ctx, typ, host)
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// WithPeer marks ctx as that of a request gateway peer made over the
// mesh, as the mesh's own HTTP server does; for tests of handlers behind
// it.
func WithPeer(ctx context.Context, peer string) context.Context {
	return WithPeerKind(ctx, peer, KindGateway)
}

// WithPeerKind is WithPeer for a peer of kind (KindGateway or KindAgent).
func WithPeerKind(ctx context.Context, peer, kind string) context.Context {
	return context.WithValue(ctx, peerKey{}, origin{peer, kind})
}
