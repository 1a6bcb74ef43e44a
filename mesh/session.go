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
// one HTTP exchange (docs/mesh.md).
type session struct {
	m      *Mesh
	peer   string // the peer's name, from its certificate
	kind   string
	dialer string // the name of the member that dialed
	mux    *yamux.Session
	ctrl   net.Conn
	since  time.Time
	done   chan struct{} // closed once the session ended

	wmu sync.Mutex // one message at a time on ctrl

	sent string // routesKey of the last announcement sent; announceLoop's
}

func (s *session) close() { s.mux.Close() }

// run serves the session until it ends: announces this member's routes,
// reads the peer's, and serves the streams it opens.
func (s *session) run() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(s.m.ctx)
	defer cancel()
	go func() {
		select {
		case <-s.mux.CloseChan():
		case <-ctx.Done():
			s.mux.Close()
		}
	}()
	var wg sync.WaitGroup
	wg.Go(func() { s.acceptStreams(ctx, &wg) })
	err := s.readControl()
	s.mux.Close()
	cancel()
	wg.Wait()
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
		default:
			// A newer peer's message this version does not know: the
			// hello agreed on the version, so it is malformed.
			s.m.opts.Metrics.malformed()
			return fmt.Errorf("%w: unknown control message type %q", ErrMalformed, msg.Type)
		}
	}
}

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

// acceptStreams serves the streams the peer opens.
func (s *session) acceptStreams(ctx context.Context, wg *sync.WaitGroup) {
	for {
		st, err := s.mux.AcceptStreamWithContext(ctx)
		if err != nil {
			return
		}
		wg.Go(func() { s.m.serveStream(ctx, s, st) })
	}
}

// Control message types.
const msgRoutes = "routes"

// control is a message on the control stream.
type control struct {
	Type   string  `json:"type"`
	Routes []Route `json:"routes,omitempty"`
}
