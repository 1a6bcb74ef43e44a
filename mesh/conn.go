package mesh

import (
	"crypto/tls"
	"net"
	"sync"
)

// Writes of yamux frames to TLS. yamux's send loop writes each frame's
// 12-byte header and its body as two conn Writes, and crypto/tls makes
// every Write at least one record and every record one write to the
// socket: a 128 KiB data frame is ten syscalls, one of them for twelve
// bytes. frameConn holds a data frame's header back and lets TLS seal
// the header and the body into batchConn, under TLS, which sends the
// frame's records with one write.

// coalesceFrames turns the batching on; the benchmark turns it off to
// measure what it gains.
var coalesceFrames = true

// yamux frame header fields (yamux's spec.md).
const (
	frameHeaderSize = 12
	frameData       = 0 // type
)

// batchConn is the TCP connection under a TLS connection. While batching,
// writes collect in buf and go out at flush, in order, as one write.
type batchConn struct {
	net.Conn
	mu       sync.Mutex
	batching bool
	buf      []byte
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.batching {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *batchConn) hold() {
	c.mu.Lock()
	c.batching = true
	c.mu.Unlock()
}

// flush ends batching and writes what was held.
func (c *batchConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batching = false
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	if cap(c.buf) > maxHeldBuffer {
		c.buf = nil // an idle session keeps no big buffer
	} else {
		c.buf = c.buf[:0]
	}
	return err
}

// maxHeldBuffer is the batch buffer a connection keeps between frames: a
// capped stream Write (maxWrite) and its records' overhead fit.
const maxHeldBuffer = maxWrite + 16<<10

// frameConn is the TLS connection under a yamux session. yamux's single
// send loop (session.go, sendLoop in v0.1.2) is its only writer: it writes
// a frame's header, then, for a data frame of non-zero length, that many
// bytes of body in one Write. A data frame's header starts a batch; its
// body ends it. Every other frame goes out at once.
type frameConn struct {
	*tls.Conn
	under *batchConn
	body  bool // the next Write is the body of a held header
}

func (c *frameConn) Write(p []byte) (int, error) {
	if !c.body && len(p) == frameHeaderSize && p[1] == frameData && (p[8]|p[9]|p[10]|p[11]) != 0 {
		c.body = true
		c.under.hold()
		return c.Conn.Write(p)
	}
	c.body = false
	n, err := c.Conn.Write(p)
	if ferr := c.under.flush(); err == nil {
		err = ferr
	}
	return n, err
}

// coalesce is the connection a yamux session runs on: conn, wrapped in a
// frameConn when it is TLS over a batchConn.
func coalesce(conn net.Conn) net.Conn {
	tc, ok := conn.(*tls.Conn)
	if !ok || !coalesceFrames {
		return conn
	}
	if bc, ok := tc.NetConn().(*batchConn); ok {
		return &frameConn{Conn: tc, under: bc}
	}
	return conn
}
