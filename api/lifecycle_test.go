package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/targets"
)

// fakeLifecycle answers every call with err and records what it was asked.
type fakeLifecycle struct {
	err   error
	calls []string
}

func (f *fakeLifecycle) Land(_ context.Context, name string) error {
	f.calls = append(f.calls, "land "+name)
	return f.err
}

func (f *fakeLifecycle) Retire(_ context.Context, name string) error {
	f.calls = append(f.calls, "retire "+name)
	return f.err
}

func (f *fakeLifecycle) Prune(_ context.Context, name string) (string, error) {
	f.calls = append(f.calls, "prune "+name)
	return lifecycle.PrunedEverywhere, f.err
}

func (f *fakeLifecycle) Resume(_ context.Context, name string) error {
	f.calls = append(f.calls, "resume "+name)
	return f.err
}

func (f *fakeLifecycle) Sync(_ context.Context, name string, handles []string) ([]string, error) {
	f.calls = append(f.calls, fmt.Sprintf("sync %s %v", name, handles))
	return []string{"old"}, f.err
}

func put(h http.Handler, path, token, body string) *httptest.ResponseRecorder {
	return serve(h, http.MethodPut, path, token, body)
}

func TestWorkerActionsStatusCodes(t *testing.T) {
	const admin, team = "admin-token-0123456789", "main-token-0123456789"
	tests := []struct {
		name, path, token string
		err               error
		code              int
		body              string
		called            bool
	}{
		{name: "admin lands", path: "/api/v1/workers/global/land", token: admin, code: 200, called: true},
		{name: "no token", path: "/api/v1/workers/global/land", code: 401},
		{name: "team token on global", path: "/api/v1/workers/global/retire", token: team, code: 403},
		{name: "team token on other team", path: "/api/v1/workers/other/land", token: team, code: 403},
		{name: "team token on own team", path: "/api/v1/workers/main-gpu/land", token: team, code: 200, called: true},
		{name: "unknown", path: "/api/v1/workers/nope/prune", token: admin, code: 404},
		{name: "prune running", path: "/api/v1/workers/global/prune", token: admin, err: targets.ErrRunning,
			code: 400, body: `{"stderr":"cannot prune running worker"}`, called: true},
		{name: "another replica acts", path: "/api/v1/workers/global/land", token: admin, err: lifecycle.ErrBusy, code: 409, called: true},
		{name: "cluster unreachable", path: "/api/v1/workers/global/land", token: admin,
			err: fmt.Errorf("%w: dial tcp: refused", lifecycle.ErrUnreachable), code: 502, called: true},
		{name: "gone meanwhile", path: "/api/v1/workers/global/retire", token: admin, err: targets.ErrNotFound, code: 404, called: true},
		{name: "cluster refuses our credentials", path: "/api/v1/workers/global/land", token: admin,
			err: fmt.Errorf("%w: configmaps is forbidden", lifecycle.ErrDenied), code: 502, called: true},
		{name: "resume a pruned target", path: "/api/v1/targets/pruned-main/resume", token: team, code: 200, called: true},
		{name: "resume a running target", path: "/api/v1/targets/main-gpu/resume", token: team, code: 200, called: true},
		{name: "resume another team's", path: "/api/v1/targets/other/resume", token: team, code: 403},
		{name: "resume unknown", path: "/api/v1/targets/nope/resume", token: admin, code: 404},
		{name: "a pruned target is not landed", path: "/api/v1/workers/pruned-main/land", token: admin, code: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lc := &fakeLifecycle{err: tt.err}
			h := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet, Lifecycle: lc, Tokens: tokens}).Handler()
			rec := put(h, tt.path, tt.token, "")
			assert.Equal(t, tt.code, rec.Code, rec.Body.String())
			if tt.body != "" {
				assert.JSONEq(t, tt.body, rec.Body.String())
				assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			}
			if tt.code == 200 {
				assert.Empty(t, rec.Body.String(), "Concourse answers 200 with an empty body")
			}
			assert.Equal(t, tt.called, len(lc.calls) == 1, "%v", lc.calls)
			if errors.Is(tt.err, lifecycle.ErrDenied) {
				assert.NotContains(t, rec.Body.String(), "cannot reach", "a refusal is not an outage")
				assert.Contains(t, rec.Body.String(), "not allowed")
			}
		})
	}
}

func TestPruneSaysHowFarItReached(t *testing.T) {
	lc := &fakeLifecycle{}
	h := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet, Lifecycle: lc, NoAuth: true}).Handler()
	rec := put(h, "/api/v1/workers/main-gpu/prune", "", "")
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Empty(t, rec.Body.String())
	assert.Equal(t, "installation", rec.Header().Get(PruneScopeHeader))
}

func TestSyncRequest(t *testing.T) {
	lc := &fakeLifecycle{}
	h := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet, Lifecycle: lc, NoAuth: true}).Handler()
	rec := put(h, "/api/v1/targets/global/sync", "", `{"handles": ["a", "b"]}`)
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"deleted": ["old"]}`, rec.Body.String())
	assert.Equal(t, []string{"sync global [a b]"}, lc.calls)

	for _, body := range []string{"", "[]", `{"handles": "a"}`, `{"handels": []}`, `{}`} {
		rec := put(h, "/api/v1/targets/global/sync", "", body)
		assert.Equal(t, http.StatusBadRequest, rec.Code, body)
		assert.Contains(t, rec.Body.String(), `{\"handles\": [\"<step pod>\", ...]}`)
	}
}
