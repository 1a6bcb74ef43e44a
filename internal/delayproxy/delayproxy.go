// Package delayproxy owns a loopback TCP proxy that delays each direction
// by a fixed one-way time without limiting bandwidth, so tests and
// benchmarks can measure a protocol at a real round-trip time (RTT is twice
// the delay). Every byte read at t is written at t+delay and many chunks
// are in flight at once; only the in-flight bytes of a direction are capped.
//
// It uses the real clock: the traffic it carries is real TCP, which
// testing/synctest cannot fake.
package delayproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

const (
	// blockSize is the size of the buffers reads fill, and the most one
	// read takes.
	blockSize = 64 << 10

	// DefaultMaxInFlight caps the bytes a direction of one connection holds
	// (read, not yet written) unless WithMaxInFlight says otherwise.
	DefaultMaxInFlight = 32 << 20

	// maxChunks caps the reads a direction holds, whatever their size.
	maxChunks = 4096

	// dialTimeout bounds each dial of the target.
	dialTimeout = 5 * time.Second
)

// Proxy forwards each connection to its listener to the target, delayed.
type Proxy struct {
	ln          net.Listener
	target      string
	oneWay      time.Duration
	maxInFlight int64
	cancel      context.CancelFunc
	wg          sync.WaitGroup
}

// Option changes a default of Start.
type Option func(*Proxy)

// WithMaxInFlight caps the bytes each direction of a connection holds (read,
// not yet written) at n; the buffers hold at most two 64 KiB blocks more. A
// full direction stops reading, so the sender feels TCP backpressure.
//
// The cap plays the part of the TCP window on a real long link, as the
// proxy's own TCP hops have next to no RTT: a direction carries at most n
// per one-way delay, as a TCP window of 2n does per round trip. The
// default, 32 MiB, carries 1.6 GiB/s at 20 ms; 2 MiB, like the 4 MiB window
// Linux's default tcp_rmem limit (6 MiB) grants, carries 105 MB/s.
func WithMaxInFlight(n int64) Option { return func(p *Proxy) { p.maxInFlight = n } }

// Start listens on a loopback port and forwards every connection to target,
// each direction delayed by oneWay. The proxy stops when ctx ends or on
// Close.
func Start(ctx context.Context, target string, oneWay time.Duration, opts ...Option) (*Proxy, error) {
	p := &Proxy{target: target, oneWay: oneWay, maxInFlight: DefaultMaxInFlight}
	for _, o := range opts {
		o(p)
	}
	if oneWay < 0 {
		return nil, fmt.Errorf("delayproxy: negative delay %v", oneWay)
	}
	if p.maxInFlight < blockSize {
		return nil, fmt.Errorf("delayproxy: in-flight cap %d under one block (%d)", p.maxInFlight, blockSize)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("delayproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	p.ln, p.cancel = ln, cancel
	p.wg.Go(func() {
		<-ctx.Done()
		ln.Close()
	})
	p.wg.Go(func() { p.accept(ctx) })
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the listener and every connection, and returns once all the
// proxy's goroutines have exited. It may be called more than once.
func (p *Proxy) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

func (p *Proxy) accept(ctx context.Context) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // the listener is closed: the proxy is stopping
		}
		p.wg.Go(func() { p.serve(ctx, c.(*net.TCPConn)) })
	}
}

// serve forwards one client connection until both directions have ended,
// either fails, or ctx ends.
func (p *Proxy) serve(ctx context.Context, client *net.TCPConn) {
	defer client.Close()
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", p.target)
	if err != nil {
		return // the client sees its connection close
	}
	server := c.(*net.TCPConn)
	defer server.Close()

	// One group for both directions: a failure anywhere ends ctx, and
	// closing both connections then unblocks every read and write. ctx
	// ends at the latest when g.Wait returns.
	g, ctx := errgroup.WithContext(ctx)
	p.pipe(ctx, g, server, client)
	p.pipe(ctx, g, client, server)
	var closer sync.WaitGroup
	closer.Go(func() {
		<-ctx.Done()
		client.Close()
		server.Close()
	})
	_ = g.Wait()
	closer.Wait()
}

// block is a buffer that consecutive reads fill; it returns to blocks when
// the reader and every chunk in it have let go.
type block struct {
	buf  []byte
	refs atomic.Int32
}

var blocks = sync.Pool{New: func() any { return &block{buf: make([]byte, blockSize)} }}

func newBlock() *block {
	b := blocks.Get().(*block)
	b.refs.Store(1) // the reader's
	return b
}

func (b *block) release() {
	if b.refs.Add(-1) == 0 {
		blocks.Put(b)
	}
}

// chunk is one read from a source, due to be written at due.
type chunk struct {
	block *block
	data  []byte // in block.buf
	due   time.Time
	eof   bool // the source ended after these bytes
}

// pipe starts copying src to dst in g, each byte written oneWay after it
// was read, and dst half-closed oneWay after src ended. A reader and a
// writer share a queue, so chunks are in flight together; room counts
// their bytes.
func (p *Proxy) pipe(ctx context.Context, g *errgroup.Group, dst, src *net.TCPConn) {
	room := semaphore.NewWeighted(p.maxInFlight)
	// The queue caps the chunks in flight as room caps their bytes: with
	// the default cap, reads under 8 KiB on average fill the queue first.
	queue := make(chan chunk, maxChunks)
	g.Go(func() error { return p.read(ctx, src, queue, room) })
	g.Go(func() error { return write(ctx, dst, queue, room) })
}

// read reads src into blocks, and queues each read as a chunk. Reads take
// room for a block's free tail and give back what they did not fill, so
// room counts bytes whatever the size of reads.
func (p *Proxy) read(ctx context.Context, src net.Conn, queue chan<- chunk, room *semaphore.Weighted) error {
	b, off := newBlock(), 0
	defer func() { b.release() }()
	for {
		if off == blockSize {
			b.release()
			b, off = newBlock(), 0
		}
		tail := b.buf[off:]
		if err := room.Acquire(ctx, int64(len(tail))); err != nil {
			return err
		}
		n, err := src.Read(tail)
		room.Release(int64(len(tail) - n))
		c := chunk{block: b, data: tail[:n], due: time.Now().Add(p.oneWay), eof: errors.Is(err, io.EOF)}
		if err != nil && !c.eof {
			return fmt.Errorf("read: %w", err)
		}
		off += n
		b.refs.Add(1)
		select {
		case queue <- c:
		case <-ctx.Done():
			return ctx.Err()
		}
		if c.eof {
			return nil
		}
	}
}

func write(ctx context.Context, dst *net.TCPConn, queue <-chan chunk, room *semaphore.Weighted) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		var c chunk
		select {
		case c = <-queue:
		case <-ctx.Done():
			return ctx.Err()
		}
		if wait := time.Until(c.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := dst.Write(c.data); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		c.block.release()
		room.Release(int64(len(c.data)))
		if c.eof {
			return dst.CloseWrite()
		}
	}
}
