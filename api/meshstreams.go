package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/streams"
)

// A stream whose source another gateway owns: the destination's owner
// asks the source's owner, over the mesh (PUT /api/v1/mesh/stream-out, a
// volume stream), for the source's bytes, as the stream's caller. The
// answer's status says whether the source was found and the caller's; its
// body is the stream-out's bytes; its trailers say how it ended: the bytes
// sent, or why it stopped. A body without the sender's word that it sent
// every byte fails, so a cut never looks like the end of the volume.
const (
	meshStreamOutPath = "/api/v1/mesh/stream-out"
	trailerSent       = "Jetway-Stream-Sent"
	trailerError      = "Jetway-Stream-Error"
)

// meshStreamOut is the body of a stream-out asked over the mesh.
type meshStreamOut struct {
	From     streams.Endpoint `json:"from"`
	Encoding string           `json:"encoding"`
}

// meshSource opens, for r's caller, a source owned by gateway.
func (s *Server) meshSource(r *http.Request, gateway string) func(context.Context, streams.Endpoint, string) (io.ReadCloser, error) {
	who := callerHeader(r)
	return func(ctx context.Context, from streams.Endpoint, encoding string) (io.ReadCloser, error) {
		body, _ := json.Marshal(meshStreamOut{From: from, Encoding: encoding})
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+gateway+meshStreamOutPath, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(CallerHeader, who)
		resp, err := s.opts.Mesh.BulkClient().Do(req)
		if err != nil {
			return nil, fmt.Errorf("over the mesh: %w", err)
		}
		if resp.StatusCode == http.StatusOK {
			return &meshBody{resp: resp}, nil
		}
		defer resp.Body.Close()
		var answer errorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&answer)
		switch resp.StatusCode {
		case http.StatusBadGateway: // the source's volume server failed: its words
			return nil, errors.New(answer.Error)
		case http.StatusNotFound:
			return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, answer.Error)
		case http.StatusTooManyRequests:
			return nil, fmt.Errorf("%w: %s", streams.ErrBusy, answer.Error)
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, answer.Error)
	}
}

// meshBody is a source's bytes from the gateway that owns it.
type meshBody struct {
	resp *http.Response
	n    int64
}

func (b *meshBody) Read(p []byte) (int, error) {
	n, err := b.resp.Body.Read(p)
	b.n += int64(n)
	switch {
	case err == nil:
	case !errors.Is(err, io.EOF):
		err = fmt.Errorf("over the mesh: %w", err)
	case b.resp.Trailer.Get(trailerError) != "":
		err = errors.New(b.resp.Trailer.Get(trailerError))
	case b.resp.Trailer.Get(trailerSent) != strconv.FormatInt(b.n, 10):
		err = fmt.Errorf("over the mesh: the stream ended after %d bytes without the sender's word that it sent them all", b.n)
	}
	return n, err
}

func (b *meshBody) Close() error { return b.resp.Body.Close() }

// streamOut serves a peer's ask for a source's bytes; only over the mesh.
func (s *Server) streamOut(w http.ResponseWriter, r *http.Request) {
	if _, fromPeer := mesh.Peer(r.Context()); !fromPeer {
		http.NotFound(w, r)
		return
	}
	var req meshStreamOut
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, streamBodyLimit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "body must be {\"from\": {target, pod, handle, path}, \"encoding\": ...}: " + err.Error()})
		return
	}
	id := requestIdentity(r)
	began := false
	w.Header().Set("Trailer", trailerSent+", "+trailerError)
	n, err := s.opts.Streams.Send(r.Context(), streams.Caller{Admin: id.admin, Team: id.team}, req.From, req.Encoding, func() io.Writer {
		began = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		return w
	})
	if !began {
		s.answerStream(w, streams.Result{}, err)
		return
	}
	var serr *streams.Error
	switch {
	case errors.As(err, &serr):
		w.Header().Set(trailerError, serr.Err.Error())
	case err != nil:
		w.Header().Set(trailerError, err.Error())
	default:
		w.Header().Set(trailerSent, strconv.FormatInt(n, 10))
	}
}
