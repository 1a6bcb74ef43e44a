package api

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// noTargets is a registry without targets: every step waits.
type noTargets struct{}

func (noTargets) Loaded() bool                           { return true }
func (noTargets) Snapshot() []targets.Status             { return nil }
func (noTargets) Target(string) (*targets.Target, error) { return nil, targets.ErrNotFound }
func (noTargets) Changed() <-chan struct{}               { return nil }

// stepServer serves the step API over a running steps.Manager.
func stepServer(t *testing.T) http.Handler {
	t.Helper()
	return New(Options{Gatherer: prometheus.NewRegistry(), Steps: runningManager(t), Tokens: tokens}).Handler()
}

func stepCall(h http.Handler, method, path, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const stepBody = `{"handle": "build-1", "type": "task", "image": "busybox", "run": {"path": "true"}}`

func TestStepRequestsNameTheBadField(t *testing.T) {
	h := stepServer(t)
	for _, tt := range []struct{ body, field string }{
		{`{"handle": "x", "type": "task", "image": "i", "run": {"path": "p"}, "colour": "red"}`, "colour"},
		{`{"handle": "x", "type": 7}`, "type"},
		{`{"handle": "x", "type": "task", "image": "i", "run": {"path": "p"}, "timeout": "soon"}`, "timeout"},
		{`{"handle": "x", "type": "task", "image": "i", "run": {"path": "p"}, "inputs": [{"name": "a", "from": {}}]}`, "inputs[0].from"},
		{`{"handle": "x"} {"handle": "y"}`, "body"},
	} {
		rec := stepCall(h, http.MethodPost, "/api/v1/steps", adminToken, tt.body)
		assert.Equal(t, http.StatusBadRequest, rec.Code, tt.body)
		var got badRequest
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
		assert.Equal(t, tt.field, got.Field, "%s: %s", tt.body, got.Error)
	}
	rec := stepCall(h, http.MethodGet, "/api/v1/steps/x/events?since=-1", adminToken, "")
	assert.Equal(t, http.StatusBadRequest, rec.Code)
}

func TestStepAPIKeepsTeamsApart(t *testing.T) {
	h := stepServer(t)
	rec := stepCall(h, http.MethodPost, "/api/v1/steps", mainToken, stepBody)
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	assert.Equal(t, "/api/v1/steps/build-1", rec.Header().Get("Location"))
	rec = stepCall(h, http.MethodPost, "/api/v1/steps", mainToken, stepBody)
	assert.Equal(t, http.StatusOK, rec.Code, "the same handle again: the existing step")

	rec = stepCall(h, http.MethodPost, "/api/v1/steps", mainToken, strings.Replace(stepBody, `"type"`, `"team": "other", "type"`, 1))
	assert.Equal(t, http.StatusForbidden, rec.Code)

	missing := stepCall(h, http.MethodGet, "/api/v1/steps/nope", adminToken, "").Body.String()
	for _, path := range []string{"/api/v1/steps/build-1", "/api/v1/steps/build-1?team=main"} {
		rec = stepCall(h, http.MethodGet, path, adminToken, "")
		if strings.Contains(path, "team") {
			assert.Equal(t, http.StatusOK, rec.Code, "an admin names the team")
			continue
		}
		assert.Equal(t, http.StatusNotFound, rec.Code)
		assert.Equal(t, missing, rec.Body.String())
	}
	rec = stepCall(h, http.MethodPost, "/api/v1/steps", adminToken,
		`{"handle": "next", "type": "task", "team": "main", "image": "i", "run": {"path": "p"}, "inputs": [{"name": "a", "from": {"step": "build-1", "output": "o"}}]}`)
	assert.Equal(t, http.StatusUnprocessableEntity, rec.Code, rec.Body.String())
	assert.Contains(t, rec.Body.String(), `step \"build-1\" is pending`)

	// Events follow until the step ends: DELETE ends it.
	require.Eventually(t, func() bool {
		return strings.Contains(stepCall(h, http.MethodGet, "/api/v1/steps/build-1", mainToken, "").Body.String(), `"waiting":"no target satisfies`)
	}, 5*time.Second, time.Millisecond)
	evs := make(chan []wire.Event)
	go func() {
		rec := stepCall(h, http.MethodGet, "/api/v1/steps/build-1/events", mainToken, "")
		var out []wire.Event
		sc := bufio.NewScanner(rec.Body)
		for sc.Scan() {
			var e wire.Event
			_ = json.Unmarshal(sc.Bytes(), &e)
			out = append(out, e)
		}
		evs <- out
	}()
	rec = stepCall(h, http.MethodDelete, "/api/v1/steps/build-1", mainToken, "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var v wire.View
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v))
	assert.Equal(t, wire.Aborted, v.Phase)
	got := <-evs
	require.NotEmpty(t, got)
	assert.Equal(t, wire.EventWaiting, got[0].Type)
	assert.Equal(t, wire.EventFailed, got[len(got)-1].Type)
	assert.Equal(t, wire.Aborted, got[len(got)-1].Phase)
}
