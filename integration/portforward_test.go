package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/targets"
)

// startEcho serves lines back, prefixed, to every connection.
func startEcho(t *testing.T) int {
	ln := serveTCP(t, func(conn net.Conn) {
		defer conn.Close()
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			fmt.Fprintf(conn, "echo %s\n", sc.Text())
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// forwardTarget prepares namespace ns on c with a running pod whose port
// 7788 reaches a local echo server, and returns the target's client config.
func forwardTarget(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) *rest.Config {
	t.Helper()
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: ns, Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	cfg := restConfig(t, tg.Kubeconfig)
	waitRunning(ctx, t, c.Client, ns, createPod(ctx, t, c, ns, "vol"))
	require.NoError(t, c.ForwardPodPort(ctx, ns, "vol", 7788, "127.0.0.1", startEcho(t)))
	return cfg
}

func createPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) string {
	t.Helper()
	stepPod(ctx, t, c, ns, ns, "jetway", name)
	return name
}

// startDialer runs a Dialer whose targets resolve to cfgs by name.
func startDialer(t *testing.T, opts portforward.Options, cfgs map[string]*rest.Config) (*portforward.Dialer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Metrics = portforward.NewMetrics(reg)
	opts.Resolve = func(target string) (*rest.Config, error) {
		if cfg, ok := cfgs[target]; ok {
			return cfg, nil
		}
		return nil, targets.ErrNotFound
	}
	d := portforward.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return d, reg
}

func echoOnce(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	_, err := fmt.Fprintf(conn, "%s\n", msg)
	require.NoError(t, err)
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo "+msg+"\n", line)
}

// TestDialerSharesOneConnectionPerPod dials a pod many times at once over
// both transports: every stream works and all share one upgraded
// connection.
func TestDialerSharesOneConnectionPerPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := forwardTarget(ctx, t, clusters[0], "pf-share")
	for _, mode := range []struct {
		name      string
		spdyOnly  bool
		transport string
	}{{"websocket", false, portforward.TransportWebSocket}, {"spdy", true, portforward.TransportSPDY}} {
		t.Run(mode.name, func(t *testing.T) {
			d, reg := startDialer(t, portforward.Options{SPDYOnly: mode.spdyOnly}, map[string]*rest.Config{"a": cfg})
			var first *portforward.Conn
			eventually(t, 20*time.Second, func() error { // kwok picks up the PortForward object
				c, err := d.Dial(ctx, "a", "pf-share", "vol", 7788)
				if err != nil {
					return err
				}
				defer c.Close()
				fmt.Fprintf(c, "hello\n")
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return err
				}
				if line != "echo hello\n" {
					return fmt.Errorf("got %q", line)
				}
				first = c
				return nil
			})
			assert.Equal(t, mode.transport, first.Transport())
			// Attempts refused while kwok starts forwarding retire their
			// connection; from the first echo on, no stream dials again.
			dialsSeries := `jetway_portforward_dials_total{result="ok",transport="` + mode.transport + `"}`
			dials := seriesValue(scrape(t, reg), dialsSeries)
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					c, err := d.Dial(ctx, "a", "pf-share", "vol", 7788)
					if !assert.NoError(t, err) {
						return
					}
					defer c.Close()
					echoOnce(t, c, fmt.Sprintf("stream-%d", i))
				})
			}
			wg.Wait()
			m := scrape(t, reg)
			assert.Contains(t, m, "jetway_portforward_connections 1\n")
			assert.Equal(t, dials, seriesValue(m, dialsSeries), "the streams dialled again:\n%s", m)
			assert.Regexp(t, `jetway_portforward_bytes_total\{direction="read"\} [1-9]`, m)
		})
	}
}

// TestDialerFallsBackToSPDY uses an API server with WebSocket port-forward
// turned off: the WebSocket upgrade is refused and the dialer falls back.
func TestDialerFallsBackToSPDY(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Name: "spdy-only", APIServerFeatureGates: "PortForwardWebsockets=false"})
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	cfg := forwardTarget(ctx, t, c, "pf-fallback")
	d, reg := startDialer(t, portforward.Options{}, map[string]*rest.Config{"old": cfg})
	var conn *portforward.Conn
	attempts := 0
	eventually(t, 20*time.Second, func() error {
		attempts++
		conn, err = d.Dial(ctx, "old", "pf-fallback", "vol", 7788)
		if err != nil {
			return err
		}
		fmt.Fprintf(conn, "hi\n")
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || line != "echo hi\n" {
			conn.Close()
			return fmt.Errorf("%q %v", line, err)
		}
		return nil
	})
	defer conn.Close()
	assert.Equal(t, portforward.TransportSPDY, conn.Transport())
	// A stream refused while the echo server starts retires its connection,
	// so each attempt may dial again; every one of them must be SPDY.
	m := scrape(t, reg)
	assert.NotContains(t, m, `transport="websocket"`)
	dials := seriesValue(m, `jetway_portforward_dials_total{result="ok",transport="spdy"}`)
	assert.True(t, dials >= 1 && dials <= float64(attempts), "%v SPDY dials for %d attempts:\n%s", dials, attempts, m)
}

