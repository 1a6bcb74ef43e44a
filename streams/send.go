package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jetway-ci/jetway/wire"
)

// Send serves the source side of a stream whose destination another
// gateway of the mesh owns: it checks that caller may touch from's pod,
// opens its stream-out, then calls begin and copies the bytes to the
// writer begin returns. It fails before begin with ErrInvalid, ErrBusy,
// ErrNotFound or an *Error; after begin with an *Error naming the side
// that stopped: the source, or the destination (the peer that stopped
// taking bytes), each after StallTimeout without progress at most.
func (s *Streamer) Send(ctx context.Context, caller Caller, from wire.Endpoint, encoding string, begin func() io.Writer) (int64, error) {
	req := Request{StreamRequest: wire.StreamRequest{From: from, To: wire.Endpoint{Target: "-", Pod: "-", Handle: "-"}, Encoding: encoding}, Caller: caller}
	if err := req.Validate(); err != nil {
		s.opts.Metrics.reject(reasonInvalid)
		return 0, err
	}
	if req.Encoding == "" {
		req.Encoding = "raw"
	}
	release, err := s.acquire()
	if err != nil {
		s.opts.Metrics.reject(reasonBusy)
		return 0, err
	}
	defer release()
	if _, err := s.check(ctx, caller, SideSource, from); err != nil {
		if errors.Is(err, ErrNotFound) {
			s.opts.Metrics.reject(reasonNotFound)
		}
		return 0, err
	}
	sctx, cancel := context.WithCancel(ctx) // the watchdog's to cancel
	defer cancel()
	start := time.Now()
	n, err := s.send(sctx, cancel, req, begin)
	s.nameGateway(req, err)
	s.opts.Metrics.finished(wire.StreamResult{Mode: modeMeshSend, Bytes: n, Seconds: time.Since(start).Seconds()}, outcome(ctx, err))
	return n, err
}

func (s *Streamer) send(ctx context.Context, cancel context.CancelFunc, req Request, begin func() io.Writer) (int64, error) {
	src, err := s.open(ctx, req)
	if err != nil {
		return 0, &Error{Side: SideSource, Err: err}
	}
	defer src.Close()
	w := begin()
	buf := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(buf)
	wd := newWatchdog(s.opts.StallTimeout, cancel)
	n, err := pump(w, src, io.Discard, *buf, wd, nil)
	switch stalled := wd.stop(); {
	case stalled == phaseReading:
		return n, &Error{Side: SideSource, Err: fmt.Errorf("stalled: no data from stream-out %s/%s for %s", req.From.Pod, req.From.Handle, s.opts.StallTimeout)}
	case stalled == phaseWriting:
		return n, &Error{Side: SideDestination, Err: fmt.Errorf("stalled: the receiving gateway took no data for %s", s.opts.StallTimeout)}
	case errors.Is(err, errDestinationDone):
		return n, &Error{Side: SideDestination, Err: errors.New("the receiving gateway stopped reading")}
	case err != nil:
		return n, &Error{Side: SideSource, Err: fmt.Errorf("stream-out %s/%s: %w", req.From.Pod, req.From.Handle, err)}
	}
	return n, nil
}
