package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
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
	st := startStar(ctx, t, [3]string{"mesh-hub", "mesh-a", "mesh-b"}, [3]string{"{}\n", "team: main\n", "team: other\n"},
		streams.DefaultStallTimeout)
	hub, a, b := st.gateways[0], st.gateways[1], st.gateways[2]
	all := st.all

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
	a = st.restart(t, 1)
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
	b = st.restart(t, 2)
	for _, g := range []*gateway{hub, a, b} {
		waitOwners(t, g, all)
	}

	// A gateway whose certificate another CA issued is refused, and sees
	// nothing of the mesh.
	foreign := meshtest.NewCA(t, "foreign-ca")
	xDir := t.TempDir()
	x := startGateway(t, xDir, gatewayOptions{identity: "x", tokens: st.opts[0].tokens, mesh: meshMember(t, foreign, st.ca, "x", "", hub.meshAddr)})
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

// star is a hub (gateway "hub") and two spokes ("a", "b") that dial it,
// each owning one target on its own cluster (0, 1, 2), with the admin and
// main tokens.
type star struct {
	ca       *meshtest.CA
	gateways [3]*gateway
	dirs     [3]string
	opts     [3]gatewayOptions
	all      map[string]string // what every gateway lists: each target's owner/running
}

// startStar starts a star whose targets have these names and target.yaml
// files, and waits until every gateway lists every target running.
func startStar(ctx context.Context, t *testing.T, names, targetYAMLs [3]string, streamStall time.Duration) *star {
	t.Helper()
	st := &star{ca: meshtest.NewCA(t, "mesh-ca"), all: map[string]string{}}
	for i, name := range []string{"hub", "a", "b"} {
		st.dirs[i] = t.TempDir()
		placeTarget(ctx, t, clusters[i], st.dirs[i], names[i], targetYAMLs[i], "")
		listen, peers := "", []string{}
		if i == 0 {
			listen = "127.0.0.1:0"
		} else {
			peers = append(peers, st.gateways[0].meshAddr)
		}
		st.opts[i] = gatewayOptions{identity: name, tokens: []api.Token{adminToken, mainToken}, streamStall: streamStall,
			mesh: meshMember(t, st.ca, st.ca, name, listen, peers...)}
		st.gateways[i] = startGateway(t, st.dirs[i], st.opts[i])
		st.all[names[i]] = name + "/running"
	}
	for _, g := range st.gateways {
		waitOwners(t, g, st.all)
	}
	return st
}

// restart starts gateway i again (after its stop), as it was.
func (st *star) restart(t *testing.T, i int) *gateway {
	st.gateways[i] = startGateway(t, st.dirs[i], st.opts[i])
	return st.gateways[i]
}