// TestDialerErrors: a missing pod fails fast and says so; a port nothing
// listens on reports the kubelet's error instead of a clean end.
func TestDialerErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := forwardTarget(ctx, t, clusters[1], "pf-errors")
	d, _ := startDialer(t, portforward.Options{}, map[string]*rest.Config{"a": cfg})

	spdy, _ := startDialer(t, portforward.Options{SPDYOnly: true}, map[string]*rest.Config{"a": cfg})
	for _, d := range []*portforward.Dialer{d, spdy} {
		// The API server's refusal comes back as the answer, not a wait
		// for the dial's own timeout.
		_, err := d.Dial(ctx, "a", "pf-errors", "no-such-pod", 7788)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `pods "no-such-pod" not found`)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
		assert.NotContains(t, err.Error(), "timed out")
	}

	_, err := d.Dial(ctx, "nope", "pf-errors", "vol", 7788)
	assert.ErrorIs(t, err, targets.ErrNotFound)

	conn, err := d.Dial(ctx, "a", "pf-errors", "vol", 9999)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.ReadAll(conn)
	require.Error(t, err, "no clean EOF for a port with nothing behind it")
	assert.Contains(t, err.Error(), "9999")
}

// TestDialerAfterAPIServerRestart kills the API server under an open
// stream: the stream fails (not a clean end), and once the server is back
// the next Dial opens a new connection.
func TestDialerAfterAPIServerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	cfg := forwardTarget(ctx, t, c, "pf-restart")
	d, reg := startDialer(t, portforward.Options{}, map[string]*rest.Config{"a": cfg})
	var conn *portforward.Conn
	eventually(t, 20*time.Second, func() (err error) {
		conn, err = d.Dial(ctx, "a", "pf-restart", "vol", 7788)
		if err == nil {
			_, err = fmt.Fprintf(conn, "ping\n")
			if err == nil {
				_, err = bufio.NewReader(conn).ReadString('\n')
			}
			if err != nil {
				conn.Close()
			}
		}
		return err
	})
	c.StopAPIServer()
	_, err := io.ReadAll(conn)
	require.Error(t, err, "a stream cut by the API server must not end cleanly")
	conn.Close()
	eventually(t, 5*time.Second, func() error {
		if !strings.Contains(scrape(t, reg), "jetway_portforward_connections 0\n") {
			return errors.New("dead connection still counted")
		}
		return nil
	})

	require.NoError(t, c.StartAPIServer(ctx))
	eventually(t, 20*time.Second, func() error {
		conn, err := d.Dial(ctx, "a", "pf-restart", "vol", 7788)
		if err != nil {
			return err
		}
		defer conn.Close()
		fmt.Fprintf(conn, "again\n")
		_, err = bufio.NewReader(conn).ReadString('\n')
		return err
	})
}

// manualClock is a clock that moves only when told.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestDialerIdleAndRoundTripper serves HTTP through RoundTripper, then
// idles the pod's connection on a manual clock: it closes once the clock
// passes IdleTimeout, not before, whatever the wall clock does.
func TestDialerIdleAndRoundTripper(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := clusters[0]
	cfg := forwardTarget(ctx, t, c, "pf-http")
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "volume server saw %s %s", r.Method, r.URL.Path)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go web.Serve(ln)
	t.Cleanup(func() { web.Close() })
	waitRunning(ctx, t, c.Client, "pf-http", createPod(ctx, t, c, "pf-http", "web"))
	require.NoError(t, c.ForwardPodPort(ctx, "pf-http", "web", 7788, "127.0.0.1", ln.Addr().(*net.TCPAddr).Port))

	clock := &manualClock{now: time.Unix(1_000_000, 0)}
	// A short IdleTimeout makes the supervisor check often (every
	// IdleTimeout/4 of wall time); idleness itself is on the manual clock.
	d, reg := startDialer(t, portforward.Options{IdleTimeout: 200 * time.Millisecond, Now: clock.Now}, map[string]*rest.Config{"a": cfg})
	rt := d.RoundTripper()
	defer rt.CloseIdleConnections()
	client := &http.Client{Transport: rt}
	eventually(t, 20*time.Second, func() error {
		resp, err := client.Get("http://" + portforward.Host("a", "pf-http", "web", 7788) + "/volumes/v1")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "volume server saw GET /volumes/v1" {
			return fmt.Errorf("body %q", body)
		}
		return nil
	})
	rt.CloseIdleConnections() // ends the streams; the pod connection idles
	assert.Contains(t, scrape(t, reg), "jetway_portforward_connections 1\n")
	// The transport closes its streams in the background, and a stream's
	// close stamps the connection's last use: advance on every check, so
	// the clock passes IdleTimeout after the last stream went.
	eventually(t, 5*time.Second, func() error {
		clock.Advance(time.Second)
		if !strings.Contains(scrape(t, reg), "jetway_portforward_connections 0\n") {
			return errors.New("idle connection not closed")
		}
		return nil
	})
}
