// Package portforward dials a pod's port through the Kubernetes API server
// without a local listener. One upgraded connection per pod (WebSocket,
// falling back to SPDY for servers that refuse it) carries every stream to
// that pod; a supervisor drops a connection when it dies, so the next Dial
// opens a new one, and closes connections left idle.
package portforward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// Transport names, the label values of the dial metrics.
const (
	TransportWebSocket = "websocket"
	TransportSPDY      = "spdy"
)

// Resolver returns the client configuration of a target.
type Resolver func(target string) (*rest.Config, error)

// Options configure a Dialer.
type Options struct {
	Resolve Resolver
	// IdleTimeout closes a pod connection without streams for this long;
	// default 90s.
	IdleTimeout time.Duration
	// SPDYOnly skips WebSocket (tests, or servers known to need SPDY).
	SPDYOnly bool
	Metrics  *Metrics
	Logger   *slog.Logger
}

// Dialer dials pods' ports through their API servers. Start runs its
// supervisor; Dial works before and after, but connections are only closed
// for idleness while Start runs.
type Dialer struct {
	opts Options

	mu     sync.Mutex
	conns  map[podKey]*podConn
	closed bool
	wg     sync.WaitGroup
}

type podKey struct{ target, namespace, pod string }

func (k podKey) String() string { return k.target + "/" + k.namespace + "/" + k.pod }

// podConn is one upgraded connection to a pod, shared by its streams.
type podConn struct {
	key       podKey
	ready     chan struct{} // closed once dialed (conn or err set)
	conn      httpstream.Connection
	transport string
	err       error

	mu       sync.Mutex
	active   int
	lastUsed time.Time
	nextID   int
}

// ErrClosed is returned by Dial after the Dialer stopped.
var ErrClosed = errors.New("port-forward dialer closed")

// New builds a Dialer.
func New(opts Options) *Dialer {
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 90 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Dialer{opts: opts, conns: map[podKey]*podConn{}}
}

// Start closes idle connections until ctx ends, then closes every
// connection and waits for their supervisors.
func (d *Dialer) Start(ctx context.Context) error {
	tick := time.NewTicker(d.opts.IdleTimeout / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			d.close()
			return nil
		case <-tick.C:
			d.closeIdle()
		}
	}
}

func (d *Dialer) close() {
	d.mu.Lock()
	d.closed = true
	conns := make([]*podConn, 0, len(d.conns))
	for _, pc := range d.conns {
		conns = append(conns, pc)
	}
	d.mu.Unlock()
	for _, pc := range conns {
		<-pc.ready
		if pc.conn != nil {
			_ = pc.conn.Close()
		}
	}
	d.wg.Wait()
}

func (d *Dialer) closeIdle() {
	now := time.Now()
	d.mu.Lock()
	var idle []*podConn
	for _, pc := range d.conns {
		select {
		case <-pc.ready:
		default:
			continue
		}
		pc.mu.Lock()
		if pc.conn != nil && pc.active == 0 && now.Sub(pc.lastUsed) > d.opts.IdleTimeout {
			idle = append(idle, pc)
		}
		pc.mu.Unlock()
	}
	d.mu.Unlock()
	for _, pc := range idle {
		d.opts.Logger.Debug("closing idle port-forward connection", "pod", pc.key.String())
		_ = pc.conn.Close() // its supervisor forgets it
	}
}

// connection returns the pod's live connection, dialing it if needed;
// concurrent callers share one dial.
func (d *Dialer) connection(ctx context.Context, key podKey) (*podConn, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrClosed
	}
	pc, ok := d.conns[key]
	if !ok {
		pc = &podConn{key: key, ready: make(chan struct{})}
		d.conns[key] = pc
		d.wg.Go(func() { d.dial(pc) })
	}
	d.mu.Unlock()
	select {
	case <-pc.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("dial %s: %w", key, ctx.Err())
	}
	if pc.err != nil {
		return nil, pc.err
	}
	return pc, nil
}

