package delayproxy_test

import (
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/internal/delayproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testDeadline ends the connections of a test that hangs.
const testDeadline = 20 * time.Second

// listenerLoop is the goroutine of listen that accepts connections.
const listenerLoop = "github.com/jetway-ci/jetway/internal/delayproxy_test.listen.func1"

// listen serves each connection to a new loopback listener with handle
// until the test ends; handle's connection is closed after it returns.
func listen(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(testDeadline))
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// startProxy starts a proxy to target, closed when the test ends (before
// the target's listener, as cleanups run last-in first-out).
func startProxy(t testing.TB, target string, oneWay time.Duration) *delayproxy.Proxy {
	t.Helper()
	p, err := delayproxy.Start(t.Context(), target, oneWay)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t testing.TB, addr string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(testDeadline)))
	return c.(*net.TCPConn)
}

// exchange sends size seeded pseudo-random bytes on c, then half-closes
// it, while it hashes everything c receives until EOF. It returns the
// hashes of what it sent and what it received.
func exchange(c *net.TCPConn, seed uint64, size int64) (sent, received [32]byte, err error) {
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() {
		h := sha256.New()
		src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{byte(seed)}), size), h)
		if _, sendErr = io.Copy(c, src); sendErr == nil {
			sendErr = c.CloseWrite()
		}
		copy(sent[:], h.Sum(nil))
	})
	h := sha256.New()
	_, err = io.Copy(h, c)
	copy(received[:], h.Sum(nil))
	wg.Wait()
	if err == nil {
		err = sendErr
	}
	return sent, received, err
}

func TestBytesArriveIntactBothWays(t *testing.T) {
	const size = 64 << 20
	// A proxy that sleeps between a read and its write carries at most a
	// 64 KiB read per delay: 64 MiB would take 1024 delays (51 s).
	const oneWay = 50 * time.Millisecond
	type result struct{ sent, received [32]byte }
	fromServer := make(chan result, 1)
	target := listen(t, func(c net.Conn) {
		sent, received, err := exchange(c.(*net.TCPConn), 2, size)
		assert.NoError(t, err)
		fromServer <- result{sent, received}
	})
	p := startProxy(t, target, oneWay)

	start := time.Now()
	sent, received, err := exchange(dial(t, p.Addr()), 1, size)
	require.NoError(t, err)
	elapsed := time.Since(start)
	server := <-fromServer

	assert.Equal(t, sent, server.received, "client to server")
	assert.Equal(t, server.sent, received, "server to client")
	assert.Less(t, elapsed, 10*time.Second, "the proxy does not pipeline")
	t.Logf("64 MiB each way at %v one-way in %v", oneWay, elapsed)
}

func TestHalfClosePropagates(t *testing.T) {
	target := listen(t, func(c net.Conn) {
		// ReadAll returns only once the client's half-close arrived.
		got, err := io.ReadAll(c)
		assert.NoError(t, err)
		_, err = c.Write(append([]byte("got "), got...))
		assert.NoError(t, err)
	})
	c := dial(t, startProxy(t, target, 10*time.Millisecond).Addr())

	_, err := c.Write([]byte("ping"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	reply, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, "got ping", string(reply))
}

func TestRoundTripIsTwiceTheDelay(t *testing.T) {
	const oneWay = 25 * time.Millisecond
	target := listen(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
	c := dial(t, startProxy(t, target, oneWay).Addr())

	b := []byte{0}
	for range 5 {
		start := time.Now()
		_, err := c.Write(b)
		require.NoError(t, err)
		_, err = io.ReadFull(c, b)
		require.NoError(t, err)
		rtt := time.Since(start)
		assert.GreaterOrEqual(t, rtt, 2*oneWay)
		assert.Less(t, rtt, 2*oneWay+time.Second, "a round trip is stuck")
	}
}

func TestUnreachableTargetClosesClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	target := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	c := dial(t, startProxy(t, target, 0).Addr())
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err)
}

func TestCloseStopsConnectionsAndGoroutines(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	target := listen(t, func(c net.Conn) {
		_, _ = io.Copy(c, rand.NewChaCha8([32]byte{})) // until the proxy closes c
	})
	p, err := delayproxy.Start(ctx, target, 20*time.Millisecond)
	require.NoError(t, err)
	idle := dial(t, p.Addr())
	busy := dial(t, p.Addr())
	require.NoError(t, idle.CloseWrite()) // a half-closed connection too
	_, err = io.ReadFull(busy, make([]byte, 1<<20))
	require.NoError(t, err, "data flows before Close")

	require.NoError(t, p.Close())
	assert.Empty(t, proxyGoroutines(), "Close returned before the proxy's goroutines ended")
	require.NoError(t, p.Close(), "Close is idempotent")

	for _, c := range []*net.TCPConn{busy, idle} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err := io.Copy(io.Discard, c) // EOF or a reset, once the buffers drain
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the proxy left the connection open")
	}
	goleak.VerifyNone(t, goleak.IgnoreAnyFunction(listenerLoop))
}

// proxyGoroutines returns the stacks of running goroutines that are in, or
// were started by, package delayproxy. goleak would wait for them to end.
func proxyGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var found []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "/internal/delayproxy.") {
			found = append(found, g)
		}
	}
	return found
}
