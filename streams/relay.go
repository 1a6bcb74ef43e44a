package streams

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// volumeRequest is a request to a pod's volume server, reached by
// port-forward, with the pod's token: op on the endpoint's volume path,
// or, for an op starting with "/", that path of the server.
func (s *Streamer) volumeRequest(ctx context.Context, e wire.Endpoint, op string, q url.Values, body io.Reader) (*http.Request, error) {
	path := op
	if !strings.HasPrefix(op, "/") {
		if q == nil {
			q = url.Values{}
		}
		q.Set("path", e.Path)
		path = "/volumes/" + url.PathEscape(e.Handle) + "/" + op
	}
	return s.podRequest(ctx, e.Target, e.Pod, http.MethodPut, path, q, body)
}

// podRequest is a request to path of a pod's volume server, reached by
// port-forward, with the pod's token: only to the pod jetway made under
// that name (trusted), as the target's watch (or, before the watch shows
// it, the API server) has it now.
func (s *Streamer) podRequest(ctx context.Context, target, pod, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	if s.opts.Key.IsZero() {
		return nil, errNoKey
	}
	t, err := s.opts.Target(target)
	if err != nil {
		return nil, err
	}
	p := t.CachedPod(pod)
	if p == nil {
		gctx, cancel := context.WithTimeout(ctx, podLookupTimeout)
		p, err = t.Pod(gctx, pod)
		cancel()
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("pod %q %w on target %q", pod, ErrNotFound, target)
		}
		if err != nil {
			return nil, fmt.Errorf("read pod %s on target %s: %w", pod, target, err)
		}
	}
	if err := s.trusted(target, p); err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "http", Host: portforward.Host(target, t.Namespace(), pod, VolumePort), Path: path, RawQuery: q.Encode()}
	// Its UID: a connection made to a pod of that name before (one now
	// gone) carries none of its streams, and the request ends once the
	// watch shows it gone (podBound).
	ctx = withBoundPod(portforward.WithPodUID(ctx, p.UID), boundPod{target: t, name: pod, uid: p.UID})
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.opts.Key.PodToken(target, p))
	return req, nil
}

// VolumeServer sends one request to a pod's volume server: method on
// path, with query q, header h (the token is set here) and body. It
// checks no caller: the concourse package reaches its volume holders
// with it, for the web node they serve.
func (s *Streamer) VolumeServer(ctx context.Context, target, pod, method, path string, q url.Values, h http.Header, body io.Reader) (*http.Response, error) {
	req, err := s.podRequest(ctx, target, pod, method, path, q, body)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		if k != "Authorization" {
			req.Header[k] = v
		}
	}
	return s.client.Do(req)
}

// errNoKey: a streamer without the installation's pod key reaches no pod.
var errNoKey = errors.New("the installation's pod key is not read from the state namespace (yet): no pod is reached without it (docs/steps.md)")

// errDestinationDone ends the source's side of a relay once the
// destination's request has ended: what the source does then is not the
// stream's failure.
var errDestinationDone = errors.New("destination finished reading")

// relay pipes the source's stream-out into the destination's stream-in.
// A source failure aborts the upload; the destination's answer, success
// or failure, cancels the source at once, so a failed destination is
// reported as soon as it answers instead of after the source's next bytes
// or the stall timeout.
func (s *Streamer) relay(ctx context.Context, req Request, progress *Progress) (wire.StreamResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcCtx, cancelSrc := context.WithCancelCause(ctx)
	defer cancelSrc(nil)
	src, err := s.openSource(srcCtx, req)
	if err != nil {
		return wire.StreamResult{Mode: mode(req)}, &Error{Side: SideSource, Err: err}
	}
	defer src.Close()

	pr, pw := io.Pipe()
	hash := sha256.New()
	wd := newWatchdog(s.opts.StallTimeout, cancel)
	var (
		n      int64
		srcErr error
		cut    bool // the destination stopped taking bytes before the end
		copied = make(chan struct{})
	)
	go func() {
		defer close(copied)
		buf := s.bufs.Get().(*[]byte)
		defer s.bufs.Put(buf)
		n, srcErr = pump(pw, src, hash, *buf, wd, progress)
		if srcErr != nil && (errors.Is(srcErr, errDestinationDone) || errors.Is(context.Cause(srcCtx), errDestinationDone)) {
			srcErr, cut = nil, true // the destination answered first; its error decides
		}
		// A source failure aborts the upload: the destination's body read
		// fails, and it discards what it got.
		pw.CloseWithError(srcErr)
	}()
	dstErr := s.put(ctx, req, pr)
	cancelSrc(errDestinationDone)         // a pending Read returns now
	pr.CloseWithError(errDestinationDone) // and so does a pending Write
	<-copied
	res := wire.StreamResult{Mode: mode(req), Bytes: n}
	switch stalled := wd.stop(); {
	case stalled == phaseReading:
		return res, &Error{Side: SideSource, Err: fmt.Errorf("stalled: no data from stream-out for %s", s.opts.StallTimeout)}
	case stalled == phaseWriting:
		return res, &Error{Side: SideDestination, Err: fmt.Errorf("stalled: stream-in took no data for %s", s.opts.StallTimeout)}
	case srcErr != nil:
		return res, &Error{Side: SideSource, Err: srcErr}
	case dstErr != nil:
		return res, &Error{Side: SideDestination, Err: dstErr}
	case cut:
		return res, &Error{Side: SideDestination, Err: fmt.Errorf("stream-in %s/%s: answered before the stream ended", req.To.Pod, req.To.Handle)}
	}
	res.SHA256 = hex.EncodeToString(hash.Sum(nil))
	return res, nil
}

