package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
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
	From     wire.Endpoint `json:"from"`
	Encoding string        `json:"encoding"`
}

// meshSource is a stream's source owned by rt's gateway, asked for the
// caller who names (a CallerHeader).
func meshSource(m Mesh, rt mesh.Remote, who string) *streams.Remote {
	return &streams.Remote{Gateway: rt.Owner, Open: meshOpen(m, rt.Owner, who)}
}

// meshOpen opens a source owned by gateway, for the caller who names.
func meshOpen(m Mesh, gateway, who string) func(context.Context, wire.Endpoint, string) (io.ReadCloser, error) {
	return func(ctx context.Context, from wire.Endpoint, encoding string) (io.ReadCloser, error) {
		body, _ := json.Marshal(meshStreamOut{From: from, Encoding: encoding})
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+gateway+meshStreamOutPath, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(CallerHeader, who)
		resp, err := m.BulkClient().Do(req)
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
// An agent's ask may be for a source another member owns (sendForAgent).
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
	begin := func() io.Writer {
		began = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		return w
	}
	var n int64
	var err error
	if mesh.PeerKind(r.Context()) == mesh.KindAgent {
		n, err = s.sendForAgent(r.Context(), id, req.From, req.Encoding, begin)
	} else {
		n, err = s.opts.Streams.Send(r.Context(), streams.Caller{Admin: id.admin, Team: id.team}, req.From, req.Encoding, begin)
	}
	if !began {
		s.answerStream(w, wire.StreamResult{}, err)
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

// StepStreams is what the steps manager streams a step's inputs with in a
// mesh: an input whose target another gateway owns comes from it, over the
// mesh, asked as the step's submitter, whom that gateway checks as if
// asked directly.
func StepStreams(st *streams.Streamer, reg Targets, m Mesh) steps.Streamer {
	return stepStreams{Streamer: st, targets: reg, mesh: m}
}

type stepStreams struct {
	*streams.Streamer
	targets Targets
	mesh    Mesh
}

func (s stepStreams) Stream(ctx context.Context, req streams.Request, progress *streams.Progress) (wire.StreamResult, error) {
	if req.Source != nil {
		return s.Streamer.Stream(ctx, req, progress)
	}
	id := identity{name: "steps", admin: req.Caller.Admin}
	if !id.admin {
		id.team = req.Caller.Team
	}
	rt, err := findRemote(s.targets, s.mesh, id, req.From.Target)
	switch {
	case errors.Is(err, targets.ErrNotFound): // this gateway's, or nobody's
	case err != nil:
		return wire.StreamResult{}, err
	case !rt.Reachable:
		return wire.StreamResult{}, &streams.Error{Side: streams.SideSource, Gateway: rt.Owner, Err: errors.New(unreachableOwner(rt))}
	default:
		req.Source = meshSource(s.mesh, rt, callerHeaderOf(id))
	}
	return s.Streamer.Stream(ctx, req, progress)
}

// MeshVolumes opens the bytes of a volume through a gateway the agent has
// a session with (gateways lists them), asked as caller: how an agent
// brings its steps' inputs in from the clusters. An agent learns no routes;
// the gateway finds the volume's owner, itself or another member, and
// checks the caller as if asked directly.
func MeshVolumes(m Mesh, gateways func() []string) func(ctx context.Context, caller streams.Caller, from wire.Endpoint, encoding string) (io.ReadCloser, error) {
	return func(ctx context.Context, caller streams.Caller, from wire.Endpoint, encoding string) (io.ReadCloser, error) {
		id := identity{name: "steps", admin: caller.Admin}
		if !id.admin {
			id.team = caller.Team
		}
		gws := gateways()
		if len(gws) == 0 {
			return nil, fmt.Errorf("no gateway to ask for target %s's volume: the agent has no session with one now", from.Target)
		}
		slices.Sort(gws)
		return meshOpen(m, gws[0], callerHeaderOf(id))(ctx, from, encoding)
	}
}

// ConcourseStreams is how the Concourse worker API carries a volume from
// one of this gateway's targets to another worker of the mesh (a web
// node's stream-p2p-out, concourse.Holder.Stream): a destination another
// gateway owns is asked of that gateway (POST /api/v1/streams, as the web
// node's caller), which takes the source's bytes from this one over the
// mesh; any other stream runs as the steps' do (StepStreams). Without a
// mesh (m nil) every stream is st's.
func ConcourseStreams(st *streams.Streamer, reg Targets, m Mesh) func(context.Context, streams.Request) (wire.StreamResult, error) {
	local := stepStreams{Streamer: st, targets: reg, mesh: m}
	return func(ctx context.Context, req streams.Request) (wire.StreamResult, error) {
		if m == nil {
			return st.Stream(ctx, req, nil)
		}
		rt, err := findRemote(reg, m, concourseCaller, req.To.Target)
		switch {
		case errors.Is(err, targets.ErrNotFound): // this gateway's, or nobody's
			return local.Stream(ctx, req, nil)
		case err != nil:
			return wire.StreamResult{}, err
		case !rt.Reachable:
			return wire.StreamResult{Mode: streams.ModeMesh}, &streams.Error{Side: streams.SideDestination, Gateway: rt.Owner, Err: errors.New(unreachableOwner(rt))}
		}
		return meshStream(ctx, m, rt.Owner, req)
	}
}

// meshStream asks gateway, which owns req's destination, to run req as
// the web node's caller, and reads what it answers.
func meshStream(ctx context.Context, m Mesh, gateway string, req streams.Request) (wire.StreamResult, error) {
	failed := wire.StreamResult{Mode: streams.ModeMesh} // what a failure carried, by which path
	body, _ := json.Marshal(req.StreamRequest)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gateway+"/api/v1/streams", bytes.NewReader(body))
	if err != nil {
		return failed, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(CallerHeader, callerHeaderOf(concourseCaller))
	resp, err := m.Client().Do(hreq)
	if err != nil {
		return failed, &streams.Error{Side: streams.SideDestination, Gateway: gateway, Err: fmt.Errorf("over the mesh: %w", err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return failed, &streams.Error{Side: streams.SideDestination, Gateway: gateway, Err: fmt.Errorf("over the mesh: %w", err)}
	}
	if resp.StatusCode == http.StatusOK {
		var res wire.StreamResult
		if err := json.Unmarshal(b, &res); err != nil {
			return res, fmt.Errorf("gateway %s's answer to a stream: %w", gateway, err)
		}
		return res, nil
	}
	var answer streamError
	_ = json.Unmarshal(b, &answer)
	switch {
	case resp.StatusCode == http.StatusBadGateway && answer.Side != "":
		return failed, &streams.Error{Side: answer.Side, Gateway: cmp.Or(answer.Gateway, gateway), Err: errors.New(answer.Error)}
	case resp.StatusCode == http.StatusNotFound:
		return failed, fmt.Errorf("%w: gateway %s: %s", streams.ErrNotFound, gateway, answer.Error)
	case resp.StatusCode == http.StatusTooManyRequests:
		return failed, fmt.Errorf("%w: gateway %s: %s", streams.ErrBusy, gateway, answer.Error)
	}
	return failed, fmt.Errorf("gateway %s answered a stream %s: %s", gateway, resp.Status, cmp.Or(answer.Error, string(b)))
}