// meshStream is the body of a stream of the main team's volume handle on
// spoke a into a new volume of dst on the hub.
func meshStream(handle string, dst *volumes.Server, into string) string {
	os.MkdirAll(dst.Path(into), 0o755)
	b, _ := json.Marshal(wire.StreamRequest{
		From: wire.Endpoint{Target: "mesh-a", Pod: "src", Handle: handle, Path: "out"},
		To:   wire.Endpoint{Target: "mesh-hub", Pod: "dst", Handle: into, Path: "in"}, Encoding: "raw"})
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
	assert.GreaterOrEqual(t, metricValue(t, a, `jetway_streams_total{mode="mesh_send",result="ok"}`), 4.0)
	assert.GreaterOrEqual(t, metricValue(t, hub, `jetway_streams_total{mode="mesh",result="ok"}`), 4.0)
	assert.Greater(t, metricValue(t, hub, `jetway_mesh_stream_bytes_total{direction="in"}`), float64(4*len(data)))

	// A source whose volume server dies behind a port-forward that stays
	// open: reported within the stall timeout and its tick.
	src2 := startVolumes(t, "mesh-a", "src")
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

// TestMeshFull: three gateways, each owning a target on its own cluster,
// all dialing each other. Every gateway lists every target with one
// session per pair, also after a restart where both sides dial at once; a
// stream between two gateways' targets asked of the third is checked by
// SHA-256; a member with a good certificate sending a malformed frame
// loses its own session only; an expired certificate is refused; a
// certificate rotated while its gateway runs is used from the next
// session on, without a restart.
func TestMeshFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	tokens := []api.Token{adminToken, mainToken}
	var dirs [3]string
	for i := range dirs {
		dirs[i] = t.TempDir()
		placeTarget(ctx, t, clusters[i], dirs[i], fmt.Sprintf("full-%d", i), "team: main\n", "")
	}
	src := labelledVolumePod(ctx, t, clusters[0], "full-0", "src", teamLabels("full-0", "jetway", "main"))
	dst := labelledVolumePod(ctx, t, clusters[2], "full-2", "dst", teamLabels("full-2", "jetway", "main"))

	// g2's certificate expires soon; it is rotated while g2 runs.
	expiry := time.Now().Add(30 * time.Second)
	m0 := meshMember(t, ca, ca, "g0", "127.0.0.1:0")
	g0 := startGateway(t, dirs[0], gatewayOptions{identity: "g0", tokens: tokens, mesh: m0})
	m1 := meshMember(t, ca, ca, "g1", "127.0.0.1:0", g0.meshAddr)
	g1 := startGateway(t, dirs[1], gatewayOptions{identity: "g1", tokens: tokens, mesh: m1})
	certDir := t.TempDir()
	caFile, certFile, keyFile := ca.Files(t, ca, certDir, "g2", expiry)
	m2 := &meshOptions{caFile: caFile, certFile: certFile, keyFile: keyFile, listen: "127.0.0.1:0", peers: []string{g0.meshAddr, g1.meshAddr}}
	g2 := startGateway(t, dirs[2], gatewayOptions{identity: "g2", tokens: tokens, mesh: m2})
	all := map[string]string{"full-0": "g0/running", "full-1": "g1/running", "full-2": "g2/running"}
	gateways := []*gateway{g0, g1, g2}
	waitFullMesh(t, gateways, all)

	// g1 asks for a stream from g0's target into g2's: g2 runs it and asks
	// g0 for the source, each over their own session.
	body := func(into string) string {
		os.MkdirAll(dst.Path(into), 0o755)
		b, _ := json.Marshal(wire.StreamRequest{
			From: wire.Endpoint{Target: "full-0", Pod: "src", Handle: "art", Path: "out"},
			To:   wire.Endpoint{Target: "full-2", Pod: "dst", Handle: into, Path: "in"}, Encoding: "zstd"})
		return string(b)
	}
	var res wire.StreamResult
	eventually(t, 20*time.Second, func() error { // kwok picks the PortForward objects up
		code, _, b := postStreamAs(t, g1, mainToken.Token, "", body("full"))
		if code != http.StatusOK {
			return errorf("%d %s", code, b)
		}
		return json.Unmarshal([]byte(b), &res)
	})
	assert.Equal(t, streams.ModeMesh, res.Mode)
	assert.Equal(t, directSHA(t, src, "art", "zstd"), res.SHA256)
	assert.Equal(t, fileSHA(t, filepath.Join(src.Path("art"), "out", "artifact.bin")),
		fileSHA(t, filepath.Join(dst.Path("full"), "in", "artifact.bin")), "the volume landed whole")

	// A member with a certificate of the mesh CA that sends a malformed
	// control frame: its session closes, and nothing else changes.
	require.NoError(t, malformedPeer(ctx, t, ca, g0.meshAddr))
	assert.Equal(t, 1.0, metricValue(t, g0, "jetway_mesh_malformed_frames_total"))
	waitFullMesh(t, gateways, all)

	// An expired certificate is refused, and its gateway sees nothing.
	xDir := t.TempDir()
	xca, xcert, xkey := ca.Files(t, ca, t.TempDir(), "x", time.Now().Add(-time.Minute))
	x := startGateway(t, xDir, gatewayOptions{identity: "x", tokens: tokens,
		mesh: &meshOptions{caFile: xca, certFile: xcert, keyFile: xkey, peers: []string{g0.meshAddr}}})
	eventually(t, 10*time.Second, func() error {
		if v := metricValue(t, g0, `jetway_mesh_handshake_failures_total{reason="expired"}`); v < 1 {
			return errorf("expired refusals %v", v)
		}
		return nil
	})
	assert.Empty(t, x.targetsByName(t))
	x.stop()

	// g2's certificate is replaced while it runs. Once the old one has
	// expired, g0 restarts on its address and dials both others while
	// they dial it: g2 joins with the new certificate, one session per
	// pair.
	ca.Issue(t, certDir, "g2", time.Now().Add(time.Hour))
	time.Sleep(time.Until(expiry)) // the old certificate would be refused now
	g0.stop()
	m0.listen, m0.peers = g0.meshAddr, []string{g1.meshAddr, g2.meshAddr}
	g0 = startGateway(t, dirs[0], gatewayOptions{identity: "g0", tokens: tokens, mesh: m0})
	gateways[0] = g0
	waitFullMesh(t, gateways, all)
	assert.Zero(t, metricValue(t, g0, `jetway_mesh_handshake_failures_total{reason="expired"}`), "g2 never showed the expired certificate")
}

