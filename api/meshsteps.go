package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Steps in a mesh: a step is submitted where its target is. The gateway
// asked places the step on every target of the mesh the caller sees; when
// the best is another gateway's, the submission goes there, as the
// caller. A step lives on the gateway that runs it: the other gateways
// find it by asking their peers, and forward each call on it there.

// stepOwner is the gateway a new step should be submitted to: the owner
// of the best target of the mesh for it now; when every compatible target
// is at a limit, this gateway if one of its own is compatible (the step
// waits here), else the owner of a compatible one. "" means this gateway.
func (s *Server) stepOwner(r *http.Request, req wire.Request) string {
	id := requestIdentity(r)
	team := req.Team
	if !id.admin {
		if team != "" && team != id.team {
			return "" // refused here, as anywhere
		}
		team = id.team
	}
	step := selection.Step{Type: req.Type, Team: team, Tags: req.Tags, Platform: req.Platform, Privileged: req.Privileged}
	owners := map[string][]targets.Status{}
	var visible []targets.Status
	owner := map[string]string{}
	for _, l := range s.everything() {
		if id.sees(l.st.Meta.Team) && l.conflicts == nil && (req.Type == selection.StepTask || !targets.IsAgent(l.st)) {
			visible = append(visible, l.st)
			owner[l.st.Name] = l.owner
			owners[l.owner] = append(owners[l.owner], l.st)
		}
	}
	opts := selection.Options{Chain: s.opts.Placement.Chain(req.Type, false), Limits: s.opts.Placement.Limits,
		WorkerVersion: s.opts.WorkerVersion}
	d := decide(step, visible, opts)
	me := s.opts.Mesh.Name()
	switch {
	case len(d.order) > 0:
		return cmpOwner(owner[d.order[0]], me)
	case !d.compatible:
		return ""
	case decide(step, owners[me], opts).compatible:
		return ""
	}
	names := make([]string, 0, len(owners))
	for o := range owners {
		names = append(names, o)
	}
	slices.Sort(names)
	for _, o := range names {
		if o != me && decide(step, owners[o], opts).compatible {
			return o
		}
	}
	return ""
}

func cmpOwner(owner, me string) string {
	if owner == me {
		return ""
	}
	return owner
}

// submitAnywhere submits a step here or, in a mesh, on the gateway that
// owns the best target for it.
func (s *Server) submitAnywhere(w http.ResponseWriter, r *http.Request) {
	if _, fromPeer := mesh.Peer(r.Context()); s.opts.Mesh == nil || fromPeer {
		s.submitStep(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, stepBodyLimit))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, badRequest{Error: "body: " + err.Error(), Field: "body"})
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	var req wire.Request
	if json.Unmarshal(body, &req) != nil || req.Validate() != nil {
		s.submitStep(w, r) // answers what is wrong
		return
	}
	owner := s.stepOwner(r, req)
	changed, err := s.elsewhereInputs(r, &req, owner != "")
	if err != nil {
		s.stepError(w, err)
		return
	}
	if changed {
		body, _ = json.Marshal(req)
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	if owner != "" {
		s.forwardTo(w, r, owner, "step "+req.Handle)
		return
	}
	s.submitStep(w, r)
}

// elsewhereInputs turns the inputs of req naming an output of a step
// another gateway runs ({step, output}) into the volume holding it
// ({target, pod, handle}), asking that gateway as the caller; forwarding
// (req goes to another gateway, which knows none of this one's steps),
// also those of this gateway's steps. It says whether it changed any.
func (s *Server) elsewhereInputs(r *http.Request, req *wire.Request, forwarding bool) (bool, error) {
	changed := false
	for i := range req.Inputs {
		from := &req.Inputs[i].From
		if from.Step == "" {
			continue
		}
		field := fmt.Sprintf("inputs[%d].from", i)
		view, err := s.opts.Steps.Get(caller(r), req.Team, from.Step)
		switch {
		case err == nil && !forwarding:
			continue // the steps manager resolves it, as it submits
		case errors.Is(err, wire.ErrNotFound):
			var owner string
			if owner, view = s.findStep(r, req.Team, from.Step); owner == "" {
				return changed, fmt.Errorf("%w: %s: step %q not found", wire.ErrInput, field, from.Step)
			}
		case err != nil:
			return changed, err
		}
		got, err := view.OutputSource(field, from.Output)
		if err != nil {
			return changed, err
		}
		*from, changed = got, true
	}
	return changed, nil
}

