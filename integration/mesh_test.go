package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/volumes"
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
	placeTarget(ctx, t, clusters[2], bDir, "mesh-b", "team: other\n", "")

	stall := streams.DefaultStallTimeout
	hub := startGateway(t, hubDir, gatewayOptions{identity: "hub", tokens: tokens, streamStall: stall,
		mesh: meshMember(t, ca, ca, "hub", "127.0.0.1:0")})
	aMesh := meshMember(t, ca, ca, "a", "", hub.meshAddr)
	a := startGateway(t, aDir, gatewayOptions{identity: "a", tokens: tokens, streamStall: stall, mesh: aMesh})
	bMesh := meshMember(t, ca, ca, "b", "", hub.meshAddr)
	b := startGateway(t, bDir, gatewayOptions{identity: "b", tokens: tokens, streamStall: stall, mesh: bMesh})
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

	// The main team's step pods (after the land above: they would hold it): a source on spoke a's target, a
	// destination on the hub's.
	src := labelledVolumePod(ctx, t, clusters[1], "mesh-a", "src", teamLabels("mesh-a", "jetway", "main"))
	dst := labelledVolumePod(ctx, t, clusters[0], "mesh-hub", "dst", teamLabels("mesh-hub", "jetway", "main"))
	fill(t, src, "big", 8<<20)
	meshStreams(ctx, t, hub, a, b, src, dst)

	// Spoke a, the source's owner, stops mid-stream: the stream fails,
	// naming the side and the gateway, and nothing lands.
	src.SetRate(4 << 20) // 8 MiB at 4 MiB/s
	time.AfterFunc(500*time.Millisecond, a.stop)
	code, _, body = postStreamAs(t, hub, mainToken.Token, "", meshStream("big", dst, "killed"))
	assert.Equal(t, http.StatusBadGateway, code, body)
	assert.Contains(t, body, `"side":"source","gateway":"a"`)
	_, err := os.Stat(filepath.Join(dst.Path("killed"), "in"))
	assert.True(t, os.IsNotExist(err), "no partial content lands")
	src.SetRate(0)
	a = startGateway(t, aDir, gatewayOptions{identity: "a", tokens: tokens, streamStall: stall, mesh: aMesh})
	for _, g := range []*gateway{hub, a, b} {
		waitOwners(t, g, all)
	}

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

	// Land, prune, resume and retire spoke a's target through the others,
	// as the main team, its step pod finished.
	finish(ctx, t, clusters[1], "mesh-a", "src", time.Now())
	for _, step := range []struct {
		g      *gateway
		action string
		want   string // the target's owner/state everywhere after; "" gone
	}{
		{b, "workers/mesh-a/land", "a/landed"},
		{b, "targets/mesh-a/resume", "a/running"},
		{hub, "workers/mesh-a/land", "a/landed"},
		{hub, "workers/mesh-a/prune", ""},
		// A pruned target is announced no more: it is resumed on its owner.
		{a, "targets/mesh-a/resume", "a/running"},
		{b, "workers/mesh-a/retire", ""},
	} {
		code, body, _ := call(t, http.MethodPut, step.g.base+"/api/v1/"+step.action, mainToken.Token)
		require.Equal(t, http.StatusOK, code, "%s: %s", step.action, body)
		want := map[string]string{"mesh-hub": "hub/running", "mesh-b": "b/running", "mesh-a": step.want}
		if step.want == "" {
			delete(want, "mesh-a")
		}
		for _, g := range []*gateway{hub, a, b} {
			waitOwners(t, g, want)
		}
	}
}

// meshStream is the body of a stream of the main team's volume handle on
// spoke a into a new volume of dst on the hub.
func meshStream(handle string, dst *volumes.Server, into string) string {
	os.MkdirAll(dst.Path(into), 0o755)
	b, _ := json.Marshal(streams.Request{
		From: streams.Endpoint{Target: "mesh-a", Pod: "src", Handle: handle, Path: "out"},
		To:   streams.Endpoint{Target: "mesh-hub", Pod: "dst", Handle: into, Path: "in"}, Encoding: "raw"})
	return string(b)
}