// mode is a relay's mode: mesh when the source's bytes come over the mesh.
func mode(req Request) string {
	if req.Source != nil {
		return ModeMesh
	}
	return ModeRelay
}

// openSource opens the source's stream-out: through the gateway that owns
// it, or here.
func (s *Streamer) openSource(ctx context.Context, req Request) (io.ReadCloser, error) {
	if req.Source != nil {
		return req.Source.Open(ctx, req.From, req.Encoding)
	}
	return s.open(ctx, req)
}

// p2p asks the source pod to push the volume straight to the destination
// pod's stream-in at ip (pods of one target reach each other). The push
// carries a ticket registered with the destination for this one stream:
// the source learns no token of the destination.
func (s *Streamer) p2p(ctx context.Context, req Request, ip string) (wire.StreamResult, error) {
	if ip == "" {
		return wire.StreamResult{}, fmt.Errorf("pod %s has no IP yet", req.To.Pod)
	}
	ticket := rand.Text() + rand.Text()
	if err := s.register(ctx, req.To, ticket); err != nil {
		return wire.StreamResult{}, err
	}
	q := limitQuery(req)
	q.Set("path", req.To.Path)
	in := url.URL{Scheme: "http", Host: net.JoinHostPort(ip, strconv.Itoa(VolumePort)),
		Path: "/volumes/" + url.PathEscape(req.To.Handle) + "/stream-in", RawQuery: q.Encode()}
	hreq, err := s.volumeRequest(ctx, req.From, "stream-p2p-out", url.Values{"streamInURL": {in.String()}, "encoding": {req.Encoding}}, nil)
	if err != nil {
		return wire.StreamResult{}, err
	}
	hreq.Header.Set(volumes.StreamInAuthorization, "Bearer "+ticket)
	resp, err := s.client.Do(hreq)
	if err != nil {
		return wire.StreamResult{}, fmt.Errorf("stream-p2p-out %s/%s: %w", req.From.Pod, req.From.Handle, err)
	}
	defer resp.Body.Close()
	res := wire.StreamResult{Mode: ModeP2P}
	switch resp.StatusCode {
	case http.StatusOK: // jetway's sidecar says what the destination took
		var got volumes.P2PResult
		if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&got); err != nil {
			return res, fmt.Errorf("stream-p2p-out %s/%s: answer: %w", req.From.Pod, req.From.Handle, err)
		}
		res.Bytes, res.SHA256 = got.Bytes, got.SHA256
	case http.StatusNoContent: // another baggageclaim: it carried, unhashed
	default:
		return res, fmt.Errorf("stream-p2p-out %s/%s: %w", req.From.Pod, req.From.Handle, remoteError(resp))
	}
	return res, nil
}

// limitQuery is the query of req's stream-in but its path: its limit,
// if it has one.
func limitQuery(req Request) url.Values {
	q := url.Values{}
	if req.Limit != "" {
		q.Set("limit", req.Limit)
	}
	return q
}

