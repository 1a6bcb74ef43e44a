package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// Steps is what the API asks of the steps package.
type Steps interface {
	Submit(caller streams.Caller, req wire.Request) (wire.View, bool, error)
	Get(caller streams.Caller, team, handle string) (wire.View, error)
	Events(ctx context.Context, caller streams.Caller, team, handle string, since int, send func([]wire.Event) error) error
	// Readable says whether the step's events from since on can be read:
	// its view's errors, or ErrGone for events that went with its pod.
	Readable(caller streams.Caller, team, handle string, since int) error
	Abort(ctx context.Context, caller streams.Caller, team, handle string) (wire.View, error)
	Upload(ctx context.Context, caller streams.Caller, team, handle, input, encoding string, body io.Reader) (wire.InputDigest, error)
	Download(ctx context.Context, caller streams.Caller, team, handle, output, encoding string) (io.ReadCloser, error)
}

// stepBodyLimit bounds a step's body: its stdin is small (resources pass
// JSON), its artifacts come through inputs.
const stepBodyLimit = 4 << 20

// abortWait bounds how long DELETE waits for the process to be killed and
// the pod to go before it answers 202 with the step as it is.
const abortWait = 45 * time.Second

func caller(r *http.Request) streams.Caller {
	id := requestIdentity(r)
	return streams.Caller{Admin: id.admin, Team: id.team}
}

// submitStep accepts a step: 202 when new, 200 with the existing step
// when the handle is taken in the team.
func (s *Server) submitStep(w http.ResponseWriter, r *http.Request) {
	var req wire.Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, stepBodyLimit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		ferr := decodeError(err)
		writeJSON(w, http.StatusBadRequest, badRequest{Error: ferr.Error(), Field: ferr.field})
		return
	}
	if dec.More() {
		writeJSON(w, http.StatusBadRequest, badRequest{Error: "body: more than one JSON value", Field: "body"})
		return
	}
	view, created, err := s.opts.Steps.Submit(caller(r), req)
	if err != nil {
		s.stepError(w, err)
		return
	}
	w.Header().Set("Location", "/api/v1/steps/"+view.Handle)
	status := http.StatusOK
	if created {
		status = http.StatusAccepted
	}
	writeJSON(w, status, view)
}

// stepError answers an error of the steps package.
func (s *Server) stepError(w http.ResponseWriter, err error) {
	var ferr *wire.FieldError
	switch {
	case errors.As(err, &ferr):
		writeJSON(w, http.StatusBadRequest, badRequest{Error: ferr.Error(), Field: ferr.Field})
	case errors.Is(err, wire.ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error()})
	case errors.Is(err, wire.ErrForbidden):
		writeJSON(w, http.StatusForbidden, errorBody{Error: err.Error()})
	case errors.Is(err, wire.ErrConflict):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error()})
	case errors.Is(err, wire.ErrGone):
		writeJSON(w, http.StatusGone, errorBody{Error: err.Error()})
	case errors.Is(err, wire.ErrInput):
		writeJSON(w, http.StatusUnprocessableEntity, errorBody{Error: err.Error()})
	case errors.Is(err, wire.ErrUnavailable):
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: err.Error()})
	default:
		s.opts.Logger.Warn("step request failed", "error", err.Error())
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
	}
}

// getStep answers a step's view. Admins name a team's step with ?team=.
func (s *Server) getStep(w http.ResponseWriter, r *http.Request) {
	view, err := s.opts.Steps.Get(caller(r), r.URL.Query().Get("team"), r.PathValue("handle"))
	if err != nil {
		s.stepError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, view)
}

// stepEvents streams a step's events as NDJSON from ?since= (default 0),
// following them until the step has ended.
func (s *Server) stepEvents(w http.ResponseWriter, r *http.Request) {
	since := 0
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeJSON(w, http.StatusBadRequest, badRequest{Error: "since: " + strconv.Quote(v) + " is not an event number (0 or more)", Field: "since"})
			return
		}
		since = n
	}
	c, team, handle := caller(r), r.URL.Query().Get("team"), r.PathValue("handle")
	// A gateway that stops ends the stream; the client asks again from
	// the next event, of this gateway's successor.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-s.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := s.opts.Steps.Readable(c, team, handle, since); err != nil {
		s.stepError(w, err)
		return
	}
	w.Header().Set("Content-Type", NDJSON)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	err := s.opts.Steps.Events(ctx, c, team, handle, since, func(evs []wire.Event) error {
		for _, e := range evs {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		s.opts.Logger.Debug("step events ended early", "handle", handle, "error", err.Error())
	}
}

// abortStep kills the step's process and releases its pod: 200 with the
// step once done, 202 if that takes longer than abortWait.
func (s *Server) abortStep(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), abortWait)
	defer cancel()
	view, err := s.opts.Steps.Abort(ctx, caller(r), r.URL.Query().Get("team"), r.PathValue("handle"))
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, view)
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		writeJSON(w, http.StatusAccepted, view)
	default:
		s.stepError(w, err)
	}
}

// encoding is a transfer's ?encoding=, default gzip.
func encoding(r *http.Request) string {
	if e := r.URL.Query().Get("encoding"); e != "" {
		return e
	}
	return "gzip"
}

// uploadInput streams the body, a tar in ?encoding= (raw, gzip or zstd;
// default gzip), into an input the step declared {from: {upload: true}},
// once the step's pod is ready for it: 200 with its size and SHA-256.
func (s *Server) uploadInput(w http.ResponseWriter, r *http.Request) {
	got, err := s.opts.Steps.Upload(r.Context(), caller(r), r.URL.Query().Get("team"), r.PathValue("handle"),
		r.PathValue("name"), encoding(r), r.Body)
	if err != nil {
		s.stepError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, got)
}

// downloadOutput streams an output of an ended step as a tar in
// ?encoding= (default gzip).
func (s *Server) downloadOutput(w http.ResponseWriter, r *http.Request) {
	enc := encoding(r)
	body, err := s.opts.Steps.Download(r.Context(), caller(r), r.URL.Query().Get("team"), r.PathValue("handle"),
		r.PathValue("name"), enc)
	if err != nil {
		s.stepError(w, err)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", map[string]string{"raw": "application/x-tar", "gzip": "application/gzip", "zstd": "application/zstd"}[enc])
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, body); err != nil {
		if r.Context().Err() == nil {
			s.opts.Logger.Warn("output download cut", "handle", r.PathValue("handle"), "output", r.PathValue("name"), "error", err.Error())
		}
		panic(http.ErrAbortHandler) // the client sees it cut, not ended: a partial output never looks whole
	}
}