// meshStreams streams from spoke a's target into the hub's, asked of each
// gateway: the hub runs it (it owns the destination) and asks a for the
// source over the mesh; b forwards it to the hub through the hub; a
// forwards it to the hub, which asks a back. Each copy is checked by
// SHA-256 and content. Another team's token learns nothing.
func meshStreams(ctx context.Context, t *testing.T, hub, a, b *gateway, src, dst *volumes.Server) {
	t.Helper()
	want := directSHA(t, src, "art", "raw")
	data, err := os.ReadFile(filepath.Join(src.Path("art"), "out", "artifact.bin"))
	require.NoError(t, err)
	// kwok picks up the PortForward objects shortly after they are made.
	eventually(t, 20*time.Second, func() error {
		if code, _, body := postStreamAs(t, hub, mainToken.Token, "", meshStream("art", dst, "warmup")); code != http.StatusOK {
			return errorf("%d %s", code, body)
		}
		return nil
	})
	for into, g := range map[string]*gateway{"via-hub": hub, "via-b": b, "via-a": a} {
		code, _, body := postStreamAs(t, g, mainToken.Token, api.NDJSON, meshStream("art", dst, into))
		require.Equal(t, http.StatusOK, code, body)
		lines := strings.Split(strings.TrimSpace(body), "\n")
		var last api.ProgressLine
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last), body)
		require.NotNil(t, last.Result, body)
		assert.Equal(t, streams.ModeMesh, last.Result.Mode, into)
		assert.Equal(t, want, last.Result.SHA256, into)
		got, err := os.ReadFile(filepath.Join(dst.Path(into), "in", "artifact.bin"))
		require.NoError(t, err, into)
		assert.True(t, bytes.Equal(data, got), into)
	}
	assert.GreaterOrEqual(t, metricValue(t, a, `jetway_streams_total{mode="mesh_send"result="ok"}`), 4.0)
	assert.GreaterOrEqual(t, metricValue(t, hub, `jetway_streams_total{mode="mesh"result="ok"}`), 4.0)
	assert.Greater(t, metricValue(t, hub, `jetway_mesh_stream_bytes_total{direction="in"}`), float64(4*len(data)))

	// A source whose volume server dies behind a port-forward that stays
	// open: reported within the stall timeout and its tick.
	src2, err := volumes.Start(t.TempDir())
	require.NoError(t, err)
	fill(t, src2, "big", 8<<20)
	fill(t, src2, "art", 64<<10)
	require.NoError(t, clusters[1].ForwardPodPort(ctx, "mesh-a", "src", streams.VolumePort, "127.0.0.1", src2.Port()))
	eventually(t, 20*time.Second, func() error {
		code, _, body := postStreamAs(t, hub, mainToken.Token, "", meshStream("art", dst, "warmup2"))
		if code == http.StatusOK {
			return nil
		}
		return errorf("%d %s", code, body)
	})
	src2.SetRate(1 << 20)
	time.AfterFunc(time.Second, func() { src2.Kill() })
	start := time.Now()
	code, _, body := postStreamAs(t, b, mainToken.Token, "", meshStream("big", dst, "stalled"))
	assert.Equal(t, http.StatusBadGateway, code, body)
	assert.Contains(t, body, `"side":"source","gateway":"a"`)
	assert.Less(t, time.Since(start), 15*time.Second, "reported within 15 s")
	_, err = os.Stat(filepath.Join(dst.Path("stalled"), "in"))
	assert.True(t, os.IsNotExist(err), "no partial content lands")
	require.NoError(t, clusters[1].ForwardPodPort(ctx, "mesh-a", "src", streams.VolumePort, "127.0.0.1", src.Port()))
	eventually(t, 20*time.Second, func() error {
		if code, _, body := postStreamAs(t, hub, mainToken.Token, "", meshStream("art", dst, "warmup3")); code != http.StatusOK {
			return errorf("%d %s", code, body)
		}
		return nil
	})

	// Another team's target, wherever it is, is as unknown as a missing one.
	code, _, body = postStreamAs(t, hub, mainToken.Token, "", strings.Replace(meshStream("art", dst, "other"), `"mesh-a"`, `"mesh-b"`, 1))
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, `{"error":"unknown target mesh-b"}`+"\n", body)
}
