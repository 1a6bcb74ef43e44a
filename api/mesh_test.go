package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// fakeMesh carries calls in-process to the API of the member they are
// for, as the mesh's HTTP server would serve them.
type fakeMesh struct {
	name    string
	kind    string // mesh.KindAgent: its calls arrive as an agent's
	remotes []mesh.Remote
	members map[string]http.Handler
	// relays names, by target, the live peer that relays a target its
	// owner lost: Forget refuses it, as the mesh does.
	relays map[string]string
}

func (f *fakeMesh) Forget(owner, target string) error {
	if via, ok := f.relays[target]; ok {
		return &mesh.AnnouncedError{Owner: owner, Target: target, Via: via}
	}
	for i, r := range f.remotes {
		if r.Owner == owner && r.Target.Name == target {
			f.remotes = slices.Delete(f.remotes, i, i+1)
			return nil
		}
	}
	return mesh.ErrNotLearned
}

func (f *fakeMesh) Name() string           { return f.name }
func (f *fakeMesh) Remotes() []mesh.Remote { return f.remotes }
func (f *fakeMesh) Metrics() *mesh.Metrics { return nil }
func (f *fakeMesh) Client() *http.Client {
	return &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		h := f.members[r.URL.Host]
		if h == nil {
			return nil, &mesh.UnreachableError{Member: r.URL.Host}
		}
		rec := httptest.NewRecorder()
		ctx := mesh.WithPeer(r.Context(), f.name)
		if f.kind != "" {
			ctx = mesh.WithPeerKind(r.Context(), f.name, f.kind)
		}
		h.ServeHTTP(rec, r.WithContext(ctx))
		return rec.Result(), nil
	})}
}

func (f *fakeMesh) BulkClient() *http.Client { return f.Client() }

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func announcedBy(owner string, reachable bool, sts ...targets.Status) []mesh.Remote {
	var out []mesh.Remote
	for _, st := range sts {
		out = append(out, mesh.Remote{Owner: owner, Via: owner, Reachable: reachable, Target: announcedTarget(st)})
	}
	return out
}

func announcedTarget(st targets.Status) mesh.Target {
	return mesh.Target{Name: st.Name, Server: st.Server, Namespace: st.Meta.Namespace, Team: st.Meta.Team,
		Platform: st.Meta.Platform, State: string(st.State)}
}

// twoGateways is gateway a, owning "global" and "main-gpu", and gateway b,
// owning its own fleet, joined by a fake mesh.
func twoGateways(t *testing.T, fleetB fakeTargets) (a http.Handler, lifeB *fakeLifecycle) {
	t.Helper()
	lifeB = &fakeLifecycle{}
	meshA := &fakeMesh{name: "a", remotes: announcedBy("b", true, fleetB...), members: map[string]http.Handler{}}
	meshB := &fakeMesh{name: "b"}
	b := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB, Lifecycle: lifeB, Tokens: tokens, Mesh: meshB}).Handler()
	meshA.members["b"] = b
	a = New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Lifecycle: &fakeLifecycle{}, Tokens: tokens,
		Mesh: meshA}).Handler()
	return a, lifeB
}

var fleetB = fakeTargets{
	{Name: "b-main", Server: "https://b:6443", State: targets.StateRunning, Meta: targets.Metadata{Team: "main", Platform: "linux", Namespace: "ci"}},
	{Name: "b-other", Server: "https://b:6443", State: targets.StateRunning, Meta: targets.Metadata{Team: "other", Platform: "linux", Namespace: "o"}},
}

func TestAnyGatewayListsTheWholeMesh(t *testing.T) {
	a, _ := twoGateways(t, fleetB)
	var workers []wire.Worker
	rec := request(t, a, "/api/v1/workers", "main-token-0123456789")
	require.Equal(t, http.StatusOK, rec.Code)
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &workers))
	var names []string
	for _, w := range workers {
		names = append(names, w.Name)
	}
	assert.Equal(t, []string{"b-main", "global", "main-gpu"}, names, "a team token sees no other team's target, wherever it is")

	var ts []Target
	rec = request(t, a, "/api/v1/targets", "admin-token-0123456789")
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ts))
	owners := map[string]string{}
	for _, tg := range ts {
		owners[tg.Name] = tg.Owner
	}
	assert.Equal(t, map[string]string{"b-main": "b", "b-other": "b", "global": "a", "main-gpu": "a"}, owners)
}

