package concourse

import (
	"net"
	"os"
	"sync"
	"time"
)

// net/http hijacks a connection (Garden's Run, Attach and output streams)
// only once its background read ends, which it ends by setting a read
// deadline in the past. An SSH channel takes no deadline, so a hijack of
// one through the TSA's forwards would wait forever. withDeadlines gives
// such a connection read deadlines: its reads are done by one goroutine
// at a time, and a Read waits for that one's result or the deadline,
// whichever comes first; the data of a read that outlived its deadline
// is kept for the next.
func withDeadlines(c net.Conn) net.Conn {
	return &deadlineConn{Conn: c, results: make(chan readResult, 1), changed: make(chan struct{}), closed: make(chan struct{})}
}

type readResult struct {
	b   []byte
	err error
}

type deadlineConn struct {
	net.Conn
	results chan readResult // the reading goroutine's result
	closed  chan struct{}

	mu       sync.Mutex
	deadline time.Time
	changed  chan struct{} // closed when the deadline changes
	reading  bool          // a goroutine reads
	pending  []byte        // read, not yet returned
	err      error         // the connection's read error, once seen
	once     sync.Once
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		c.mu.Unlock()
		return n, nil
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	if !c.reading {
		c.reading = true
		go c.readOnce(len(p))
	}
	deadline, changed := c.deadline, c.changed
	c.mu.Unlock()
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-c.results:
		c.mu.Lock()
		defer c.mu.Unlock()
		c.reading = false
		n := copy(p, r.b)
		c.pending = r.b[n:]
		if r.err != nil {
			c.err = r.err
			if n == 0 {
				return 0, r.err
			}
		}
		return n, nil
	case <-timeout:
		return 0, os.ErrDeadlineExceeded
	case <-changed:
		return 0, os.ErrDeadlineExceeded // net/http's way to end a read now
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

// readOnce reads once from the connection and leaves the result for Read.
func (c *deadlineConn) readOnce(n int) {
	b := make([]byte, max(n, 512))
	n, err := c.Conn.Read(b)
	c.results <- readResult{b[:n], err}
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	_ = c.Conn.SetWriteDeadline(t)
	return c.SetReadDeadline(t)
}

func (c *deadlineConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// deadlineListener gives each connection it accepts read deadlines.
type deadlineListener struct{ net.Listener }

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return withDeadlines(c), nil
}