// register registers ticket with the destination's sidecar for one
// stream-in into e.
func (s *Streamer) register(ctx context.Context, e wire.Endpoint, ticket string) error {
	body, _ := json.Marshal(volumes.TicketRequest{SHA256: ownership.TokenHash(ticket), Handle: e.Handle, Path: e.Path})
	hreq, err := s.volumeRequest(ctx, e, "/tickets", nil, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Method = http.MethodPost
	resp, err := s.client.Do(hreq)
	if err != nil {
		return fmt.Errorf("ticket for %s/%s: %w", e.Pod, e.Handle, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("ticket for %s/%s: %w", e.Pod, e.Handle, remoteError(resp))
	}
	return nil
}

// pump copies src into dst through buf, hashing what passes and telling
// the watchdog which side it waits on.
func pump(dst io.Writer, src io.Reader, hash io.Writer, buf []byte, wd *watchdog, progress *Progress) (int64, error) {
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

// open starts the source's stream-out and returns its body.
func (s *Streamer) open(ctx context.Context, req Request) (io.ReadCloser, error) {
	hreq, err := s.volumeRequest(ctx, req.From, "stream-out", nil, nil)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept-Encoding", req.Encoding)
	hreq.Header.Set(volumes.AcceptErrorTrailer, "true")
	resp, err := s.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("stream-out %s/%s: %w", req.From.Pod, req.From.Handle, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("stream-out %s/%s: %w", req.From.Pod, req.From.Handle, remoteError(resp))
	}
	return &streamOutBody{resp: resp, from: req.From}, nil
}

// streamOutBody is a stream-out's body, which fails at its end if its
// trailer says the volume server failed after it began (a file it may
// not read): the archive stopped there, and must not look whole.
type streamOutBody struct {
	resp *http.Response
	from wire.Endpoint
}

func (b *streamOutBody) Read(p []byte) (int, error) {
	n, err := b.resp.Body.Read(p)
	if errors.Is(err, io.EOF) {
		if code, msg, failed := volumes.StreamOutFailure(b.resp.Trailer); failed {
			err = fmt.Errorf("stream-out %s/%s: %w", b.from.Pod, b.from.Handle,
				&RemoteError{Code: code, Status: strconv.Itoa(code) + " " + http.StatusText(code), Message: msg})
		}
	}
	return n, err
}

func (b *streamOutBody) Close() error { return b.resp.Body.Close() }

// put uploads body into the destination's stream-in.
func (s *Streamer) put(ctx context.Context, req Request, body io.Reader) error {
	hreq, err := s.volumeRequest(ctx, req.To, "stream-in", limitQuery(req), body)
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

// RemoteError is a volume server's answer to a request it refused: its
// status and what it said.
type RemoteError struct {
	Code    int
	Status  string
	Message string
}

func (e *RemoteError) Error() string { return e.Status + ": " + e.Message }

// Final reports whether the answer will be the same if the request is
// made again: a request the server refused for what it is (bad, not
// allowed, too large), or a copy it could not make for what the volume
// or the archive holds (an entry the extractor refuses: 400, or past its
// limits: 403; a file it may not read or write: 422,
// volumes.StatusUnreadable; no room: 507), not for the moment it came (a
// volume or a ticket not there yet, too many at once).
func (e *RemoteError) Final() bool {
	switch e.Code {
	case http.StatusNotFound, http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return false
	}
	return e.Code == http.StatusInsufficientStorage || e.Code >= 400 && e.Code < 500
}

// remoteError renders a volume server's JSON error answer.
func remoteError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var body struct {
		Error string `json:"error"`
	}
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &body) == nil && body.Error != "" {
		msg = body.Error
	}
	return &RemoteError{Code: resp.StatusCode, Status: resp.Status, Message: msg}
}

// Phases of a relay, for the watchdog to blame the side it waited on.
const (
	phaseNone int32 = iota
	phaseReading
	phaseWriting
)

// watchdogTicks is how many times per timeout the watchdog looks: it fires
// at most timeout/watchdogTicks late.
const watchdogTicks = 8

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
		tick := time.NewTicker(timeout / watchdogTicks)
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

// PutVolume uploads body, a volume stream of encoding (raw, gzip or
// zstd: a tar, compressed or not), into a pod's volume. It checks no
// caller: the steps package does, for the step whose inputs it fills.
func (s *Streamer) PutVolume(ctx context.Context, to wire.Endpoint, encoding string, body io.Reader) error {
	return s.put(ctx, Request{StreamRequest: wire.StreamRequest{To: to, Encoding: encoding}}, body)
}

// OpenVolume opens a pod volume's stream-out in encoding. It checks no
// caller: the steps package does, for the step whose outputs it serves.
func (s *Streamer) OpenVolume(ctx context.Context, from wire.Endpoint, encoding string) (io.ReadCloser, error) {
	return s.open(ctx, Request{StreamRequest: wire.StreamRequest{From: from, Encoding: encoding}})
}
