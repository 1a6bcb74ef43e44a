// Package streams copies volumes between step pods: a source pod's volume
// server streams a tar out (baggageclaim stream-out) and jetway pipes it
// into the destination pod's stream-in, both reached through port-forward,
// so pods on clusters that cannot see each other exchange artifacts. Memory
// stays flat (one pooled buffer per stream); any failure aborts the
// destination's request, so a truncated artifact never looks complete.
package streams

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetway-ci/jetway/portforward"
)

// VolumePort is where each step pod's volume server listens.
const VolumePort = 7788

// Encodings a stream may use, as baggageclaim names them.
var Encodings = []string{"raw", "gzip", "zstd"}

// Endpoint is one side of a stream: a path in a volume of a pod.
type Endpoint struct {
	Target string `json:"target"`
	Pod    string `json:"pod"`
	Handle string `json:"handle"`
	Path   string `json:"path"`
}

// Request asks for one volume path to be copied.
type Request struct {
	From     Endpoint `json:"from"`
	To       Endpoint `json:"to"`
	Encoding string   `json:"encoding"`
}

// Result is what a finished stream carried. A relayed stream reports the
// encoded bytes and their SHA-256 as the destination received them; a
// direct (p2p) one never passes through jetway, so it reports neither.
type Result struct {
	Mode    string  `json:"mode"` // "relay" or "p2p"
	Bytes   int64   `json:"bytes,omitempty"`
	SHA256  string  `json:"sha256,omitempty"`
	Seconds float64 `json:"seconds"`
}

// Stream modes.
const (
	ModeRelay = "relay"
	ModeP2P   = "p2p"
)

// Error says which side of a stream failed.
type Error struct {
	Side string // "source" or "destination"
	Err  error
}

func (e *Error) Error() string { return e.Side + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ErrInvalid marks a malformed request.
var ErrInvalid = errors.New("invalid stream request")

// Options configure a Streamer.
type Options struct {
	Dialer *portforward.Dialer
	// Namespace returns a target's namespace.
	Namespace func(target string) (string, error)
	// PodIP returns a pod's IP; with it, streams within one target ask the
	// source to push straight to the destination (stream-p2p-out).
	PodIP func(ctx context.Context, target, pod string) (string, error)
	// BufferSize is the copy buffer of one stream; default 1 MiB.
	BufferSize int
	// StallTimeout aborts a stream when no bytes move for this long (a hung
	// volume server, or a port-forward that stays open after the process
	// behind it died); default 2m.
	StallTimeout time.Duration
	Logger       *slog.Logger
}

// Streamer carries streams.
type Streamer struct {
	opts   Options
	client *http.Client
	bufs   sync.Pool
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
		opts.StallTimeout = 2 * time.Minute
	}
	s := &Streamer{opts: opts, client: &http.Client{Transport: opts.Dialer.RoundTripper()}}
	s.bufs.New = func() any { b := make([]byte, opts.BufferSize); return &b }
	return s
}

// Close releases idle connections.
func (s *Streamer) Close() { s.client.CloseIdleConnections() }

