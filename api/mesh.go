package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/targets"
)

// Mesh is what the API uses of the mesh: the targets other gateways own,
// and the client that carries calls to them.
type Mesh interface {
	Name() string
	Remotes() []mesh.Remote
	Client() *http.Client
	// BulkClient carries volume streams' bytes.
	BulkClient() *http.Client
	Metrics() *mesh.Metrics
	// Forget drops a target whose owner the mesh has lost: a pruned
	// stalled worker (mesh.Mesh.Forget).
	Forget(owner, target string) error
}

// CallerHeader carries, on a call forwarded over the mesh, who made it:
// the forwarding gateway authenticated the caller, and the owner checks
// the caller's team as if called directly. It is believed only on a
// request that came over the mesh (from a peer with a certificate of the
// mesh CA); on the API's own listener it is ignored. Tokens never cross
// the mesh.
const CallerHeader = "Jetway-Mesh-Caller"

type meshCaller struct {
	Name  string `json:"name"`
	Team  string `json:"team,omitempty"`
	Admin bool   `json:"admin,omitempty"`
}

// meshIdentity is the identity a peer asserts for the caller of a call it
// forwards.
func meshIdentity(r *http.Request) (identity, bool) {
	var c meshCaller
	if err := json.Unmarshal([]byte(r.Header.Get(CallerHeader)), &c); err != nil || c.Name == "" || c.Admin == (c.Team != "") {
		return identity{}, false
	}
	return identity{name: c.Name, admin: c.Admin, team: c.Team}, true
}

// listed is one entry of the mesh-wide target list.
type listed struct {
	st        targets.Status
	owner     string   // the gateway that owns it; "" without a mesh
	conflicts []string // owners that announce the same name for another cluster or namespace
}

// everything lists this gateway's targets and, with a mesh, every other
// gateway's. Two gateways holding the same kubeconfig (replicas sharing a
// Secret) own one target, listed once (this gateway's first); the same
// name for another cluster or namespace is a conflict: both are listed,
// each naming the owners that disagree.
func (s *Server) everything() []listed {
	var out []listed
	me := ""
	if s.opts.Mesh != nil {
		me = s.opts.Mesh.Name()
	}
	for _, st := range s.opts.Targets.Snapshot() {
		out = append(out, listed{st: st, owner: me})
	}
	if s.opts.Mesh == nil {
		return out
	}
	for _, r := range s.opts.Mesh.Remotes() {
		st := r.Target.Status()
		if !slices.ContainsFunc(out, func(l listed) bool { return l.st.Name == st.Name && sameCluster(l.st, st) }) {
			out = append(out, listed{st: st, owner: r.Owner})
		}
	}
	for i := range out {
		for _, o := range out {
			if o.st.Name == out[i].st.Name && !sameCluster(o.st, out[i].st) {
				out[i].conflicts = append(out[i].conflicts, o.owner)
			}
		}
		if out[i].conflicts != nil {
			out[i].conflicts = append(out[i].conflicts, out[i].owner)
			slices.Sort(out[i].conflicts)
		}
	}
	slices.SortStableFunc(out, func(a, b listed) int {
		switch {
		case a.st.Name < b.st.Name:
			return -1
		case a.st.Name > b.st.Name:
			return 1
		}
		return 0
	})
	return out
}

func sameCluster(a, b targets.Status) bool {
	return a.Server == b.Server && a.Meta.Namespace == b.Meta.Namespace
}

// remote finds the target name among those other gateways own, when this
// gateway has none of that name and the caller may see it.
func (s *Server) remote(r *http.Request, name string) (mesh.Remote, error) {
	return findRemote(s.opts.Targets, s.opts.Mesh, requestIdentity(r), name)
}

// findRemote finds the target name among those other gateways of m own,
// when reg has none of that name and id may see it.
func findRemote(reg Targets, m Mesh, id identity, name string) (mesh.Remote, error) {
	if m == nil {
		return mesh.Remote{}, targets.ErrNotFound
	}
	if _, err := reg.Find(name); err == nil {
		return mesh.Remote{}, targets.ErrNotFound
	}
	var found []mesh.Remote
	for _, rt := range m.Remotes() {
		if rt.Target.Name == name && id.sees(rt.Target.Team) &&
			!slices.ContainsFunc(found, func(f mesh.Remote) bool { return sameCluster(f.Target.Status(), rt.Target.Status()) }) {
			found = append(found, rt)
		}
	}
	switch len(found) {
	case 0:
		return mesh.Remote{}, targets.ErrNotFound
	case 1:
		return found[0], nil
	}
	owners := make([]string, len(found))
	for i, f := range found {
		owners[i] = f.Owner
	}
	return mesh.Remote{}, fmt.Errorf("%w: gateways %v announce worker %s for different clusters; fix their kubeconfigs",
		errAmbiguous, owners, name)
}

var errAmbiguous = errors.New("ambiguous worker")

// forwardable serves a call on a target this gateway owns with next, and
// forwards a call on a target another gateway owns to that gateway. A
// call that came over the mesh is never forwarded again.
func (s *Server) forwardable(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, fromPeer := mesh.Peer(r.Context()); fromPeer {
			next(w, r)
			return
		}
		rt, err := s.remote(r, r.PathValue("name"))
		switch {
		case errors.Is(err, targets.ErrNotFound):
			next(w, r)
		case err != nil:
			writeJSON(w, http.StatusConflict, errorBody{Error: err.Error()})
		default:
			s.forward(w, r, rt)
		}
	}
}

