package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// A session is the yamux session with one peer: its control stream
// carries route announcements both ways; every other stream is opened for
// HTTP exchanges (docs/mesh.md). Volume streams go on the session's bulk
// sessions when any is up (bulk.go).
type session struct {
	m      *Mesh
	peer   string // the peer's name, from its certificate
	kind   string
	scope  AgentScope // an agent's, from its certificate
	dialer string     // the name of the member that dialed
	mux    *yamux.Session
	ctrl   net.Conn
	since  time.Time
	done   chan struct{} // closed once the session ended
	// ours and theirs are the session ids each side sent in its hello; a
	// bulk connection names the accepting side's.
	ours, theirs string
	// redial makes another connection to the peer, for bulk sessions; set
	// on the side that dialed this session, nil on the other.
	redial redialFunc

	wmu sync.Mutex // one message at a time on ctrl

	sent string // routesKey of the last announcement sent; announceLoop's
	// claimed are the claims beyond its certificate that an agent's last
	// announcement made (learn's): each change is logged and counted once.
	claimed string

	ctx    context.Context // ends when the session does
	cancel context.CancelFunc
	bmu    sync.Mutex
	bulk   []*bulkSession // live bulk sessions
	ended  bool           // no bulk session attaches any more
	wg     sync.WaitGroup // the session's goroutines: streams, bulk sessions
}

func (s *session) close() { s.mux.Close() }

// run serves the session until it ends: announces this member's routes,
// reads the peer's, serves the streams it opens, and on the side that
// dialed keeps the bulk sessions up. Its bulk sessions end with it.
func (s *session) run() {
	defer close(s.done)
	defer s.cancel()
	s.wg.Go(func() {
		select {
		case <-s.mux.CloseChan():
		case <-s.ctx.Done():
			if s.m.leaving() && s.m.ctx.Err() != nil {
				s.leave()
			}
			s.mux.Close()
		}
	})
	s.wg.Go(func() { s.acceptStreams(s.mux) })
	if s.redial != nil {
		for range s.m.opts.BulkConns {
			s.wg.Go(s.keepBulk)
		}
	}
	err := s.readControl()
	s.mux.Close()
	s.cancel()
	s.endBulk()
	s.wg.Wait()
	s.m.ended(s, err)
}

// readControl reads the peer's control messages until the session ends; a
// malformed one ends it.
func (s *session) readControl() error {
	for {
		var msg control
		if err := readMessage(s.ctrl, &msg); err != nil {
			if errors.Is(err, ErrMalformed) {
				s.m.opts.Logger.Error("mesh peer sent a malformed frame; closing its session", "peer", s.peer, "error", err.Error())
				s.m.opts.Metrics.malformed()
			}
			return err
		}
		switch msg.Type {
		case msgRoutes:
			s.m.learn(s, msg.Routes)
		case msgLeaving:
			s.settle()
			return errLeft
		default:
			// A newer peer's message this version does not know: the
			// hello agreed on the version, so it is malformed.
			s.m.opts.Metrics.malformed()
			return fmt.Errorf("%w: unknown control message type %q", ErrMalformed, msg.Type)
		}
	}
}

// errLeft ends a session whose peer said it leaves for good.
var errLeft = errors.New("mesh: the peer left")

// leave tells the peer that this member leaves for good, within a second,
// and waits, for at most leaveLinger, for the peer to close the session.
//
// The peer closes it once its calls to this member are done. Closing it
// here first could fail a call this member has answered already: a yamux
// write whose frame went out still fails if the session ends before its
// writer hears so, and an HTTP client takes such a failed write for a
// request never sent, retries it, and reports the closed session instead
// of the answer. That is how a retired agent's retire call failed.
func (s *session) leave() {
	s.wmu.Lock()
	s.ctrl.SetWriteDeadline(time.Now().Add(time.Second))
	err := writeMessage(s.ctrl, control{Type: msgLeaving})
	s.wmu.Unlock()
	if err != nil {
		return
	}
	linger := time.NewTimer(leaveLinger)
	defer linger.Stop()
	select {
	case <-s.mux.CloseChan():
	case <-linger.C:
	}
}

// settle waits, for at most leaveLinger, for the calls under way with a
// peer that said it leaves: until the session carries no stream but the
// control stream. Idle HTTP streams (the client's kept-alive
// connections) are closed on the way; a call that ended has its stream
// closed by the leaving side's server.
func (s *session) settle() {
	linger := time.NewTimer(leaveLinger)
	defer linger.Stop()
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	for s.mux.NumStreams() > 1 {
		s.m.transport.CloseIdleConnections()
		s.m.bulk.CloseIdleConnections()
		select {
		case <-tick.C:
		case <-linger.C:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// leaveLinger bounds how long a leaving member and its peer wait for the
// calls under way between them before the session closes; settlePoll is
// how often the peer looks.
const (
	leaveLinger = time.Second
	settlePoll  = 2 * time.Millisecond
)

// announce sends routes to the peer; a failed write ends the session.
func (s *session) announce(routes []Route) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.ctrl.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	err := writeMessage(s.ctrl, control{Type: msgRoutes, Routes: routes})
	s.ctrl.SetWriteDeadline(time.Time{})
	if err != nil {
		s.mux.Close()
	}
}

// acceptStreams serves the streams the peer opens on mux: the session's
// own, or one of its bulk sessions.
func (s *session) acceptStreams(mux *yamux.Session) {
	for {
		st, err := mux.AcceptStreamWithContext(s.ctx)
		if err != nil {
			return
		}
		s.wg.Go(func() { s.m.serveStream(s.ctx, s, st) })
	}
}

// Control message types.
const (
	msgRoutes = "routes"
	// msgLeaving says the sender stops for good (LeaveOnStop): the
	// receiver forgets it and its routes instead of keeping it as lost.
	msgLeaving = "leaving"
	// msgAttached answers a bulk connection's hello: the accepting side
	// took it as a bulk session of the session it named.
	msgAttached = "attached"
	// msgRefused answers a bulk connection's hello that names no session
	// the accepting side has with its dialer.
	msgRefused = "refused"
)

// control is a message on the control stream.
type control struct {
	Type   string  `json:"type"`
	Routes []Route `json:"routes,omitempty"`
	Error  string  `json:"error,omitempty"` // of msgRefused
}
