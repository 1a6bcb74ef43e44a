package mesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/jetway-ci/jetway/internal/backoff"
)

// Bulk sessions (docs/mesh.md, "Bulk sessions"). Volume streams carry
// gigabytes; on the session that carries calls they would hold every call
// up behind their windows of data, and all of them would share one TCP
// window. So the member that dialed a session also dials BulkConns more
// connections to the same peer, each its own TLS connection and yamux
// session, whose hello names the session they belong to; volume streams
// go on the one with the fewest streams open, and on the session itself
// while none is up. Bulk sessions end with their session.

// defaultBulkConns is Options.BulkConns unless set: as many bulk sessions
// as the concurrent volume streams the mesh must carry at full speed, each
// with a TCP window of its own (docs/mesh.md, "Bulk sessions"; make bench-mesh measures it).
const defaultBulkConns = 8

// redialFunc makes another connection to a session's peer for a bulk
// session: over TLS, handshaken, with peer what its verified certificate
// says.
type redialFunc func(ctx context.Context) (conn net.Conn, peer peerCert, err error)

// errBulkRefused is a bulk connection the accepting side did not take:
// the session it named is not the one it has with this member.
var errBulkRefused = errors.New("mesh: bulk connection refused")

// bulkDialer makes the connections of bulk sessions with the peer at
// addr.
func (m *Mesh) bulkDialer(addr string) redialFunc {
	return func(ctx context.Context) (net.Conn, peerCert, error) {
		c, err := m.dialTLS(ctx, addr, alpnBulk)
		if err != nil {
			return nil, peerCert{}, err
		}
		if err := c.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, peerCert{}, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		if p := c.ConnectionState().NegotiatedProtocol; p != alpnBulk {
			c.Close()
			return nil, peerCert{}, fmt.Errorf("mesh peer at %s takes no bulk connection (ALPN %q)", addr, p)
		}
		return c, peerCertOf(c.ConnectionState()), nil
	}
}

// keepBulk keeps one bulk session of s up until s ends, dialing again
// with backoff when one ends or a dial fails.
func (s *session) keepBulk() {
	retryDelay := s.m.opts.MinBackoff
	for s.ctx.Err() == nil {
		mux, err := s.dialBulk(s.ctx)
		switch {
		case err != nil && s.ctx.Err() == nil:
			s.m.opts.Logger.Warn("mesh bulk session not set up", "peer", s.peer, "error", err.Error(), "retry_in", retryDelay.String())
		case err == nil:
			retryDelay = s.m.opts.MinBackoff
			select {
			case <-mux.CloseChan():
			case <-s.ctx.Done():
				mux.Close()
				return
			}
		}
		if backoff.Sleep(s.ctx, backoff.Jitter(retryDelay*3/4, 1.0/3)) != nil {
			return
		}
		retryDelay = min(2*retryDelay, s.m.opts.MaxBackoff)
	}
}

// dialBulk sets a bulk session of s up: a new connection to the peer,
// whose hello names the session by the id the peer gave it.
func (s *session) dialBulk(ctx context.Context) (*yamux.Session, error) {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	conn, peer, err := s.redial(hctx)
	if err != nil {
		return nil, err
	}
	if peer.name != s.peer {
		conn.Close()
		return nil, fmt.Errorf("mesh bulk connection reached %q, not %q", peer.name, s.peer)
	}
	mux, err := yamux.Client(conn, yamuxConfig(bulkWindow))
	if err != nil {
		conn.Close()
		return nil, err
	}
	if err := s.bulkHello(mux, peer); err != nil {
		mux.Close()
		return nil, err
	}
	if !s.attach(mux) {
		mux.Close()
		return nil, fmt.Errorf("mesh session with %q ended", s.peer)
	}
	return mux, nil
}

// bulkHello sends a bulk connection's hello on its control stream, reads
// the peer's and its answer, and closes the control stream.
func (s *session) bulkHello(mux *yamux.Session, peer peerCert) error {
	ctrl, err := mux.OpenStream()
	if err != nil {
		return err
	}
	defer ctrl.Close()
	ctrl.SetDeadline(time.Now().Add(handshakeTimeout))
	if _, err := greet(ctrl, hello{Version: Version, Name: s.m.name, Kind: s.m.opts.Kind, Bulk: s.theirs}, peer); err != nil {
		return err
	}
	var answer control
	switch err := readMessage(ctrl, &answer); {
	case err != nil:
		return fmt.Errorf("mesh bulk session with %q: %w", s.peer, err)
	case answer.Type == msgRefused:
		return fmt.Errorf("%w by %q: %s", errBulkRefused, s.peer, answer.Error)
	case answer.Type != msgAttached:
		return fmt.Errorf("%w: bulk hello answered %q", ErrMalformed, answer.Type)
	}
	return nil
}

