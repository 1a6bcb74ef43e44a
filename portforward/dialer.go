// Package portforward dials a pod's port through the Kubernetes API server
// without a local listener. One upgraded connection per pod (per pod UID
// when the caller gives it, WithPodUID; WebSocket,
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
	"strconv"
	"sync"
	"time"

	"github.com/moby/spdystream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
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
	// DialTimeout bounds one connection upgrade: connecting, TLS, and the
	// API server's answer (which waits on the kubelet). Healthy upgrades
	// take milliseconds; the default, 30s, rides out a loaded API server
	// while freeing the pod for a new attempt long before anyone gives up
	// on a hung one. client-go sets no bound at all; gorilla/websocket's
	// own default handshake timeout is 45s.
	DialTimeout time.Duration
	// SPDYOnly skips WebSocket (tests, or servers known to need SPDY).
	SPDYOnly bool
	// Now is the clock for idle accounting; default time.Now.
	Now     func() time.Time
	Metrics *Metrics
	Logger  *slog.Logger
}

// Dialer dials pods' ports through their API servers. Start runs its
// supervisor; Dial works before and after, but connections are only closed
// for idleness while Start runs.
type Dialer struct {
	opts Options
	life context.Context // ends when Start returns; bounds every upgrade
	end  context.CancelFunc

	mu     sync.Mutex
	conns  map[podKey]*podConn
	closed bool
	wg     sync.WaitGroup

	upgradeFn      func(ctx context.Context, key podKey) (httpstream.Connection, string, error)
	hookIdlePicked func() // tests: runs between closeIdle's choice and its closing
}

// podKey names the pod a connection reaches: uid, when the dial's context
// gave one (WithPodUID), tells apart pods of one name, one made after the
// other.
type podKey struct {
	target, namespace, pod string
	uid                    types.UID
}

func (k podKey) String() string { return k.target + "/" + k.namespace + "/" + k.pod }

type podUIDKey struct{}

// WithPodUID is ctx saying which pod, of the name a Dial (or a request
// through RoundTripper) gives, the caller means: a connection reaches
// the pod the API server found when it was made, so a pod made under the
// name of one gone must not get streams on the gone one's connection
// (some kubelets never refuse them, they hang). Dials with another UID,
// or none, get a connection of their own.
func WithPodUID(ctx context.Context, uid types.UID) context.Context {
	return context.WithValue(ctx, podUIDKey{}, uid)
}

func podUID(ctx context.Context) types.UID {
	uid, _ := ctx.Value(podUIDKey{}).(types.UID)
	return uid
}

// podConn is one upgraded connection to a pod, shared by its streams.
type podConn struct {
	key       podKey
	ready     chan struct{} // closed once dialed (conn or err set)
	conn      httpstream.Connection
	transport string
	err       error

	mu       sync.Mutex
	active   int
	closing  bool // closeIdle or retire chose it: no new streams
	retired  bool // retire chose it: closed when its last stream ends
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
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Dialer{opts: opts, conns: map[podKey]*podConn{}}
	d.life, d.end = context.WithCancel(context.Background())
	d.upgradeFn = d.upgrade
	return d
}

// Start closes idle connections until ctx ends, then cancels upgrades in
// flight, closes every connection and waits for their supervisors.
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

// close stops new dials and ends d.life: each supervisor then cancels its
// upgrade or closes its connection. It waits for them.
func (d *Dialer) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.end()
	d.wg.Wait()
}

// closeIdle closes connections idle past IdleTimeout. A chosen connection
// is marked closing and forgotten under the locks, so no Dial gets a
// stream on it from then on: the next Dial to its pod dials afresh.
func (d *Dialer) closeIdle() {
	now := d.opts.Now()
	d.mu.Lock()
	var idle []*podConn
	for key, pc := range d.conns {
		if pc.closeIfIdle(now, d.opts.IdleTimeout) {
			delete(d.conns, key)
			idle = append(idle, pc)
		}
	}
	d.mu.Unlock()
	if d.hookIdlePicked != nil && len(idle) > 0 {
		d.hookIdlePicked()
	}
	for _, pc := range idle {
		d.opts.Logger.Debug("closing idle port-forward connection", "pod", pc.key.String())
		_ = pc.conn.Close() // its supervisor records the close
	}
}

