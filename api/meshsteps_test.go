package api

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steps"
)

// runningManager starts a steps manager without targets (its steps
// wait), once it has recovered: what the API's step routes are tested
// against.
func runningManager(t *testing.T) *steps.Manager {
	t.Helper()
	m := steps.New(steps.Options{Registry: noTargets{}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		_, err := m.Get(steps.Caller{Admin: true}, "", "none")
		return err != steps.ErrUnavailable
	}, time.Second, time.Millisecond)
	return m
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
	_, err := stepsB.Get(steps.Caller{Team: "main"}, "", "build-1")
	require.NoError(t, err, "b runs it")
	_, err = stepsA.Get(steps.Caller{Admin: true}, "main", "build-1")
	require.ErrorIs(t, err, steps.ErrNotFound, "a does not")

	rec = stepCall(a, http.MethodGet, "/api/v1/steps/build-1", team, "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var v steps.View
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
	v, err = stepsB.Get(steps.Caller{Team: "main"}, "", "build-1")
	require.NoError(t, err)
	assert.Equal(t, steps.Aborted, v.Phase, "aborted on b")

	// A bad body is answered here, as without a mesh.
	rec = stepCall(a, http.MethodPost, "/api/v1/steps", team, `{"handle": "x"}`)
	assert.Equal(t, http.StatusBadRequest, rec.Code)
}
