package portforward

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
)

// silentAPIServer accepts TCP connections and never answers, as a hung
// API server (or a black-holing load balancer) does. It returns the
// address; connections are closed when the test ends.
func silentAPIServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// upgradeModes: both transports, over plain HTTP (the request is sent and
// the response never comes) and TLS (the handshake never completes).
var upgradeModes = []struct {
	name, scheme string
	spdyOnly     bool
}{
	{"websocket-http", "http", false},
	{"websocket-https", "https", false},
	{"spdy-http", "http", true},
	{"spdy-https", "https", true},
}

func silentDialer(t *testing.T, scheme string, opts Options) *Dialer {
	cfg := &rest.Config{Host: scheme + "://" + silentAPIServer(t), TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	opts.Resolve = func(string) (*rest.Config, error) { return cfg, nil }
	return New(opts)
}

type dialResult struct {
	took time.Duration
	err  error
}

// dialAsync dials t/ns/p under ctx in the background.
func dialAsync(ctx context.Context, d *Dialer) <-chan dialResult {
	out := make(chan dialResult, 1)
	go func() {
		start := time.Now()
		c, err := d.Dial(ctx, "t", "ns", "p", 80)
		if c != nil {
			c.Close()
		}
		out <- dialResult{time.Since(start), err}
	}()
	return out
}

// await fails the test if r does not arrive within a generous bound: a
// hang, not slowness, is what these tests catch.
func await(t *testing.T, r <-chan dialResult, what string) dialResult {
	t.Helper()
	select {
	case res := <-r:
		return res
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: Dial still blocked after 15s", what)
		return dialResult{}
	}
}

// TestDialTimeoutAgainstSilentAPIServer: the upgrade gives up after
// DialTimeout, says which pod timed out, counts as a timeout, and the pod
// is not blocked afterwards: the next Dial tries again.
func TestDialTimeoutAgainstSilentAPIServer(t *testing.T) {
	for _, mode := range upgradeModes {
		t.Run(mode.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			d := silentDialer(t, mode.scheme, Options{DialTimeout: 200 * time.Millisecond, SPDYOnly: mode.spdyOnly, Metrics: NewMetrics(reg)})
			run(t, d)
			for range 2 {
				res := await(t, dialAsync(context.Background(), d), "DialTimeout 200ms")
				require.Error(t, res.err)
				assert.ErrorIs(t, res.err, context.DeadlineExceeded)
				assert.ErrorContains(t, res.err, "t/ns/p")
				assert.ErrorContains(t, res.err, "timed out")
			}
			transport := TransportWebSocket
			if mode.spdyOnly {
				transport = TransportSPDY
			}
			assert.Equal(t, 2.0, counter(t, reg, "jetway_portforward_dials_total", map[string]string{"transport": transport, "result": "timeout"}))
		})
	}
}

// TestCallersAndShutdownNotBlockedByUpgrade: Dials waiting on one stuck
// upgrade each return when their own ctx ends, and Start's shutdown
// cancels the upgrade (and a Dial still waiting) instead of waiting for it.
func TestCallersAndShutdownNotBlockedByUpgrade(t *testing.T) {
	for _, mode := range upgradeModes {
		t.Run(mode.name, func(t *testing.T) {
			d := silentDialer(t, mode.scheme, Options{DialTimeout: time.Hour, SPDYOnly: mode.spdyOnly})
			ctx, cancel := context.WithCancel(context.Background())
			started := make(chan error, 1)
			go func() { started <- d.Start(ctx) }()

			short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancelShort()
			first, second := dialAsync(short, d), dialAsync(short, d)
			unbounded := dialAsync(context.Background(), d)
			for _, r := range []<-chan dialResult{first, second} {
				res := await(t, r, "caller ctx 100ms")
				assert.ErrorIs(t, res.err, context.DeadlineExceeded)
				assert.ErrorContains(t, res.err, "t/ns/p")
				assert.ErrorContains(t, res.err, "timed out")
			}

			cancel()
			select {
			case err := <-started:
				require.NoError(t, err)
			case <-time.After(15 * time.Second):
				t.Fatal("Start still shutting down 15s after cancel: blocked on the in-flight upgrade")
			}
			res := await(t, unbounded, "shutdown")
			assert.ErrorIs(t, res.err, ErrClosed)
			assert.True(t, strings.Contains(res.err.Error(), "t/ns/p"), res.err)
		})
	}
}

// counter reads one counter of reg by name and labels; 0 when absent.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
