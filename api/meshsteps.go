package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
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
func (s *Server) stepOwner(r *http.Request, req steps.Request) string {
	id := requestIdentity(r)
	team := req.Team
	if !id.admin {
		if team != "" && team != id.team {
			return "" // refused here, as anywhere
		}
		team = id.team
	}
	step := selection.Step{Type: req.Type, Team: team, Tags: req.Tags, Platform: req.Platform}
	owners := map[string][]targets.Status{}
	var visible []targets.Status
	owner := map[string]string{}
	for _, l := range s.everything() {
		if id.sees(l.st.Meta.Team) && l.conflicts == nil {
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
	var req steps.Request
	if json.Unmarshal(body, &req) != nil || req.Validate() != nil {
		s.submitStep(w, r) // answers what is wrong
		return
	}
	if owner := s.stepOwner(r, req); owner != "" {
		s.forwardTo(w, r, owner, "step "+req.Handle)
		return
	}
	s.submitStep(w, r)
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
		if _, err := s.opts.Steps.Get(caller(r), team, handle); !errors.Is(err, steps.ErrNotFound) {
			next(w, r)
			return
		}
		if owner := s.findStep(r, team, handle); owner != "" {
			s.forwardTo(w, r, owner, "step "+handle)
			return
		}
		next(w, r)
	}
}

// findStep asks every reachable gateway of the mesh, as the caller,
// whether it runs the step; "" when none does.
func (s *Server) findStep(r *http.Request, team, handle string) string {
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
	found := make(chan string, len(gateways))
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
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				found <- g
			}
		})
	}
	wg.Wait()
	close(found)
	return <-found // "" when none
}
