package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
)

// Streamer is what the API asks of the streams package.
type Streamer interface {
	Stream(ctx context.Context, req streams.Request) (streams.Result, error)
}

// createStream copies a volume between step pods and answers with the
// bytes carried and their SHA-256, or an error naming the side that failed.
func (s *Server) createStream(w http.ResponseWriter, r *http.Request) {
	var req streams.Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "body must be {\"from\": {target, pod, handle, path}, \"to\": {...}, \"encoding\": \"raw|gzip|zstd\"}: " + err.Error()})
		return
	}
	id := requestIdentity(r)
	for _, name := range []string{req.From.Target, req.To.Target} {
		st, err := s.opts.Targets.Get(name)
		if err != nil || !id.sees(st.Meta.Team) {
			writeJSON(w, http.StatusNotFound, errorBody{Error: "unknown target " + name})
			return
		}
	}
	res, err := s.opts.Streams.Stream(r.Context(), req)
	var serr *streams.Error
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, streams.ErrInvalid):
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
	case errors.Is(err, targets.ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error()})
	case errors.As(err, &serr):
		s.opts.Logger.Warn("stream failed", "side", serr.Side, "error", err.Error())
		writeJSON(w, http.StatusBadGateway, streamError{Error: err.Error(), Side: serr.Side})
	default:
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
	}
}

type streamError struct {
	Error string `json:"error"`
	Side  string `json:"side"`
}
