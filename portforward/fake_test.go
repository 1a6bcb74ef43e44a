package portforward

import (
	"context"
	"errors"
	"io"
	corev1 "k8s.io/api/core/v1"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/moby/spdystream"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/httpstream"
)

// fakeUpgrader stands in for the API server's upgrade: each upgrade
// returns a new in-memory fakeConn. Pure dialer logic (sharing, idling,
// stream failures) is tested against it; the real upgrades are covered
// by the integration tests.
type fakeUpgrader struct {
	mu    sync.Mutex
	conns []*fakeConn
}

func (u *fakeUpgrader) upgrade(context.Context, podKey) (httpstream.Connection, string, error) {
	c := &fakeConn{closed: make(chan bool)}
	u.mu.Lock()
	u.conns = append(u.conns, c)
	u.mu.Unlock()
	return c, "fake", nil
}

func (u *fakeUpgrader) upgrades() []*fakeConn {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*fakeConn(nil), u.conns...)
}

// fakeConn is an upgraded connection whose streams echo what is written.
type fakeConn struct {
	mu         sync.Mutex
	streams    []*fakeStream
	failCreate int  // CreateStream calls left to fail
	timeouts   bool // every CreateStream times out, as on a wedged connection
	refuses    bool // every new stream's error stream says why it failed, as the kubelet's to a pod that is gone
	closed     chan bool
	closeOnce  sync.Once
}

var errInjected = errors.New("injected stream failure")

func (c *fakeConn) CreateStream(h http.Header) (httpstream.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed() {
		return nil, errors.New("connection closed")
	}
	if c.failCreate > 0 {
		c.failCreate--
		return nil, errInjected
	}
	if c.timeouts {
		return nil, spdystream.ErrTimeout
	}
	s := &fakeStream{headers: h, data: make(chan []byte, 16), reset: make(chan struct{})}
	if c.refuses && h.Get(corev1.StreamType) == corev1.StreamTypeError {
		s.pending, s.ended = []byte("failed to connect to port 80: no such pod sandbox"), true
	}
	c.streams = append(c.streams, s)
	return s, nil
}

func (c *fakeConn) refuseStreams() {
	c.mu.Lock()
	c.refuses = true
	c.mu.Unlock()
}

func (c *fakeConn) timeOutCreates() {
	c.mu.Lock()
	c.timeouts = true
	c.mu.Unlock()
}

func (c *fakeConn) failNextCreate() {
	c.mu.Lock()
	c.failCreate = 1
	c.mu.Unlock()
}

func (c *fakeConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

func (c *fakeConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, s := range c.streams {
			_ = s.Reset()
		}
	})
	return nil
}

func (c *fakeConn) CloseChan() <-chan bool                     { return c.closed }
func (c *fakeConn) SetIdleTimeout(time.Duration)               {}
func (c *fakeConn) RemoveStreams(streams ...httpstream.Stream) {}

// fakeStream reads back what was written to it until it is reset.
type fakeStream struct {
	headers   http.Header
	data      chan []byte
	pending   []byte
	reset     chan struct{}
	resetOnce sync.Once
	ended     bool // io.EOF once pending is read
}

func (s *fakeStream) Read(p []byte) (int, error) {
	if len(s.pending) == 0 && s.ended {
		return 0, io.EOF
	}
	if len(s.pending) == 0 {
		select {
		case b := <-s.data:
			s.pending = b
		case <-s.reset:
			return 0, io.EOF
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

func (s *fakeStream) Write(p []byte) (int, error) {
	select {
	case <-s.reset:
		return 0, io.ErrClosedPipe
	default:
	}
	select {
	case s.data <- append([]byte(nil), p...):
		return len(p), nil
	case <-s.reset:
		return 0, io.ErrClosedPipe
	}
}

func (s *fakeStream) Close() error         { return nil } // half-close: the echo goes on
func (s *fakeStream) Reset() error         { s.resetOnce.Do(func() { close(s.reset) }); return nil }
func (s *fakeStream) Headers() http.Header { return s.headers }
func (s *fakeStream) Identifier() uint32   { return 0 }

// startFake runs a Dialer over a fakeUpgrader until the test ends.
func startFake(t *testing.T, opts Options) (*Dialer, *fakeUpgrader) {
	t.Helper()
	up := &fakeUpgrader{}
	d := New(opts)
	d.upgradeFn = up.upgrade
	run(t, d)
	return d, up
}

// run runs d's Start until the test ends and checks it returns.
func run(t *testing.T, d *Dialer) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return cancel
}

// echo writes msg to c and checks it comes back.
func echo(c *Conn, msg string) error {
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo got " + string(buf))
	}
	return nil
}
