package portforward

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/httpstream"
)

// Conn is one forwarded connection to a pod's port: a net.Conn over a
// data stream of the pod's shared connection. Errors the kubelet reports
// on the error stream (nothing listening, pod gone) are returned by Read.
// Deadlines are not supported: cancel by closing the Conn.
type Conn struct {
	pc      *podConn
	port    int
	data    httpstream.Stream
	errs    httpstream.Stream
	metrics *Metrics

	remoteErr chan error    // the error stream's verdict, once
	readerEnd chan struct{} // closed when the error stream's reader ends
	closeOnce sync.Once
	release   func()
}

// refused is called when the kubelet answers the stream with an error.
func newConn(pc *podConn, port int, errStream, data httpstream.Stream, m *Metrics, release, refused func()) *Conn {
	c := &Conn{pc: pc, port: port, data: data, errs: errStream, metrics: m,
		remoteErr: make(chan error, 1), readerEnd: make(chan struct{}), release: release}
	go func() { // ends when the kubelet closes the error stream, or Close resets it
		defer close(c.readerEnd)
		msg, err := io.ReadAll(errStream)
		switch {
		case len(msg) > 0:
			refused()
			c.remoteErr <- fmt.Errorf("pod %s port %d: %s", pc.key, port, strings.TrimSpace(string(msg)))
		case err != nil:
			c.remoteErr <- fmt.Errorf("pod %s port %d: error stream: %w", pc.key, port, err)
		default:
			c.remoteErr <- nil
		}
	}()
	return c
}

// verdictGrace is how long Read, at the end of the data stream, waits for
// the kubelet's verdict on the error stream. The two streams are
// independent, so an error the kubelet wrote as it closed the data stream
// can arrive just after its end; a clean end sends no verdict until the
// error stream closes, so the wait is bounded and short.
const verdictGrace = 100 * time.Millisecond

// ErrConnectionLost means the pod's port-forward connection died while a
// stream was open (API server restart, network cut): data may be missing.
var ErrConnectionLost = errors.New("port-forward connection lost")

// Read reads from the pod. At the end of the stream it returns the
// kubelet's error if it sent one, ErrConnectionLost if the shared
// connection died, else io.EOF.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.data.Read(p)
	c.metrics.read(n)
	if err == nil {
		return n, nil
	}
	if errors.Is(err, io.EOF) {
		if rerr := c.verdict(); rerr != nil {
			return n, rerr
		}
		if c.pc.dead() {
			return n, fmt.Errorf("pod %s port %d: %w", c.pc.key, c.port, ErrConnectionLost)
		}
	}
	return n, err
}

// verdict waits up to verdictGrace for the error stream's verdict; it
// stops waiting early when the shared connection dies.
func (c *Conn) verdict() error {
	grace := time.NewTimer(verdictGrace)
	defer grace.Stop()
	select {
	case rerr := <-c.remoteErr:
		c.remoteErr <- rerr
		return rerr
	case <-c.pc.conn.CloseChan():
	case <-grace.C:
	}
	return nil
}

// Write writes to the pod.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.data.Write(p)
	c.metrics.wrote(n)
	if err == nil {
		return n, nil
	}
	// The kubelet's verdict says why, if it gave one (nothing listens on
	// the port): the write only broke because of it.
	if rerr := c.verdict(); rerr != nil {
		return n, rerr
	}
	if c.pc.dead() {
		return n, fmt.Errorf("pod %s port %d: %w: %w", c.pc.key, c.port, ErrConnectionLost, err)
	}
	return n, fmt.Errorf("pod %s port %d: %w", c.pc.key, c.port, err)
}

// CloseWrite tells the pod no more data comes, keeping the read side open.
func (c *Conn) CloseWrite() error { return c.data.Close() }

// Close ends the stream (both directions) and waits for its error-stream
// reader; the pod's shared connection stays for other streams.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		_ = c.data.Reset()
		_ = c.errs.Reset()
		<-c.readerEnd
		c.pc.conn.RemoveStreams(c.data, c.errs)
		c.release()
	})
	return nil
}

// Transport reports which protocol carries the pod's connection.
func (c *Conn) Transport() string { return c.pc.transport }

// LocalAddr and RemoteAddr name the forwarded pod port.
func (c *Conn) LocalAddr() net.Addr  { return addr("jetway") }
func (c *Conn) RemoteAddr() net.Addr { return addr(fmt.Sprintf("%s:%d", c.pc.key, c.port)) }

// SetDeadline and its kin are accepted and ignored: port-forward streams
// have no deadlines; callers bound work with contexts and Close.
func (c *Conn) SetDeadline(time.Time) error      { return nil }
func (c *Conn) SetReadDeadline(time.Time) error  { return nil }
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

type addr string

func (a addr) Network() string { return "portforward" }
func (a addr) String() string  { return string(a) }

var _ net.Conn = (*Conn)(nil)