// closeIfIdle marks pc closing if it is dialed and has had no streams for
// longer than timeout.
func (pc *podConn) closeIfIdle(now time.Time, timeout time.Duration) bool {
	select {
	case <-pc.ready:
	default:
		return false
	}
	if pc.conn == nil {
		return false
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.active > 0 || now.Sub(pc.lastUsed) <= timeout {
		return false
	}
	pc.closing = true
	return true
}

// acquire counts a new stream on pc and returns its request ID, unless pc
// is closing.
func (pc *podConn) acquire() (string, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closing {
		return "", false
	}
	pc.active++
	pc.nextID++
	return strconv.Itoa(pc.nextID), true
}

func (pc *podConn) release(now time.Time) {
	pc.mu.Lock()
	pc.active--
	pc.lastUsed = now
	drained := pc.retired && pc.active == 0
	pc.mu.Unlock()
	if drained {
		_ = pc.conn.Close() // its supervisor records the close
	}
}

// retire takes pc out of use once the kubelet refused a stream on it: a
// connection reaches the pod the API server found when it was made, so
// if that pod is gone and another was made under its name (a volume
// holder replaced), every stream on it fails, on some runtimes only
// after a timeout (containerd 2.x). The next Dial makes a new
// connection; pc closes when its last stream ends.
func (d *Dialer) retire(pc *podConn) {
	d.forget(pc)
	pc.mu.Lock()
	pc.closing, pc.retired = true, true
	drained := pc.active == 0
	pc.mu.Unlock()
	if drained {
		_ = pc.conn.Close()
	}
}

// dead reports whether pc's connection has closed.
func (pc *podConn) dead() bool {
	select {
	case <-pc.conn.CloseChan():
		return true
	default:
		return false
	}
}

// connection returns the pod's live connection with a stream acquired on
// it, dialing it if needed; concurrent callers share one dial. ctx bounds
// the caller's wait, not the dial, which outlives this call.
func (d *Dialer) connection(ctx context.Context, key podKey) (*podConn, string, error) {
	for {
		pc, err := d.podConn(key)
		if err != nil {
			return nil, "", err
		}
		select {
		case <-pc.ready:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, "", fmt.Errorf("dial %s: timed out waiting for the port-forward upgrade: %w", key, ctx.Err())
			}
			return nil, "", fmt.Errorf("dial %s: %w", key, ctx.Err())
		}
		if pc.err != nil {
			return nil, "", pc.err
		}
		if id, ok := pc.acquire(); ok {
			return pc, id, nil
		}
		// closeIdle took it after it was ready, and forgot it: dial anew.
	}
}

// podConn returns the pod's connection, starting its dial if there is none.
func (d *Dialer) podConn(key podKey) (*podConn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("dial %s: %w", key, ErrClosed)
	}
	pc, ok := d.conns[key]
	if !ok {
		pc = &podConn{key: key, ready: make(chan struct{})}
		d.conns[key] = pc
		d.wg.Go(func() { d.dial(pc) })
	}
	return pc, nil
}

// dial upgrades a connection for pc, then supervises it: when it closes,
// for whatever reason, it is forgotten so the next Dial opens a new one.
// The upgrade is bounded by DialTimeout and the Dialer's life, not by the
// ctx of the Dial that caused it: the connection outlives that call.
func (d *Dialer) dial(pc *podConn) {
	start := d.opts.Now()
	ctx, cancel := context.WithTimeout(d.life, d.opts.DialTimeout)
	conn, transport, err := d.upgradeFn(ctx, pc.key)
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || deadlinePassed(ctx):
		err = fmt.Errorf("dial %s: port-forward upgrade timed out after %s: %w", pc.key, d.opts.DialTimeout, context.DeadlineExceeded)
	case d.life.Err() != nil:
		err = fmt.Errorf("dial %s: %w", pc.key, ErrClosed)
	default:
		err = fmt.Errorf("dial %s: %w", pc.key, err)
	}
	cancel()
	d.opts.Metrics.dialed(transport, err, d.opts.Now().Sub(start))
	if err != nil {
		pc.err = err
		d.forget(pc)
		close(pc.ready)
		return
	}
	pc.conn, pc.transport, pc.lastUsed = conn, transport, d.opts.Now()
	close(pc.ready)
	d.opts.Metrics.opened()
	d.opts.Logger.Debug("port-forward connection open", "pod", pc.key.String(), "transport", transport)
	select {
	case <-conn.CloseChan():
	case <-d.life.Done():
		_ = conn.Close()
	}
	d.forget(pc)
	d.opts.Metrics.closed()
	d.opts.Logger.Debug("port-forward connection closed", "pod", pc.key.String())
}

// deadlinePassed reports whether ctx's deadline has passed; a connection
// deadline gorilla/websocket derives from it can fire before ctx's timer.
func deadlinePassed(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ok && !time.Now().Before(deadline)
}

func (d *Dialer) forget(pc *podConn) {
	d.mu.Lock()
	if d.conns[pc.key] == pc {
		delete(d.conns, pc.key)
	}
	d.mu.Unlock()
}

// Dial connects to port of the pod namespace/pod on target, through the
// target's API server. The connection is a stream on the pod's shared
// upgraded connection; closing it leaves the others alone, and so does a
// stream that fails to open.
func (d *Dialer) Dial(ctx context.Context, target, namespace, pod string, port int) (*Conn, error) {
	key := podKey{target: target, namespace: namespace, pod: pod, uid: podUID(ctx)}
	for attempt := 0; ; attempt++ {
		pc, id, err := d.connection(ctx, key)
		if err != nil {
			d.opts.Metrics.stream(err)
			return nil, err
		}
		c, err := d.open(pc, id, port)
		if err == nil {
			d.opts.Metrics.stream(nil)
			return c, nil
		}
		err = fmt.Errorf("dial %s:%d: %w", key, port, err)
		if attempt > 0 || !pc.dead() && !errors.Is(err, spdystream.ErrTimeout) {
			d.opts.Metrics.stream(err)
			return nil, err
		}
		// The shared connection died under us, or answers no new stream
		// (seen on a kubelet after a stream to a port nothing listened on
		// yet: each later stream timed out): forget it, close it, and
		// dial once more.
		d.forget(pc)
		if !pc.dead() {
			_ = pc.conn.Close()
		}
	}
}

// open creates the error and data streams of forwarded connection id.
func (d *Dialer) open(pc *podConn, id string, port int) (*Conn, error) {
	release := func() { pc.release(d.opts.Now()) }
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
		_ = errStream.Reset()
		pc.conn.RemoveStreams(errStream)
		release()
		return nil, fmt.Errorf("create data stream: %w", err)
	}
	return newConn(pc, port, errStream, data, d.opts.Metrics, release, func() { d.retire(pc) }), nil
}