// waitFullMesh waits until every gateway lists want and has a session
// with each of the others.
func waitFullMesh(t *testing.T, gateways []*gateway, want map[string]string) {
	t.Helper()
	for _, g := range gateways {
		waitOwners(t, g, want)
		eventually(t, 10*time.Second, func() error {
			if up := metricValue(t, g, `jetway_mesh_peers{state="up"}`); up != float64(len(gateways)-1) {
				return errorf("%v sessions up", up)
			}
			return nil
		})
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// malformedPeer joins the mesh at addr as "rogue", with a certificate of
// ca, speaking the wire format of docs/mesh.md by hand: the hello, then a
// frame whose JSON is cut. It returns once the peer closed the session.
func malformedPeer(ctx context.Context, t *testing.T, ca *meshtest.CA, addr string) error {
	_, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "rogue", time.Now().Add(time.Hour))
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
		NextProtos:         []string{"jetway-mesh/1"},
		InsecureSkipVerify: true}} // the rogue does not care who answers
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	sess, err := yamux.Client(conn, nil)
	if err != nil {
		return err
	}
	defer sess.Close()
	ctrl, err := sess.OpenStream()
	if err != nil {
		return err
	}
	frame := func(b string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
	}
	if _, err := ctrl.Write(frame(`{"version": 1, "name": "rogue", "kind": "gateway", "session": "ROGUESESSION0000000000000A"}`)); err != nil {
		return err
	}
	var head [4]byte
	if _, err := io.ReadFull(ctrl, head[:]); err != nil {
		return fmt.Errorf("no hello back: %w", err)
	}
	theirs := make([]byte, binary.BigEndian.Uint32(head[:]))
	if _, err := io.ReadFull(ctrl, theirs); err != nil {
		return err
	}
	if !strings.Contains(string(theirs), `"version":1`) {
		return fmt.Errorf("hello %s", theirs)
	}
	// The member closes the session on reading this frame, which may be
	// before this Write returns (yamux then answers "session shutdown"
	// for a frame it sent): the close is what is waited for below.
	if _, err := ctrl.Write(frame(`{"type": "routes", "routes": [`)); err != nil && !errors.Is(err, yamux.ErrSessionShutdown) {
		return err
	}
	if _, err := io.Copy(io.Discard, ctrl); err != nil && !errors.Is(err, yamux.ErrConnectionReset) && !errors.Is(err, yamux.ErrSessionShutdown) {
		return fmt.Errorf("waiting for the session to close: %w", err)
	}
	select {
	case <-sess.CloseChan():
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("the session stayed open")
	}
}
