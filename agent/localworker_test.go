package agent

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/wire"
)

// The gateway's side drives a LocalWorker in concourse's
// localworker_test.go (the round trip of containers, mounts and execs).

// TestLocalWorkerServesGatewaysOnly: an agent answers its worker's calls
// to the gateways of its mesh alone: another agent, or a caller not on
// the mesh, gets 404 and nothing is made.
func TestLocalWorkerServesGatewaysOnly(t *testing.T) {
	for _, kind := range []string{mesh.KindAgent, ""} {
		dir := t.TempDir()
		w := &LocalWorker{Dir: dir, StepAgent: []string{"true"}}
		h := w.Handler()
		for _, r := range []*http.Request{
			httptest.NewRequest(http.MethodPut, wire.LocalWorkerPath+"containers/c1", strings.NewReader(`{"mounts": []}`)),
			httptest.NewRequest(http.MethodGet, wire.LocalWorkerPath+"volumes", nil),
			httptest.NewRequest(http.MethodPost, wire.LocalWorkerPath+"containers/c1/exec?arg=run&arg=--run&arg=x", nil),
		} {
			if kind != "" {
				r = r.WithContext(mesh.WithPeerKind(r.Context(), "other", kind))
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			assert.Equal(t, http.StatusNotFound, rec.Code, "%s %s from %q", r.Method, r.URL, kind)
		}
		assert.NoDirExists(t, filepath.Join(dir, "containers", "c1"))
	}
}
