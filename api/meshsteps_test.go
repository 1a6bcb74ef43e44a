package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/steps/stepstest"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// runningManager starts a steps manager without targets (its steps
// wait), once it has recovered: what the API's step routes are tested
// against.
func runningManager(t *testing.T) *steps.Manager {
	t.Helper()
	return stepstest.Start(t, steps.Options{Registry: noTargets{}}).Manager
}

// A step whose best target is another gateway's is submitted there, as
// the caller; every later call on it, asked of any gateway, goes there.
func TestStepsGoWhereTheirTargetIs(t *testing.T) {
	stepsA, stepsB := runningManager(t), runningManager(t)
	meshA := &fakeMesh{name: "a", remotes: announcedBy("b", true, fleetB...), members: map[string]http.Handler{}}
	meshB := &fakeMesh{name: "b", remotes: announcedBy("a", true, fleet[:2]...), members: map[string]http.Handler{}}
	b := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB, Steps: stepsB, Tokens: tokens, Mesh: meshB}).Handler()
	a := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Steps: stepsA, Tokens: tokens, Mesh: meshA}).Handler()
	meshA.members["b"], meshB.members["a"] = b, a
	const team = "main-token-0123456789"

	// The main team's own target, b-main, wins over the global one here.
	rec := stepCall(a, http.MethodPost, "/api/v1/steps", team, stepBody)
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	_, err := stepsB.Get(streams.Caller{Team: "main"}, "", "build-1")
	require.NoError(t, err, "b runs it")
	_, err = stepsA.Get(streams.Caller{Admin: true}, "main", "build-1")
	require.ErrorIs(t, err, wire.ErrNotFound, "a does not")

	rec = stepCall(a, http.MethodGet, "/api/v1/steps/build-1", team, "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var v wire.View
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v))
	assert.Equal(t, "build-1", v.Handle)

	// Submitted again through a: the same step, not a second one.
	rec = stepCall(a, http.MethodPost, "/api/v1/steps", team, stepBody)
	assert.Equal(t, http.StatusOK, rec.Code, rec.Body.String())

	// A handle no gateway runs, or another team's: 404, as anywhere.
	rec = stepCall(a, http.MethodGet, "/api/v1/steps/nope", team, "")
	assert.Equal(t, http.StatusNotFound, rec.Code)
	require.Equal(t, http.StatusAccepted, stepCall(b, http.MethodPost, "/api/v1/steps", "admin-token-0123456789",
		`{"handle": "ops-1", "type": "task", "image": "i", "run": {"path": "p"}}`).Code)
	rec = stepCall(a, http.MethodGet, "/api/v1/steps/ops-1", team, "")
	assert.Equal(t, http.StatusNotFound, rec.Code, "a team token never finds an admin's step")

	rec = stepCall(a, http.MethodDelete, "/api/v1/steps/build-1", team, "")
	assert.Contains(t, []int{http.StatusOK, http.StatusAccepted}, rec.Code, rec.Body.String())
	v, err = stepsB.Get(streams.Caller{Team: "main"}, "", "build-1")
	require.NoError(t, err)
	assert.Equal(t, wire.Aborted, v.Phase, "aborted on b")

	// A bad body is answered here, as without a mesh.
	rec = stepCall(a, http.MethodPost, "/api/v1/steps", team, `{"handle": "x"}`)
	assert.Equal(t, http.StatusBadRequest, rec.Code)
}