// dial upgrades a connection for pc, then supervises it: when it closes,
// for whatever reason, it is forgotten so the next Dial opens a new one.
// It is not tied to the ctx of the Dial that caused it: the connection
// outlives that call.
func (d *Dialer) dial(pc *podConn) {
	start := time.Now()
	conn, transport, err := d.upgrade(pc.key)
	d.opts.Metrics.dialed(transport, err, time.Since(start))
	if err != nil {
		pc.err = fmt.Errorf("dial %s: %w", pc.key, err)
		d.forget(pc)
		close(pc.ready)
		return
	}
	pc.conn, pc.transport, pc.lastUsed = conn, transport, time.Now()
	close(pc.ready)
	d.opts.Metrics.opened()
	d.opts.Logger.Debug("port-forward connection open", "pod", pc.key.String(), "transport", transport)
	<-conn.CloseChan()
	d.forget(pc)
	d.opts.Metrics.closed()
	d.opts.Logger.Debug("port-forward connection closed", "pod", pc.key.String())
}

func (d *Dialer) forget(pc *podConn) {
	d.mu.Lock()
	if d.conns[pc.key] == pc {
		delete(d.conns, pc.key)
	}
	d.mu.Unlock()
}

// upgrade opens the pod's port-forward connection: WebSocket first, then
// SPDY when the server refuses the WebSocket upgrade.
func (d *Dialer) upgrade(key podKey) (httpstream.Connection, string, error) {
	cfg, err := d.opts.Resolve(key.target)
	if err != nil {
		return nil, "", err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, "", fmt.Errorf("API server URL: %w", err)
	}
	u.Path = path.Join("/", u.Path, "api/v1/namespaces", key.namespace, "pods", key.pod, "portforward")
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, "", err
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	if d.opts.SPDYOnly {
		conn, _, err := spdyDialer.Dial(portforward.PortForwardProtocolV1Name)
		return conn, TransportSPDY, err
	}
	wsDialer, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
	if err != nil {
		return nil, "", err
	}
	conn, _, err := wsDialer.Dial(portforward.PortForwardProtocolV1Name)
	if err == nil || !shouldFallback(err) {
		return conn, TransportWebSocket, err
	}
	d.opts.Logger.Info("API server refused the WebSocket port-forward; using SPDY", "pod", key.String(), "error", err.Error())
	conn, _, err = spdyDialer.Dial(portforward.PortForwardProtocolV1Name)
	return conn, TransportSPDY, err
}

// shouldFallback reports whether a WebSocket dial failed for want of
// WebSocket support. client-go's WebSocket transport returns
// k8s.io/streaming's UpgradeFailureError, which apimachinery's
// IsUpgradeFailure (what older code checks) does not match: check both.
func shouldFallback(err error) bool {
	return streamhttp.IsUpgradeFailure(err) || httpstream.IsUpgradeFailure(err) ||
		streamhttp.IsHTTPSProxyError(err) || httpstream.IsHTTPSProxyError(err)
}

// Dial connects to port of the pod namespace/pod on target, through the
// target's API server. The connection is a stream on the pod's shared
// upgraded connection; closing it leaves the others alone.
func (d *Dialer) Dial(ctx context.Context, target, namespace, pod string, port int) (*Conn, error) {
	key := podKey{target: target, namespace: namespace, pod: pod}
	for attempt := 0; ; attempt++ {
		pc, err := d.connection(ctx, key)
		if err != nil {
			d.opts.Metrics.stream(err)
			return nil, err
		}
		c, err := d.open(pc, port)
		if err == nil {
			d.opts.Metrics.stream(nil)
			return c, nil
		}
		// The shared connection died under us: drop it and dial once more.
		_ = pc.conn.Close()
		d.forget(pc)
		if attempt > 0 {
			d.opts.Metrics.stream(err)
			return nil, fmt.Errorf("dial %s:%d: %w", key, port, err)
		}
	}
}

// open creates the error and data streams of one forwarded connection.
func (d *Dialer) open(pc *podConn, port int) (*Conn, error) {
	pc.mu.Lock()
	pc.nextID++
	id := strconv.Itoa(pc.nextID)
	pc.active++
	pc.mu.Unlock()
	release := func() {
		pc.mu.Lock()
		pc.active--
		pc.lastUsed = time.Now()
		pc.mu.Unlock()
	}
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(port))
	h.Set(corev1.PortForwardRequestIDHeader, id)
	errStream, err := pc.conn.CreateStream(h)
	if err != nil {
		release()
		return nil, fmt.Errorf("create error stream: %w", err)
	}
	_ = errStream.Close() // nothing to send on it
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := pc.conn.CreateStream(h)
	if err != nil {
		pc.conn.RemoveStreams(errStream)
		release()
		return nil, fmt.Errorf("create data stream: %w", err)
	}
	return newConn(pc, port, errStream, data, d.opts.Metrics, release), nil
}