// pruneLost prunes a worker of another mesh member that this gateway
// cannot reach, which no one else could prune: its owner (a gateway, an
// agent) is lost. As Concourse, a worker still listed running is refused;
// any other is forgotten here, and by the gateways this one announced it
// to at its next announcement. A worker another gateway relays, having
// lost its owner, is pruned there. Every other prune goes to next.
func (s *Server) pruneLost(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		rt, err := s.remote(r, name)
		if err != nil || rt.Reachable {
			next(w, r)
			return
		}
		if !requestIdentity(r).owns(rt.Target.Team) {
			writeJSON(w, http.StatusForbidden, errorBody{Error: "this token may not act on worker " + name})
			return
		}
		if rt.Target.State == string(targets.StateRunning) {
			writeError(w, targets.ErrRunning)
			return
		}
		err = s.opts.Mesh.Forget(rt.Owner, name)
		var announced *mesh.AnnouncedError
		_, fromPeer := mesh.Peer(r.Context())
		switch {
		case errors.As(err, &announced) && !fromPeer:
			s.forwardTo(w, r, announced.Via, "worker "+name)
		case errors.As(err, &announced):
			writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: unreachableOwner(rt)})
		case errors.Is(err, mesh.ErrNotLearned): // forgotten meanwhile
			writeError(w, targets.ErrNotFound)
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
		default:
			s.opts.Logger.Info("worker action", "target", name, "path", r.URL.Path, "by", requestIdentity(r).name,
				"owner", rt.Owner, "scope", lifecycle.PrunedFromMesh)
			w.Header().Set(PruneScopeHeader, lifecycle.PrunedFromMesh)
			w.WriteHeader(http.StatusOK)
		}
	}
}

// forward carries the call to the target's owner, as the caller, and
// relays its answer. An owner the mesh cannot reach answers 503 at once,
// naming it.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, rt mesh.Remote) {
	metrics := s.opts.Mesh.Metrics()
	if !rt.Reachable {
		metrics.Forwarded("unreachable")
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: unreachableOwner(rt)})
		return
	}
	s.forwardTo(w, r, rt.Owner, "worker "+rt.Target.Name)
}

// forwardTo carries the call to gateway owner, as the caller, and relays
// its answer; what names the thing the call is about, for errors.
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, owner, what string) {
	metrics := s.opts.Mesh.Metrics()
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+owner+r.URL.RequestURI(), r.Body)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
		return
	}
	out.ContentLength = r.ContentLength
	for _, h := range []string{"Content-Type", "Content-Encoding", "Accept", "Accept-Encoding"} {
		if v := r.Header.Values(h); v != nil {
			out.Header[h] = v
		}
	}
	out.Header.Set(CallerHeader, callerHeader(r))
	resp, err := s.opts.Mesh.Client().Do(out)
	if err != nil {
		code := http.StatusBadGateway
		if errors.Is(err, mesh.ErrUnreachable) {
			code = http.StatusServiceUnavailable
		}
		metrics.Forwarded("unreachable")
		writeJSON(w, code, errorBody{Error: fmt.Sprintf("%s: its owner, gateway %s: %v", what, owner, err)})
		return
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		metrics.Forwarded("server-error")
	case resp.StatusCode >= 400:
		metrics.Forwarded("client-error")
	default:
		metrics.Forwarded("ok")
	}
	for k, v := range resp.Header {
		if k != "Connection" && k != "Keep-Alive" && k != "Transfer-Encoding" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(flushing{w}, resp.Body)
}

// unreachableOwner says that rt's owner cannot be reached.
func unreachableOwner(rt mesh.Remote) string {
	return fmt.Sprintf("worker %s is owned by %s %s, which this gateway cannot reach over the mesh", rt.Target.Name, ownerKind(rt), rt.Owner)
}

// ownerKind names what owns rt: an agent (its target is itself) or a
// gateway.
func ownerKind(rt mesh.Remote) string {
	if targets.IsAgent(rt.Target.Status()) {
		return "agent"
	}
	return "gateway"
}

// callerHeader is the CallerHeader of a call made for r's caller.
func callerHeader(r *http.Request) string { return callerHeaderOf(requestIdentity(r)) }

// callerHeaderOf is the CallerHeader of a call made for id.
func callerHeaderOf(id identity) string {
	who, _ := json.Marshal(meshCaller{Name: id.name, Team: id.team, Admin: id.admin})
	return string(who)
}

// flushing flushes each write, for answers that stream.
type flushing struct{ w http.ResponseWriter }

func (f flushing) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// concourseCaller is who a gateway names when it acts for the Concourse
// web node on an agent: the web node landed the agent's worker.
var concourseCaller = identity{name: "concourse-web-node", admin: true}

// MeshAgents lists the targets of the agents joined to m itself: the
// routes learned from the agent, over a live session. A Concourse
// registrar registers them (concourse.Options.Agents).
func MeshAgents(m Mesh) func() []targets.Status {
	return func() []targets.Status {
		var out []targets.Status
		for _, r := range m.Remotes() {
			st := r.Target.Status()
			if r.Reachable && r.Via == r.Owner && targets.IsAgent(st) {
				out = append(out, st)
			}
		}
		return out
	}
}

// LandAgent lands an agent's target by asking the agent over m, for the
// Concourse web node (concourse.Options.LandAgent).
func LandAgent(m Mesh) func(ctx context.Context, name string) error {
	return func(ctx context.Context, name string) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+name+"/api/v1/workers/"+url.PathEscape(name)+"/land", nil)
		if err != nil {
			return err
		}
		req.Header.Set(CallerHeader, callerHeaderOf(concourseCaller))
		resp, err := m.Client().Do(req)
		if err != nil {
			return fmt.Errorf("land agent %s: %w", name, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			return fmt.Errorf("land agent %s: it answered %s: %s", name, resp.Status, strings.TrimSpace(string(body)))
		}
		return nil
	}
}