// stepLookupTimeout bounds asking the peers for a step.
const stepLookupTimeout = 5 * time.Second

// stepForwardable serves a call on a step this gateway runs with next, and
// forwards a call on a step another gateway of the mesh runs to it.
func (s *Server) stepForwardable(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, fromPeer := mesh.Peer(r.Context()); s.opts.Mesh == nil || fromPeer {
			next(w, r)
			return
		}
		team, handle := r.URL.Query().Get("team"), r.PathValue("handle")
		if _, err := s.opts.Steps.Get(caller(r), team, handle); !errors.Is(err, wire.ErrNotFound) {
			next(w, r)
			return
		}
		k := stepPlaceKey(r, team, handle)
		owner, known := s.stepPlaces.get(k)
		if !known {
			owner, _ = s.findStep(r, team, handle)
		}
		if owner == "" {
			next(w, r)
			return
		}
		s.stepPlaces.put(k, owner)
		sw := &statusWriter{ResponseWriter: w}
		s.forwardTo(sw, r, owner, "step "+handle)
		if sw.code == http.StatusNotFound {
			s.stepPlaces.drop(k) // forgotten there; another gateway may run the handle now
		}
	}
}

// findStep asks every reachable gateway of the mesh, as the caller,
// whether it runs the step; it returns the one that does ("" when none
// does) and the step's view there.
func (s *Server) findStep(r *http.Request, team, handle string) (string, wire.View) {
	ctx, cancel := context.WithTimeout(r.Context(), stepLookupTimeout)
	defer cancel()
	var gateways []string
	for _, rt := range s.opts.Mesh.Remotes() {
		if rt.Reachable && !slices.Contains(gateways, rt.Owner) {
			gateways = append(gateways, rt.Owner)
		}
	}
	who := callerHeader(r)
	q := url.Values{}
	if team != "" {
		q.Set("team", team)
	}
	type found struct {
		owner string
		view  wire.View
	}
	answers := make(chan found, len(gateways))
	var wg sync.WaitGroup
	for _, g := range gateways {
		wg.Go(func() {
			u := url.URL{Scheme: "http", Host: g, Path: "/api/v1/steps/" + handle, RawQuery: q.Encode()}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				return
			}
			req.Header.Set(CallerHeader, who)
			resp, err := s.opts.Mesh.Client().Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var view wire.View
			if resp.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&view) == nil {
				answers <- found{g, view}
			}
		})
	}
	wg.Wait()
	close(answers)
	f := <-answers // zero when none
	return f.owner, f.view
}

// stepPlaces remembers which gateway runs a step this one does not, so
// the calls on it after the first go straight there. An entry goes when
// that gateway answers 404 (it forgot the step; the handle is free
// again); the map is emptied when it reaches maxStepPlaces.
type stepPlaces struct {
	mu     sync.Mutex
	owners map[string]string
}

const maxStepPlaces = 10000

// stepPlaceKey keys a step by who asks for it: the same handle is another
// step in another team.
func stepPlaceKey(r *http.Request, team, handle string) string {
	id := requestIdentity(r)
	if !id.admin || team == "" {
		team = id.team
	}
	return team + "/" + handle
}

func (p *stepPlaces) get(k string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	owner, ok := p.owners[k]
	return owner, ok
}

func (p *stepPlaces) put(k, owner string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.owners == nil || len(p.owners) >= maxStepPlaces {
		p.owners = map[string]string{}
	}
	p.owners[k] = owner
}

func (p *stepPlaces) drop(k string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.owners, k)
}

// statusWriter notes the status an answer is written with.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