func TestSameNameDifferentClusterIsAConflict(t *testing.T) {
	replica := fleet[0] // the same kubeconfig: one target, no conflict
	clash := fleet[1]   // the same name for another cluster
	clash.Server = "https://elsewhere:6443"
	a, _ := twoGateways(t, fakeTargets{replica, clash})
	var ts []Target
	rec := request(t, a, "/api/v1/targets", "admin-token-0123456789")
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ts))
	var got []string
	for _, tg := range ts {
		got = append(got, fmt.Sprintf("%s@%s %v", tg.Name, tg.Owner, tg.ConflictingOwners))
	}
	assert.Equal(t, []string{"global@a []", "main-gpu@a [a b]", "main-gpu@b [a b]"}, got)

	// A call on the conflicting name stays here, where it is owned.
	rec = put(a, "/api/v1/workers/main-gpu/land", "admin-token-0123456789", "")
	assert.Equal(t, http.StatusOK, rec.Code)
}

func TestCallsOnAnotherGatewaysTargetGoToItAsTheCaller(t *testing.T) {
	a, lifeB := twoGateways(t, fleetB)
	rec := put(a, "/api/v1/workers/b-main/land", "main-token-0123456789", "")
	assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	rec = put(a, "/api/v1/workers/b-main/prune", "main-token-0123456789", "")
	assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, "installation", rec.Header().Get(PruneScopeHeader), "the owner's answer, headers too")
	rec = serve(a, http.MethodPut, "/api/v1/targets/b-main/sync", "main-token-0123456789", `{"handles":["x"]}`)
	assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.JSONEq(t, `{"deleted":["old"]}`, rec.Body.String())

	// Another team's target: as unknown as anywhere, and never forwarded.
	rec = put(a, "/api/v1/workers/b-other/retire", "main-token-0123456789", "")
	assert.Equal(t, http.StatusNotFound, rec.Code)
	assert.NotContains(t, rec.Body.String(), "b-other")

	// The admin may.
	rec = put(a, "/api/v1/workers/b-other/retire", "admin-token-0123456789", "")
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, []string{"land b-main", "prune b-main", "sync b-main [x]", "retire b-other"}, lifeB.calls)
}

func TestAnUnreachableOwnerAnswersAtOnceNamingIt(t *testing.T) {
	m := &fakeMesh{name: "a", remotes: announcedBy("b", false, fleetB...)}
	a := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Lifecycle: &fakeLifecycle{}, Tokens: tokens, Mesh: m}).Handler()
	rec := put(a, "/api/v1/workers/b-main/land", "main-token-0123456789", "")
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Contains(t, rec.Body.String(), "owned by gateway b, which this gateway cannot reach")

	// Reachable as far as the routes say, but the session is gone.
	m.remotes = announcedBy("b", true, fleetB...)
	rec = put(a, "/api/v1/workers/b-main/land", "main-token-0123456789", "")
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Contains(t, rec.Body.String(), `its owner, gateway b: `)
}

