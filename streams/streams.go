// Package streams copies volumes between step pods: a source pod's volume
// server streams a tar out (baggageclaim stream-out) and jetway pipes it
// into the destination pod's stream-in, both reached through port-forward,
// so pods on clusters that cannot see each other exchange artifacts. Memory
// stays flat (one pooled buffer per stream); any failure aborts the
// destination's request, so a truncated artifact never looks complete.
// A stream touches only pods jetway made for the target, and a team's
// caller only its team's pods (see access.go).
package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// VolumePort is where each step pod's volume server listens.
const VolumePort = 7788

// Encodings a stream may use, as baggageclaim names them.
var Encodings = []string{"raw", "gzip", "zstd"}

// Request asks for one volume path to be copied: the body of POST
// /api/v1/streams and who asks.
type Request struct {
	wire.StreamRequest
	// Caller is who asks. The API sets it from the request's token; it is
	// never read from a body, and its zero value may touch no pod.
	Caller Caller `json:"-"`
	// Source, set by the API, is the gateway that owns From when another
	// gateway of the mesh does; never read from a body.
	Source *Remote `json:"-"`
}

// Remote is a stream's source owned by another gateway of the mesh. That
// gateway checks the caller may touch the source pod, port-forwards to it
// and sends its bytes over the mesh (Send).
type Remote struct {
	Gateway string
	// Open asks Gateway for From's stream-out, as the stream's caller. The
	// body it returns fails, rather than ends, unless Gateway said it sent
	// everything.
	Open func(ctx context.Context, from wire.Endpoint, encoding string) (io.ReadCloser, error)
}

// Caller is who asks for a stream: an admin, or a team.
type Caller struct {
	Admin bool
	Team  string
}

// Stream modes. A mesh stream's source is owned by another gateway, which
// sends the bytes over the mesh; the source's side counts as mesh_send.
const (
	ModeRelay    = "relay"
	ModeP2P      = "p2p"
	ModeMesh     = "mesh"
	modeMeshSend = "mesh_send"
)

// Sides of a stream, as Error names them.
const (
	SideSource      = "source"
	SideDestination = "destination"
)

// Error says which side of a stream failed and, in a mesh, on which
// gateway.
type Error struct {
	Side    string // SideSource or SideDestination
	Gateway string // the mesh member (gateway, agent) that reached that side; "" outside a mesh
	Err     error
}

func (e *Error) Error() string {
	if e.Gateway == "" {
		return e.Side + ": " + e.Err.Error()
	}
	return e.Side + " (mesh member " + e.Gateway + "): " + e.Err.Error()
}
func (e *Error) Unwrap() error { return e.Err }

// Errors of a stream refused before it starts.
var (
	// ErrInvalid marks a malformed request.
	ErrInvalid = errors.New("invalid stream request")
	// ErrNotFound marks a pod that does not exist or that the caller may
	// not touch: the two answer alike, so a caller learns nothing about
	// pods that are not its own.
	ErrNotFound = errors.New("not found")
	// ErrBusy marks a stream refused because MaxStreams are running.
	ErrBusy = errors.New("too many streams")
)

// DefaultStallTimeout is how long a stream may move no bytes before it is
// aborted. A volume server's tar stream never pauses this long while it
// works; a dead one behind a port-forward that stays open sends nothing.
// At 10 s (and the watchdog's tick) a stalled stream is reported within
// 12 s.
const DefaultStallTimeout = 10 * time.Second

// Options configure a Streamer.
type Options struct {
	Dialer *portforward.Dialer
	// Transport, if set, carries the volume servers' requests instead of
	// Dialer's port-forwards (tests).
	Transport http.RoundTripper
	// Installation is this jetway installation's name: a stream touches
	// only pods labelled with it (required).
	Installation string
	// Key is the installation's pod key: a stream touches only pods it
	// sealed, and reaches their sidecars with their tokens (required).
	Key ownership.Key
	// Target returns a target's clients (the registry's Target). Every
	// stream reads both of its pods through them to check they are jetway's
	// and the caller's; the destination's IP lets streams within one
	// target go direct (stream-p2p-out).
	Target func(name string) (*targets.Target, error)
	// MaxStreams bounds the streams running at once; past it Stream fails
	// with ErrBusy at once. 0 means no bound.
	MaxStreams int
	// BufferSize is the copy buffer of one stream; default 1 MiB.
	BufferSize int
	// StallTimeout aborts a stream when no bytes move for this long (a hung
	// volume server, or a port-forward that stays open after the process
	// behind it died); default DefaultStallTimeout.
	StallTimeout time.Duration
	// Gateway is this gateway's name in the mesh, for errors to name it;
	// "" outside a mesh.
	Gateway string
	Metrics *Metrics
	Logger  *slog.Logger
}

// Streamer carries streams.
type Streamer struct {
	opts   Options
	client *http.Client
	bufs   sync.Pool
	slots  chan struct{} // one per running stream; nil without MaxStreams
}