// A step's output another gateway holds is found there, as the caller: an
// input naming it is checked against the step as that gateway sees it.
func TestStepInputsFromAnotherGateway(t *testing.T) {
	stepsA, stepsB := runningManager(t), runningManager(t)
	meshA := &fakeMesh{name: "a", remotes: announcedBy("b", true, fleetB...), members: map[string]http.Handler{}}
	meshB := &fakeMesh{name: "b", remotes: announcedBy("a", true, fleet[:2]...), members: map[string]http.Handler{}}
	withOther := append(slices.Clone(tokens), Token{Name: "other-ci", Token: "other-token-0123456789", Team: "other"})
	b := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB, Steps: stepsB, Tokens: withOther, Mesh: meshB}).Handler()
	a := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Steps: stepsA, Tokens: withOther, Mesh: meshA}).Handler()
	meshA.members["b"], meshB.members["a"] = b, a
	const team, other = "main-token-0123456789", "other-token-0123456789"
	require.Equal(t, http.StatusAccepted, stepCall(b, http.MethodPost, "/api/v1/steps", team, stepBody).Code)

	// gpu-1 waits on a, whose stalled main-gpu is the only target it fits.
	require.Equal(t, http.StatusAccepted, stepCall(a, http.MethodPost, "/api/v1/steps", team,
		`{"handle": "gpu-1", "type": "task", "image": "i", "run": {"path": "p"}, "tags": ["gpu"]}`).Code)
	_, err := stepsA.Get(streams.Caller{Team: "main"}, "", "gpu-1")
	require.NoError(t, err)

	for _, tt := range []struct{ token, tags, from, want string }{
		// A step that stays on a, its input a step b runs: a asks b.
		{team, `["gpu"]`, `{"step": "build-1", "output": "out"}`, `step \"build-1\" is pending, not succeeded`},
		{team, `["gpu"]`, `{"step": "nowhere", "output": "out"}`, `step \"nowhere\" not found`},
		// A step that goes to b, its input a's step: a resolves it first.
		{team, `[]`, `{"step": "gpu-1", "output": "out"}`, `step \"gpu-1\" is pending, not succeeded`},
		// Another team's step is not found, wherever it is.
		{other, `[]`, `{"step": "build-1", "output": "out"}`, `step \"build-1\" not found`},
	} {
		rec := stepCall(a, http.MethodPost, "/api/v1/steps", tt.token, `{"handle": "use-1", "type": "task", "image": "i",
			"run": {"path": "p"}, "tags": `+tt.tags+`, "inputs": [{"name": "in", "from": `+tt.from+`}]}`)
		assert.Equal(t, http.StatusUnprocessableEntity, rec.Code, rec.Body.String())
		assert.Contains(t, rec.Body.String(), tt.want)
	}
}

// A gateway remembers where another runs a step, and asks again once that
// gateway has forgotten it: the handle may be another gateway's step now.
func TestStepsElsewhereAreRemembered(t *testing.T) {
	stepsB, stepsC := runningManager(t), runningManager(t)
	meshA := &fakeMesh{name: "a", members: map[string]http.Handler{},
		remotes: append(announcedBy("b", true, fleetB[0]), announcedBy("c", true, fleetB[1])...)}
	b := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB[:1], Steps: stepsB, Tokens: tokens,
		Mesh: &fakeMesh{name: "b"}}).Handler()
	c := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB[1:], Steps: stepsC, Tokens: tokens,
		Mesh: &fakeMesh{name: "c"}}).Handler()
	a := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Steps: runningManager(t), Tokens: tokens, Mesh: meshA}).Handler()
	var asked struct {
		sync.Mutex
		b, c    int
		bForgot bool
	}
	meshA.members["b"] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Lock()
		asked.b++
		forgot := asked.bForgot
		asked.Unlock()
		if forgot {
			http.Error(w, `{"error": "step not found"}`, http.StatusNotFound)
			return
		}
		b.ServeHTTP(w, r)
	})
	meshA.members["c"] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Lock()
		asked.c++
		asked.Unlock()
		c.ServeHTTP(w, r)
	})
	count := func() (int, int) {
		asked.Lock()
		defer asked.Unlock()
		return asked.b, asked.c
	}
	const team = "main-token-0123456789"
	require.Equal(t, http.StatusAccepted, stepCall(b, http.MethodPost, "/api/v1/steps", team, stepBody).Code)

	require.Equal(t, http.StatusOK, stepCall(a, http.MethodGet, "/api/v1/steps/build-1", team, "").Code)
	gotB, gotC := count()
	assert.Equal(t, [2]int{2, 1}, [2]int{gotB, gotC}, "the first call asks b and c, then goes to b")
	require.Equal(t, http.StatusOK, stepCall(a, http.MethodGet, "/api/v1/steps/build-1", team, "").Code)
	gotB, gotC = count()
	assert.Equal(t, [2]int{3, 1}, [2]int{gotB, gotC}, "the next goes straight to b")

	// b forgets it; c runs a step of that handle now.
	asked.Lock()
	asked.bForgot = true
	asked.Unlock()
	_, _, err := stepsC.Submit(streams.Caller{Team: "main"}, wire.Request{Handle: "build-1", Type: "task", Image: "i", Run: wire.Run{Path: "p"}})
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, stepCall(a, http.MethodGet, "/api/v1/steps/build-1", team, "").Code, "b's answer")
	rec := stepCall(a, http.MethodGet, "/api/v1/steps/build-1", team, "")
	assert.Equal(t, http.StatusOK, rec.Code, "found on c: %s", rec.Body.String())
	_, gotC2 := count()
	assert.Equal(t, gotC+2, gotC2, "asked c again, then went there")
}