func (r Request) validate() error {
	var probs []string
	for side, e := range map[string]Endpoint{"from": r.From, "to": r.To} {
		for field, v := range map[string]string{"target": e.Target, "pod": e.Pod, "handle": e.Handle} {
			if v == "" {
				probs = append(probs, side+"."+field+" is required")
			}
		}
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

// volumeURL is a pod's volume server endpoint, reached by port-forward.
func (s *Streamer) volumeURL(e Endpoint, op string) (string, error) {
	ns, err := s.opts.Namespace(e.Target)
	if err != nil {
		return "", err
	}
	u := url.URL{Scheme: "http", Host: portforward.Host(e.Target, ns, e.Pod, VolumePort),
		Path: "/volumes/" + url.PathEscape(e.Handle) + "/" + op, RawQuery: url.Values{"path": {e.Path}}.Encode()}
	return u.String(), nil
}

// Progress counts the bytes a relayed stream has carried so far; callers
// read it while Stream runs.
type Progress struct{ atomic.Int64 }

// Stream copies req.From into req.To and returns what was carried.
// Cancelling ctx cancels both sides. progress, if set, counts relayed
// bytes as they pass.
func (s *Streamer) Stream(ctx context.Context, req Request, progress *Progress) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	if req.Encoding == "" {
		req.Encoding = "raw"
	}
	start := time.Now()
	if req.From.Target == req.To.Target && s.opts.PodIP != nil {
		err := s.p2p(ctx, req)
		if err == nil {
			return Result{Mode: ModeP2P, Seconds: time.Since(start).Seconds()}, nil
		}
		if ctx.Err() != nil {
			return Result{}, &Error{Side: "source", Err: err}
		}
		s.opts.Logger.Warn("direct stream failed; relaying", "target", req.From.Target,
			"from", req.From.Pod, "to", req.To.Pod, "error", err.Error())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	src, err := s.open(ctx, req)
	if err != nil {
		return Result{}, &Error{Side: "source", Err: err}
	}
	defer src.Close()

	pr, pw := io.Pipe()
	hash := sha256.New()
	wd := newWatchdog(s.opts.StallTimeout, cancel)
	var (
		n      int64
		srcErr error
		copied = make(chan struct{})
	)
	go func() {
		defer close(copied)
		buf := s.bufs.Get().(*[]byte)
		defer s.bufs.Put(buf)
		n, srcErr = relay(pw, src, hash, *buf, wd, progress)
		if errors.Is(srcErr, errDestinationDone) {
			srcErr = nil // the destination answered first; its error decides
		}
		// A source failure aborts the upload: the destination's body read
		// fails, and it discards what it got.
		pw.CloseWithError(srcErr)
	}()
	dstErr := s.put(ctx, req, pr)
	pr.CloseWithError(errDestinationDone) // unblock the copy if the destination quit
	<-copied
	stalled := wd.stop()
	switch {
	case stalled == phaseReading:
		return Result{}, &Error{Side: "source", Err: fmt.Errorf("stalled: no data from stream-out for %s", s.opts.StallTimeout)}
	case stalled == phaseWriting:
		return Result{}, &Error{Side: "destination", Err: fmt.Errorf("stalled: stream-in took no data for %s", s.opts.StallTimeout)}
	case srcErr != nil:
		return Result{}, &Error{Side: "source", Err: srcErr}
	case dstErr != nil:
		return Result{}, &Error{Side: "destination", Err: dstErr}
	}
	return Result{Mode: ModeRelay, Bytes: n, SHA256: hex.EncodeToString(hash.Sum(nil)), Seconds: time.Since(start).Seconds()}, nil
}

// p2p asks the source pod to push the volume straight to the destination
// pod's stream-in (pods of one target reach each other).
func (s *Streamer) p2p(ctx context.Context, req Request) error {
	ip, err := s.opts.PodIP(ctx, req.To.Target, req.To.Pod)
	if err != nil {
		return err
	}
	in := url.URL{Scheme: "http", Host: net.JoinHostPort(ip, strconv.Itoa(VolumePort)),
		Path: "/volumes/" + url.PathEscape(req.To.Handle) + "/stream-in", RawQuery: url.Values{"path": {req.To.Path}}.Encode()}
	u, err := s.volumeURL(req.From, "stream-p2p-out")
	if err != nil {
		return err
	}
	u += "&" + url.Values{"streamInURL": {in.String()}, "encoding": {req.Encoding}}.Encode()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPut, u, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(hreq)
	if err != nil {
		return fmt.Errorf("stream-p2p-out %s/%s: %w", req.From.Pod, req.From.Handle, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("stream-p2p-out %s/%s: %w", req.From.Pod, req.From.Handle, remoteError(resp))
	}
	return nil
}

// relay copies src into dst through buf, hashing what passes and telling
// the watchdog which side it waits on.
func relay(dst io.Writer, src io.Reader, hash io.Writer, buf []byte, wd *watchdog, progress *Progress) (int64, error) {
	var n int64
	for {
		wd.enter(phaseReading)
		nr, rerr := src.Read(buf)
		if nr > 0 {
			hash.Write(buf[:nr])
			wd.enter(phaseWriting)
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if progress != nil {
				progress.Add(int64(nw))
			}
			if werr != nil {
				// The pipe only fails once the destination's request ended:
				// its error is the one to report.
				return n, errDestinationDone
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

var errDestinationDone = errors.New("destination finished reading")

// open starts the source's stream-out and returns its body.
func (s *Streamer) open(ctx context.Context, req Request) (io.ReadCloser, error) {
	u, err := s.volumeURL(req.From, "stream-out")
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPut, u, nil)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept-Encoding", req.Encoding)
	resp, err := s.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("stream-out %s/%s: %w", req.From.Pod, req.From.Handle, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("stream-out %s/%s: %w", req.From.Pod, req.From.Handle, remoteError(resp))
	}
	return resp.Body, nil
}

// put uploads body into the destination's stream-in.
func (s *Streamer) put(ctx context.Context, req Request, body io.Reader) error {
	u, err := s.volumeURL(req.To, "stream-in")
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body)
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Encoding", req.Encoding)
	resp, err := s.client.Do(hreq)
	if err != nil {
		return fmt.Errorf("stream-in %s/%s: %w", req.To.Pod, req.To.Handle, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("stream-in %s/%s: %w", req.To.Pod, req.To.Handle, remoteError(resp))
	}
	return nil
}

// remoteError renders a volume server's JSON error answer.
func remoteError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &body) == nil && body.Error != "" {
		return fmt.Errorf("%s: %s", resp.Status, body.Error)
	}
	return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
}

// Phases of a relay, for the watchdog to blame the side it waited on.
const (
	phaseNone int32 = iota
	phaseReading
	phaseWriting
)

// watchdog cancels a stream whose relay makes no progress for timeout.
type watchdog struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds of the last progress
	phase   atomic.Int32
	stalled atomic.Int32 // phase at the time it fired, or phaseNone
	done    chan struct{}
	exited  chan struct{}
}

func newWatchdog(timeout time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{timeout: timeout, done: make(chan struct{}), exited: make(chan struct{})}
	w.last.Store(time.Now().UnixNano())
	w.phase.Store(phaseReading)
	go func() {
		defer close(w.exited)
		tick := time.NewTicker(timeout / 4)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case now := <-tick.C:
				if now.Sub(time.Unix(0, w.last.Load())) > timeout {
					w.stalled.Store(w.phase.Load())
					cancel()
					return
				}
			}
		}
	}()
	return w
}

// enter records progress and the phase the relay now waits in.
func (w *watchdog) enter(phase int32) {
	w.last.Store(time.Now().UnixNano())
	w.phase.Store(phase)
}

// stop ends the watchdog and reports the phase it fired in, if it did.
func (w *watchdog) stop() int32 {
	close(w.done)
	<-w.exited
	return w.stalled.Load()
}
