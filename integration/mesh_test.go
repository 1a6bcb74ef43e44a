package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/internal/meshtest"
)

// meshMember writes a certificate of c for name (trusting trust) and
// returns the mesh flags of a gateway using it.
func meshMember(t *testing.T, c, trust *meshtest.CA, name, listen string, peers ...string) *meshOptions {
	caFile, certFile, keyFile := c.Files(t, trust, t.TempDir(), name, time.Now().Add(time.Hour))
	return &meshOptions{caFile: caFile, certFile: certFile, keyFile: keyFile, listen: listen, peers: peers}
}

// owners is what g lists: each target's owner and state.
func owners(t *testing.T, g *gateway) map[string]string {
	out := map[string]string{}
	for name, tg := range g.targetsByName(t) {
		out[name] = tg.Owner + "/" + tg.State
	}
	return out
}

func waitOwners(t *testing.T, g *gateway, want map[string]string) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		if got := owners(t, g); !assert.ObjectsAreEqual(want, got) {
			return errorf("targets %v, want %v", got, want)
		}
		return nil
	})
}

// TestMeshStar: two spokes dial a hub; each gateway owns a target on its
// own cluster namespace, and every gateway lists, lands and resumes every
// target the caller's team may act on. A spoke stopped has its target
// stalled everywhere and calls on it answered at once naming it; back, its
// target runs again. A gateway with a foreign CA is refused.
func TestMeshStar(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	tokens := []api.Token{adminToken, mainToken}
	hubDir, aDir, bDir := t.TempDir(), t.TempDir(), t.TempDir()
	placeTarget(ctx, t, clusters[0], hubDir, "mesh-hub", "{}\n", "")
	placeTarget(ctx, t, clusters[1], aDir, "mesh-a", "team: main\n", "")
	placeTarget(ctx, t, clusters[0], bDir, "mesh-b", "team: other\n", "")

	hub := startGateway(t, hubDir, gatewayOptions{identity: "hub", tokens: tokens, mesh: meshMember(t, ca, ca, "hub", "127.0.0.1:0")})
	a := startGateway(t, aDir, gatewayOptions{identity: "a", tokens: tokens, mesh: meshMember(t, ca, ca, "a", "", hub.meshAddr)})
	bMesh := meshMember(t, ca, ca, "b", "", hub.meshAddr)
	b := startGateway(t, bDir, gatewayOptions{identity: "b", tokens: tokens, mesh: bMesh})
	all := map[string]string{"mesh-hub": "hub/running", "mesh-a": "a/running", "mesh-b": "b/running"}
	for _, g := range []*gateway{hub, a, b} {
		waitOwners(t, g, all)
	}

	// Through spoke b and the hub, the main team lands and resumes its
	// target on spoke a; the owner checks the team.
	code, body, _ := call(t, http.MethodPut, b.base+"/api/v1/workers/mesh-a/land", mainToken.Token)
	require.Equal(t, http.StatusOK, code, body)
	a.waitTarget(t, "mesh-a", 10*time.Second, func(tg api.Target) bool { return tg.State == "landed" })
	hub.waitTarget(t, "mesh-a", 10*time.Second, func(tg api.Target) bool { return tg.State == "landed" })
	code, body, _ = call(t, http.MethodPut, b.base+"/api/v1/targets/mesh-a/resume", mainToken.Token)
	require.Equal(t, http.StatusOK, code, body)
	a.waitTarget(t, "mesh-a", 10*time.Second, running)
	code, _, _ = call(t, http.MethodPut, a.base+"/api/v1/workers/mesh-b/land", mainToken.Token)
	assert.Equal(t, http.StatusNotFound, code, "another team's target is unknown, wherever it is")
	code, _, _ = call(t, http.MethodPut, a.base+"/api/v1/workers/mesh-hub/land", mainToken.Token)
	assert.Equal(t, http.StatusForbidden, code, "the owner refuses a team token on a global target")
	assert.Equal(t, "running", hub.targetsByName(t)["mesh-hub"].State)

	// Spoke b stops: its target goes stalled after the threshold, and a
	// call on it answers at once, naming it.
	b.stop()
	waitOwners(t, a, map[string]string{"mesh-hub": "hub/running", "mesh-a": "a/running", "mesh-b": "b/stalled"})
	start := time.Now()
	code, body, _ = call(t, http.MethodPut, a.base+"/api/v1/workers/mesh-b/land", adminToken.Token)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "gateway b")
	assert.Less(t, time.Since(start), 2*time.Second)

	// Back, with the same certificate: its target runs again everywhere.
	b = startGateway(t, bDir, gatewayOptions{identity: "b", tokens: tokens, mesh: bMesh})
	for _, g := range []*gateway{hub, a, b} {
		waitOwners(t, g, all)
	}

	// A gateway whose certificate another CA issued is refused, and sees
	// nothing of the mesh.
	foreign := meshtest.NewCA(t, "foreign-ca")
	xDir := t.TempDir()
	x := startGateway(t, xDir, gatewayOptions{identity: "x", tokens: tokens, mesh: meshMember(t, foreign, ca, "x", "", hub.meshAddr)})
	eventually(t, 10*time.Second, func() error {
		if v := metricValue(t, hub, `jetway_mesh_handshake_failures_total{reason="unknown-authority"}`); v < 1 {
			return errorf("refusals %v", v)
		}
		return nil
	})
	assert.Empty(t, x.targetsByName(t))
}