// acceptBulk takes a bulk connection from peer: its hello must name the
// session this member has with peer, which peer dialed.
func (m *Mesh) acceptBulk(ctx context.Context, conn net.Conn, peer peerCert) error {
	mux, err := yamux.Server(conn, yamuxConfig(bulkWindow))
	if err != nil {
		conn.Close()
		m.opts.Metrics.handshakeFailed("yamux")
		return err
	}
	fail := func(reason string, err error) error {
		mux.Close()
		m.opts.Metrics.handshakeFailed(reason)
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	ctrl, err := mux.AcceptStreamWithContext(hctx)
	if err != nil {
		return fail("hello", fmt.Errorf("mesh bulk control stream with %q: %w", peer.name, err))
	}
	defer ctrl.Close()
	ctrl.SetDeadline(time.Now().Add(handshakeTimeout))
	theirs, err := greet(ctrl, hello{Version: Version, Name: m.name, Kind: m.opts.Kind}, peer)
	if err != nil {
		return fail(helloFailure(err), err)
	}
	s := m.bulkSessionOf(ctx, peer.name, theirs.Bulk)
	if s == nil || !s.attach(mux) {
		err := fmt.Errorf("%q named a session it did not dial with %q", peer.name, m.name)
		refuse(ctrl, err)
		return fail("bulk", fmt.Errorf("%w: %v", errBulkRefused, err))
	}
	if err := writeMessage(ctrl, control{Type: msgAttached}); err != nil {
		mux.Close()
		return fmt.Errorf("mesh bulk session with %q: %w", peer.name, err)
	}
	return nil
}

// attachWait bounds how long a bulk connection waits for the session it
// names: the dialer starts its pool as soon as it has registered the
// session, maybe before this side has.
const attachWait = time.Second

// bulkSessionOf is the live session with peer, which peer dialed, whose
// id (this side's) is id; it waits up to attachWait for it. nil: there is
// none.
func (m *Mesh) bulkSessionOf(ctx context.Context, peer, id string) *session {
	if id == "" {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, attachWait)
	defer cancel()
	for {
		changed := m.Changed()
		if s := m.session(peer); s != nil && s.ours == id && s.dialer == peer {
			return s
		}
		select {
		case <-changed:
		case <-wctx.Done():
			return nil
		}
	}
}

// refuse answers a bulk hello with why it was refused, and waits (within
// the control stream's deadline) for the dialer to close the stream, so
// that the answer is read before the connection closes.
func refuse(ctrl net.Conn, why error) {
	if writeMessage(ctrl, control{Type: msgRefused, Error: why.Error()}) == nil {
		closeWrite(ctrl)
		_, _ = io.Copy(io.Discard, ctrl)
	}
}

// attach adds mux to the bulk sessions of s and serves the streams the
// peer opens on it, unless s has ended (false).
func (s *session) attach(mux *yamux.Session) bool {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	if s.ended {
		return false
	}
	s.bulk = append(s.bulk, &bulkSession{mux: mux})
	s.m.opts.Metrics.bulkSessions(1)
	s.wg.Go(func() {
		s.acceptStreams(mux)
		mux.Close()
		s.detach(mux)
	})
	return true
}

func (s *session) detach(mux *yamux.Session) {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	for i, b := range s.bulk {
		if b.mux == mux {
			s.bulk = append(s.bulk[:i], s.bulk[i+1:]...)
			s.m.opts.Metrics.bulkSessions(-1)
			return
		}
	}
}

// endBulk closes the bulk sessions of s, and any that would attach.
func (s *session) endBulk() {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	s.ended = true
	for _, b := range s.bulk {
		b.mux.Close()
	}
}

// bulkSession is a bulk session of a session, and how many streams are
// being opened on it: they count as open when the next one picks where
// to go.
type bulkSession struct {
	mux     *yamux.Session
	opening int // guarded by the session's bmu
}

// streams picks the session a stream of type typ goes on: a volume
// stream on the bulk session with the fewest streams open, anything else
// (or a volume stream while no bulk session is up) on s itself. Call
// opened once the stream is open, or failed to.
func (s *session) streams(typ string) (mux *yamux.Session, opened func()) {
	if typ != streamVolume {
		return s.mux, func() {}
	}
	s.bmu.Lock()
	defer s.bmu.Unlock()
	var best *bulkSession
	fewest := 0
	for _, b := range s.bulk {
		if n := b.mux.NumStreams() + b.opening; !b.mux.IsClosed() && (best == nil || n < fewest) {
			best, fewest = b, n
		}
	}
	if best == nil {
		return s.mux, func() {}
	}
	best.opening++
	return best.mux, func() {
		s.bmu.Lock()
		best.opening--
		s.bmu.Unlock()
	}
}

// bulkSessions is how many bulk sessions s has up.
func (s *session) bulkSessions() int {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	return len(s.bulk)
}