// New builds a Streamer.
func New(opts Options) *Streamer {
	if opts.BufferSize <= 0 {
		// Measured on the local clusters: 1 MiB keeps a stream's syscalls
		// and port-forward frames few; larger buys nothing.
		opts.BufferSize = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.Transport == nil {
		opts.Transport = opts.Dialer.RoundTripper()
	}
	s := &Streamer{opts: opts, client: &http.Client{Transport: podBound{opts.Transport}}}
	s.bufs.New = func() any { b := make([]byte, opts.BufferSize); return &b }
	if opts.MaxStreams > 0 {
		s.slots = make(chan struct{}, opts.MaxStreams)
	}
	return s
}

// Close releases idle connections.
func (s *Streamer) Close() { s.client.CloseIdleConnections() }

// Validate reports every problem of a request at once, wrapping
// ErrInvalid.
func (r Request) Validate() error {
	var probs []string
	for _, side := range []struct {
		name string
		e    wire.Endpoint
	}{{"from", r.From}, {"to", r.To}} {
		for _, f := range []struct{ name, v string }{{"target", side.e.Target}, {"pod", side.e.Pod}, {"handle", side.e.Handle}} {
			if f.v == "" {
				probs = append(probs, side.name+"."+f.name+" is required")
			}
		}
	}
	if mb, err := strconv.ParseFloat(r.Limit, 64); r.Limit != "" && (err != nil || !(mb > 0)) {
		probs = append(probs, fmt.Sprintf("limit %q is not a positive number of MB", r.Limit))
	}
	if r.Encoding != "" && !contains(Encodings, r.Encoding) {
		probs = append(probs, fmt.Sprintf("encoding %q is not one of %s", r.Encoding, strings.Join(Encodings, ", ")))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(probs, "; "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Progress follows one stream while it runs: Started is closed once the
// request passed its checks and the stream begins, and the count is the
// bytes relayed so far.
type Progress struct {
	atomic.Int64
	once, startOnce sync.Once
	started         chan struct{}
}

// Started is closed once the stream passed its checks (valid, within
// MaxStreams, both pods found and the caller's) and begins to move bytes.
func (p *Progress) Started() <-chan struct{} { return p.ch() }

func (p *Progress) ch() chan struct{} {
	p.once.Do(func() { p.started = make(chan struct{}) })
	return p.started
}

// Start closes Started. Stream calls it; so do fakes of a Streamer. A nil
// Progress ignores it.
func (p *Progress) Start() {
	if p != nil {
		p.startOnce.Do(func() { close(p.ch()) })
	}
}

// Stream copies req.From into req.To and returns what was carried.
// Cancelling ctx cancels both sides. It fails with ErrInvalid, ErrBusy or
// ErrNotFound before touching a volume, else with an *Error naming the
// side, and the result's mode and bytes say how far it went. progress,
// if set, follows the stream.
func (s *Streamer) Stream(ctx context.Context, req Request, progress *Progress) (wire.StreamResult, error) {
	if err := req.Validate(); err != nil {
		s.opts.Metrics.reject(reasonInvalid)
		return wire.StreamResult{}, err
	}
	if req.Encoding == "" {
		req.Encoding = "raw"
	}
	release, err := s.acquire()
	if err != nil {
		s.opts.Metrics.reject(reasonBusy)
		return wire.StreamResult{}, err
	}
	defer release()
	dst, err := s.authorize(ctx, req)
	if errors.Is(err, ErrNotFound) {
		s.opts.Metrics.reject(reasonNotFound)
	}
	if err != nil {
		s.nameGateway(req, err)
		return wire.StreamResult{}, err
	}
	progress.Start()
	start := time.Now()
	res, err := s.run(ctx, req, dst, progress)
	res.Seconds = time.Since(start).Seconds()
	s.nameGateway(req, err)
	s.opts.Metrics.finished(res, outcome(ctx, err))
	if err != nil {
		// The path it took, and the bytes it moved, even so.
		return wire.StreamResult{Mode: res.Mode, Bytes: res.Bytes}, err
	}
	return res, nil
}

// acquire takes one of MaxStreams slots without waiting.
func (s *Streamer) acquire() (release func(), err error) {
	if s.slots == nil {
		return func() {}, nil
	}
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, nil
	default:
		return nil, fmt.Errorf("%w: %d are running, as many as max-streams allows", ErrBusy, cap(s.slots))
	}
}

// nameGateway names, in a stream's error, the gateway that reached the
// side that failed: the source's owner for a source over the mesh, else
// this one.
func (s *Streamer) nameGateway(req Request, err error) {
	var serr *Error
	if !errors.As(err, &serr) || serr.Gateway != "" {
		return
	}
	serr.Gateway = s.opts.Gateway
	if serr.Side == SideSource && req.Source != nil {
		serr.Gateway = req.Source.Gateway
	}
}

// run streams directly within one target when it can, else relays. The
// result names the mode tried last, and bytes relayed even on failure.
func (s *Streamer) run(ctx context.Context, req Request, dst *corev1.Pod, progress *Progress) (wire.StreamResult, error) {
	if req.Source != nil {
		return s.relay(ctx, req, progress)
	}
	if req.From.Target == req.To.Target {
		res, err := s.p2p(ctx, req, dst.Status.PodIP)
		if err == nil {
			return res, nil
		}
		// A push refused for what the volume or the archive holds is
		// refused the same relayed: it fails the stream, once (a push's
		// failure counts as its source's).
		if remote, final := errors.AsType[*RemoteError](err); ctx.Err() != nil || final && remote.Final() {
			return wire.StreamResult{Mode: ModeP2P}, &Error{Side: SideSource, Err: err}
		}
		s.opts.Logger.Warn("direct stream failed; relaying", "target", req.From.Target,
			"from", req.From.Pod, "to", req.To.Pod, "error", err.Error())
	}
	return s.relay(ctx, req, progress)
}
