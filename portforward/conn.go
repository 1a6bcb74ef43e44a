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

	remoteErr chan error // the error stream's verdict, once
	closeOnce sync.Once
	release   func()
}

func newConn(pc *podConn, port int, errStream, data httpstream.Stream, m *Metrics, release func()) *Conn {
	c := &Conn{pc: pc, port: port, data: data, errs: errStream, metrics: m, remoteErr: make(chan error, 1), release: release}
	go func() {
		msg, err := io.ReadAll(errStream)
		switch {
		case len(msg) > 0:
			c.remoteErr <- fmt.Errorf("pod %s port %d: %s", pc.key, port, strings.TrimSpace(string(msg)))
		case err != nil:
			c.remoteErr <- fmt.Errorf("pod %s port %d: error stream: %w", pc.key, port, err)
		default:
			c.remoteErr <- nil
		}
	}()
	return c
}

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
		select {
		case rerr := <-c.remoteErr:
			c.remoteErr <- rerr
			if rerr != nil {
				return n, rerr
			}
		case <-time.After(100 * time.Millisecond):
		}
		select {
		case <-c.pc.conn.CloseChan():
			return n, fmt.Errorf("pod %s port %d: %w", c.pc.key, c.port, ErrConnectionLost)
		default:
		}
	}
	return n, err
}

// Write writes to the pod.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.data.Write(p)
	c.metrics.wrote(n)
	if err != nil {
		select {
		case <-c.pc.conn.CloseChan():
			err = fmt.Errorf("pod %s port %d: %w: %w", c.pc.key, c.port, ErrConnectionLost, err)
		default:
		}
	}
	return n, err
}

// CloseWrite tells the pod no more data comes, keeping the read side open.
func (c *Conn) CloseWrite() error { return c.data.Close() }

// Close ends the stream (both directions); the pod's shared connection
// stays for other streams.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		_ = c.data.Reset()
		_ = c.errs.Reset()
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
