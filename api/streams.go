package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Streamer is what the API asks of the streams package.
type Streamer interface {
	Stream(ctx context.Context, req streams.Request, progress *streams.Progress) (wire.StreamResult, error)
	Send(ctx context.Context, caller streams.Caller, from wire.Endpoint, encoding string, begin func() io.Writer) (int64, error)
}

// NDJSON is the media type of a stream's progress answer: with
// Accept: application/x-ndjson, POST /api/v1/streams answers 200 once the
// stream has begun (a refused stream gets its status code as without),
// then one {"bytes", "seconds"} line every progressEvery, then a last line
// {"result": {...}} or {"error": "...", "side": "..."}.
const NDJSON = "application/x-ndjson"

const progressEvery = 500 * time.Millisecond

// streamBodyLimit bounds a stream request's body.
const streamBodyLimit = 1 << 20

// createStream copies a volume between step pods and answers with the
// bytes carried and their SHA-256, or an error naming the side that failed.
// The request is checked whole before any target is looked up, and a
// stream refused (bad request, unknown target or pod, too many streams)
// gets its status code in NDJSON mode too.
//
// In a mesh, the gateway that owns the destination runs the stream: a
// stream into another gateway's target is forwarded to it, and a source
// another gateway owns is sent by that gateway over the mesh.
func (s *Server) createStream(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, streamBodyLimit))
	var req streams.Request
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(&req)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "body must be {\"from\": {target, pod, handle, path}, \"to\": {...}, \"encoding\": \"raw|gzip|zstd\"}: " + err.Error()})
		return
	}
	if err := req.Validate(); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
		return
	}
	id := requestIdentity(r)
	var owners [2]*mesh.Remote // nil: this gateway's
	for i, name := range []string{req.From.Target, req.To.Target} {
		if st, err := s.opts.Targets.Get(name); err == nil {
			if !id.sees(st.Meta.Team) {
				writeJSON(w, http.StatusNotFound, errorBody{Error: "unknown target " + name})
				return
			}
			continue
		}
		rt, err := s.remote(r, name)
		switch {
		case errors.Is(err, targets.ErrNotFound):
			writeJSON(w, http.StatusNotFound, errorBody{Error: "unknown target " + name})
			return
		case err != nil:
			writeJSON(w, http.StatusConflict, errorBody{Error: err.Error()})
			return
		}
		owners[i] = &rt
	}
	if dst := owners[1]; dst != nil {
		if _, fromPeer := mesh.Peer(r.Context()); fromPeer {
			// The forwarding gateway saw this one own it; it no longer does.
			writeJSON(w, http.StatusNotFound, errorBody{Error: "unknown target " + req.To.Target})
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		s.forward(w, r, *dst)
		return
	}
	if src := owners[0]; src != nil {
		if !src.Reachable {
			s.opts.Mesh.Metrics().Forwarded("unreachable")
			writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: unreachableOwner(*src)})
			return
		}
		req.Source = meshSource(s.opts.Mesh, *src, callerHeader(r))
	}
	req.Caller = streams.Caller{Admin: id.admin, Team: id.team}
	if strings.Contains(r.Header.Get("Accept"), NDJSON) {
		s.streamWithProgress(w, r, req)
		return
	}
	res, err := s.opts.Streams.Stream(r.Context(), req, nil)
	s.answerStream(w, res, err)
}

// streamsRetryAfter is the Retry-After of a stream refused for too many
// streams: streams end every few seconds on a busy gateway.
const streamsRetryAfter = "1"

// answerStream answers with a stream's result or why it failed.
func (s *Server) answerStream(w http.ResponseWriter, res wire.StreamResult, err error) {
	var serr *streams.Error
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, streams.ErrInvalid):
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
	case errors.Is(err, streams.ErrNotFound), errors.Is(err, targets.ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error()})
	case errors.Is(err, errAmbiguous):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error()})
	case errors.Is(err, streams.ErrBusy):
		w.Header().Set("Retry-After", streamsRetryAfter)
		writeJSON(w, http.StatusTooManyRequests, errorBody{Error: err.Error()})
	case errors.As(err, &serr):
		s.opts.Logger.Warn("stream failed", "side", serr.Side, "error", err.Error())
		writeJSON(w, http.StatusBadGateway, streamError{Error: serr.Err.Error(), Side: serr.Side, Gateway: serr.Gateway})
	default:
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
	}
}

type streamError struct {
	Error   string `json:"error"`
	Side    string `json:"side"`
	Gateway string `json:"gateway,omitempty"`
}

// ProgressLine is one line of an NDJSON stream answer.
type ProgressLine struct {
	Bytes   int64              `json:"bytes,omitempty"`
	Seconds float64            `json:"seconds,omitempty"`
	Result  *wire.StreamResult `json:"result,omitempty"`
	Error   string             `json:"error,omitempty"`
	Side    string             `json:"side,omitempty"`
	Gateway string             `json:"gateway,omitempty"`
}

// streamWithProgress answers 200 only once the stream has begun; a
// stream refused before answers as without NDJSON.
func (s *Server) streamWithProgress(w http.ResponseWriter, r *http.Request, req streams.Request) {
	var progress streams.Progress
	done := make(chan struct{})
	var (
		res wire.StreamResult
		err error
	)
	go func() {
		defer close(done)
		res, err = s.opts.Streams.Stream(r.Context(), req, &progress)
	}()
	select {
	case <-progress.Started():
	case <-done:
		select {
		case <-progress.Started():
		default:
			s.answerStream(w, res, err)
			return
		}
	}
	w.Header().Set("Content-Type", NDJSON)
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flush := func(line ProgressLine) {
		_ = enc.Encode(line)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	start := time.Now()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-tick.C:
			flush(ProgressLine{Bytes: progress.Load(), Seconds: time.Since(start).Seconds()})
		case <-done:
			running = false
		}
	}
	var serr *streams.Error
	switch {
	case err == nil:
		flush(ProgressLine{Result: &res})
	case errors.As(err, &serr):
		s.opts.Logger.Warn("stream failed", "side", serr.Side, "error", err.Error())
		flush(ProgressLine{Error: serr.Err.Error(), Side: serr.Side, Gateway: serr.Gateway})
	default:
		flush(ProgressLine{Error: err.Error()})
	}
}
