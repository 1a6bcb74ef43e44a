package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

type fakeTargets []targets.Status

func (f fakeTargets) Snapshot() []targets.Status { return f }

func (f fakeTargets) Get(name string) (targets.Status, error) {
	for _, s := range f {
		if s.Name == name {
			return s, nil
		}
	}
	return targets.Status{}, targets.ErrNotFound
}

// Find also finds prunedTarget, as the registry finds pruned targets.
func (f fakeTargets) Find(name string) (targets.Status, error) {
	if name == prunedTarget.Name {
		return prunedTarget, nil
	}
	return f.Get(name)
}

var (
	prunedTarget = targets.Status{Name: "pruned-main", State: targets.StateLanded,
		Meta: targets.Metadata{Team: "main", Platform: "linux", Namespace: "p"}}
	started = time.Unix(1_700_000_000, 0)
	fleet   = fakeTargets{
		{Name: "global", Server: "https://10.1.2.3:6443", State: targets.StateRunning, StartTime: started,
			Meta: targets.Metadata{Platform: "linux", Namespace: "ci"}, ServerVersion: "v1.36.3",
			Latency: 1500 * time.Microsecond, LastCheck: started.Add(time.Minute),
			Counts: targets.Counts{ActiveContainers: 3, BuildContainers: 2, ActiveTasks: 1, ActiveVolumes: 5}},
		{Name: "main-gpu", Server: "https://gpu.example:443", State: targets.StateStalled, StartTime: started,
			Meta:               targets.Metadata{Team: "main", Tags: []string{"gpu"}, Platform: "linux", Namespace: "builds"},
			Error:              "missing permissions: create pods/portforward",
			MissingPermissions: []string{"create pods/portforward"}},
		{Name: "other", Server: "https://other:6443", State: targets.StateRunning,
			Meta: targets.Metadata{Team: "other", Platform: "linux", Namespace: "x"}},
	}
	tokens = []Token{
		{Name: "ops", Token: "admin-token-0123456789", Admin: true},
		{Name: "main-ci", Token: "main-token-0123456789", Team: "main"},
	}
)

func request(t *testing.T, h http.Handler, path, token string) *httptest.ResponseRecorder {
	t.Helper()
	return serve(h, http.MethodGet, path, token, "")
}

// serve sends one request to h, with a bearer token unless "".
func serve(h http.Handler, method, path, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func testServer(noAuth bool) http.Handler {
	return New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet, Tokens: tokens, NoAuth: noAuth}).Handler()
}

func TestWorkersJSONIsWhatFlyReads(t *testing.T) {
	rec := request(t, testServer(false), "/api/v1/workers", "admin-token-0123456789")
	require.Equal(t, http.StatusOK, rec.Code)
	var got []map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Len(t, got, 3)
	assert.Equal(t, map[string]any{
		"addr": "k8s://10.1.2.3:6443/ci", "baggageclaim_url": "", "active_containers": 3.0, "active_volumes": 5.0,
		"active_tasks": 1.0, "resource_types": []any{}, "platform": "linux", "tags": []any{}, "team": "",
		"name": "global", "version": "2.5", "start_time": 1_700_000_000.0, "ephemeral": false, "state": "running",
	}, got[0])
	assert.Equal(t, []any{"gpu"}, got[1]["tags"])
	assert.Equal(t, "stalled", got[1]["state"])
	assert.Equal(t, 0.0, got[2]["start_time"], "unknown start is 0, which fly shows as n/a")
}

func TestAuthAndVisibility(t *testing.T) {
	h := testServer(false)
	names := func(rec *httptest.ResponseRecorder) []string {
		var ws []wire.Worker
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ws))
		var out []string
		for _, w := range ws {
			out = append(out, w.Name)
		}
		return out
	}
	for _, path := range []string{"/api/v1/workers", "/api/v1/targets", "/api/v1/targets/global"} {
		assert.Equal(t, http.StatusUnauthorized, request(t, h, path, "").Code, path)
		assert.Equal(t, http.StatusUnauthorized, request(t, h, path, "wrong-token-0123456789").Code, path)
	}
	assert.Equal(t, http.StatusOK, request(t, h, "/api/v1/info", "").Code, "info needs no token")
	assert.Equal(t, http.StatusOK, request(t, h, "/healthz", "").Code)

	assert.Equal(t, []string{"global", "main-gpu", "other"}, names(request(t, h, "/api/v1/workers", "admin-token-0123456789")))
	assert.Equal(t, []string{"global", "main-gpu"}, names(request(t, h, "/api/v1/workers", "main-token-0123456789")),
		"a team sees global targets and its own")
	assert.Equal(t, http.StatusNotFound, request(t, h, "/api/v1/targets/other", "main-token-0123456789").Code,
		"another team's target does not exist for a team token")
	assert.Equal(t, []string{"global", "main-gpu", "other"}, names(request(t, testServer(true), "/api/v1/workers", "")),
		"--no-auth serves everything")
}

func TestTargetDetail(t *testing.T) {
	h := testServer(false)
	rec := request(t, h, "/api/v1/targets/main-gpu", "main-token-0123456789")
	require.Equal(t, http.StatusOK, rec.Code)
	var got map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	assert.Equal(t, "stalled", got["state"])
	assert.Equal(t, []any{"create pods/portforward"}, got["missing_permissions"])
	assert.Equal(t, "missing permissions: create pods/portforward", got["error"])
	assert.Nil(t, got["last_check"])

	rec = request(t, h, "/api/v1/targets/global", "admin-token-0123456789")
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	assert.Equal(t, 1.5, got["latency_ms"])
	assert.Equal(t, "v1.36.3", got["server_version"])
	assert.Equal(t, "2023-11-14T22:14:20Z", got["last_check"])
	assert.Equal(t, []any{}, got["missing_permissions"])

	rec = request(t, h, "/api/v1/targets/nope", "admin-token-0123456789")
	assert.Equal(t, http.StatusNotFound, rec.Code)
	assert.Contains(t, rec.Body.String(), "unknown target nope")
}

func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	file := func(body string) string {
		p := filepath.Join(dir, "tokens.yaml")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	loadTokens := func(path string) ([]Token, error) {
		_, got, err := NewTokenFile(TokenFileOptions{Path: path, Set: func([]Token) {}})
		return got, err
	}
	got, err := loadTokens(file("tokens:\n- {name: ops, token: admin-token-0123456789, admin: true}\n- {name: ci, token: main-token-0123456789, team: main}\n"))
	require.NoError(t, err)
	assert.Equal(t, tokens[0], got[0])

	_, err = loadTokens(file("tokens:\n- {name: a, token: short, admin: true}\n- {name: a, token: another-token-0123456789}\n- {token: third-token-0123456789, admin: true, team: x}\n"))
	require.Error(t, err)
	for _, want := range []string{`tokens[0] ("a"): token must have at least 16 characters`, `tokens[1] ("a"): name is repeated`,
		`tokens[1] ("a"): give exactly one of admin: true or team`, "tokens[2]: name is required"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NotContains(t, err.Error(), "another-token-0123456789", "errors never quote tokens")

	_, err = loadTokens(file("tokenz: []\n"))
	assert.ErrorContains(t, err, `unknown field "tokenz"`)
}