// A worker whose owner the mesh lost (an agent, a gateway) can be pruned
// only here: unless it is still listed running, the mesh forgets it. A
// worker a live gateway relays is pruned there, which lost its owner.
func TestPruningAWorkerWhoseOwnerIsLost(t *testing.T) {
	mac := targets.Status{Name: "mac", Server: targets.AgentServer("mac"), State: targets.StateStalled,
		Meta: targets.Metadata{Team: "main", Platform: "darwin"}}
	ghost := mac
	ghost.Name, ghost.Server = "ghost", targets.AgentServer("ghost")
	remotes := append(announcedBy("mac", false, mac), announcedBy("b", false, fleetB...)...)
	remotes = append(remotes, mesh.Remote{Owner: "ghost", Via: "c", Target: announcedTarget(ghost)})
	meshC := &fakeMesh{name: "c", remotes: announcedBy("ghost", false, ghost)}
	c := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fakeTargets{}, Lifecycle: &fakeLifecycle{}, Tokens: tokens, Mesh: meshC}).Handler()
	m := &fakeMesh{name: "a", remotes: remotes, relays: map[string]string{"ghost": "c"}, members: map[string]http.Handler{"c": c}}
	life := &fakeLifecycle{}
	a := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Lifecycle: life, Tokens: tokens, Mesh: m}).Handler()

	rec := put(a, "/api/v1/workers/b-main/prune", "main-token-0123456789", "")
	assert.Equal(t, http.StatusBadRequest, rec.Code, "listed running: refused as Concourse does")
	assert.JSONEq(t, `{"stderr":"cannot prune running worker"}`, rec.Body.String())
	rec = put(a, "/api/v1/workers/b-other/prune", "main-token-0123456789", "")
	assert.Equal(t, http.StatusNotFound, rec.Code, "another team's worker is unknown")

	rec = put(a, "/api/v1/workers/mac/prune", "main-token-0123456789", "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, "mesh", rec.Header().Get(PruneScopeHeader))
	assert.Empty(t, rec.Body.String())
	assert.NotContains(t, request(t, a, "/api/v1/workers", "main-token-0123456789").Body.String(), `"mac"`)
	rec = put(a, "/api/v1/workers/mac/prune", "main-token-0123456789", "")
	assert.Equal(t, http.StatusNotFound, rec.Code)

	// Relayed by c, which lost it: pruned at c.
	rec = put(a, "/api/v1/workers/ghost/prune", "main-token-0123456789", "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, "mesh", rec.Header().Get(PruneScopeHeader))
	assert.Empty(t, meshC.remotes, "c forgot it")
	assert.Empty(t, life.calls, "no local target was touched")
}

func TestTheCallerHeaderIsBelievedOnlyFromThePeers(t *testing.T) {
	life := &fakeLifecycle{}
	h := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet, Lifecycle: life, Tokens: tokens,
		Mesh: &fakeMesh{name: "b"}}).Handler()
	req := httptest.NewRequest(http.MethodPut, "/api/v1/workers/main-gpu/land", nil)
	req.Header.Set(CallerHeader, `{"name":"mallory","admin":true}`)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusUnauthorized, rec.Code, "off the mesh, the header is no credential")

	// Over the mesh, without a caller: refused too.
	req = httptest.NewRequest(http.MethodPut, "/api/v1/workers/main-gpu/land", nil)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(mesh.WithPeer(req.Context(), "a")))
	assert.Equal(t, http.StatusUnauthorized, rec.Code)

	// The owner checks the caller's team as if called directly.
	req = httptest.NewRequest(http.MethodPut, "/api/v1/workers/global/land", nil)
	req.Header.Set(CallerHeader, `{"name":"main-ci","team":"main"}`)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(mesh.WithPeer(req.Context(), "a")))
	assert.Equal(t, http.StatusForbidden, rec.Code)
	assert.Empty(t, life.calls)
}

// Placement weighs every target of the mesh the caller sees, and names
// the chosen one's owner; a name two gateways announce for different
// clusters is rejected, saying who disagrees.
func TestPlacementWeighsTheWholeMesh(t *testing.T) {
	clash := fleetB[0]
	clash.Name = "global" // as a's, but another cluster
	a, _ := twoGateways(t, fakeTargets{fleetB[0], fleetB[1], clash})
	rec := postPlacement(t, a, "main-token-0123456789", `{"type": "task", "team": "main"}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var p Placement
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	assert.Equal(t, []string{"b-main"}, p.Order)
	assert.Equal(t, "b", p.Owner)
	assert.Equal(t, "gateways a, b announce it for different clusters", p.Rejected["global"])
	assert.NotContains(t, rec.Body.String(), "b-other", "another team's target, wherever it is, is not mentioned")
}
