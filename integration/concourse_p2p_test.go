package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/internal/meshtest"
)

// p2pFallback is what the web node logs when a worker could not push a
// volume to another itself, before it relays the volume.
const p2pFallback = "p2p-stream-failed-falling-back-to-atc"

// p2pPipeline makes a 16 MiB random file and its SHA-256 on the worker
// tagged from, checks it on the worker tagged to, and adds a file there
// that a task back on from checks too: each artifact crosses once.
func p2pPipeline(from, to string) string {
	return `jobs:
- name: across
  plan:
  - task: make
    tags: [` + from + `]
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      outputs: [{name: made}]
      run: {path: sh, args: [-c, 'head -c 16777216 /dev/urandom > made/blob && mkdir made/sub && echo nested > made/sub/file && sha256sum made/blob made/sub/file > made/sums']}
  - task: check
    tags: [` + to + `]
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      inputs: [{name: made}]
      outputs: [{name: checked}]
      run: {path: sh, args: [-c, 'sha256sum -c made/sums && cp made/sums checked/sums && echo "checked on the other side" > checked/note']}
  - task: back
    tags: [` + from + `]
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      inputs: [{name: checked}]
      run: {path: sh, args: [-c, 'cat checked/note checked/sums']}
`
}

// TestConcourseP2PBetweenTargets: a web node with p2p streaming (as the
// tests' web node always runs) streams a build's artifacts between two
// jetway targets in two clusters. jetway carries each itself, from one
// target's volume holder into the other's, through the gateway's
// port-forwards: the web node logs no fallback to relaying, the bytes
// arrive whole (the tasks check their SHA-256), and the gateway counts
// the streams by their path.
func TestConcourseP2PBetweenTargets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{})
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "p2p-a", "tags: [p2p-a]\n", "")
	placeTarget(ctx, t, clusters[1], dir, "p2p-b", "tags: [p2p-b]\n", "")
	g := startGateway(t, dir, gatewayOptions{concourse: concourseTSA(t, web), state: newState(t)})
	flyWorker(t, web, "p2p-a", time.Minute, workerIn("running"))
	flyWorker(t, web, "p2p-b", time.Minute, workerIn("running"))

	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(p2pPipeline("p2p-a", "p2p-b")))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "p2p", "-c", pipeline)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "p2p")
	out := flyOK(ctx, t, web, 3*time.Minute, "trigger-job", "-j", "p2p/across", "--watch")
	assert.Contains(t, out, "made/blob: OK\r\n", "the artifact arrived whole on the other target")
	assert.Contains(t, out, "made/sub/file: OK\r\n")
	assert.Contains(t, out, "checked on the other side\r\n", "and the other's output came back")
	assert.Contains(t, out, "succeeded")

	assertNoP2PFallback(t, web)
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_concourse_p2p_streams_total{path="relay",result="ok"}`), 2.0,
		"each artifact carried by the gateway, target to target")
	assert.Greater(t, metricValue(t, g, `jetway_concourse_p2p_stream_bytes_total{path="relay"}`), float64(1<<20),
		"the 16 MiB of random bytes, zstd-encoded on the way, went that way")
	assert.Zero(t, metricValue(t, g, `jetway_concourse_p2p_streams_total{path="relay",result="error"}`))
	assert.Zero(t, metricValue(t, g, `jetway_concourse_volume_holds_total{outcome="settled"}`),
		"each artifact was carried from the pod that wrote it, not copied into its holder first")
}

// assertNoP2PFallback asserts the web node relayed no volume after a p2p
// stream failed: its log has no p2pFallback, which it would show.
func assertNoP2PFallback(t *testing.T, web *cwn.WebNode) {
	t.Helper()
	assert.Empty(t, p2pFallbacks(t, web), "the web node relayed volumes after p2p streams failed")
}

// p2pFallbacks are the lines of the web node's log saying it relays a
// volume after a p2p stream failed.
func p2pFallbacks(t *testing.T, web *cwn.WebNode) []string {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(web.Dir, "web.log"))
	require.NoError(t, err)
	var fallbacks []string
	for line := range strings.Lines(string(log)) {
		if strings.Contains(line, p2pFallback) {
			fallbacks = append(fallbacks, line)
		}
	}
	return fallbacks
}

// TestConcourseP2PAcrossAMesh: one build of three steps on three targets
// in two clusters, owned by two gateways of a mesh, each registering its
// own with one web node. The web node asks the source's worker to push
// each artifact; jetway carries it: to a target of the same gateway
// through its port-forwards, to the other gateway's over the mesh (the
// destination's owner takes the bytes from the source's). Every input
// arrives whole, and the web node relays none.
func TestConcourseP2PAcrossAMesh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{})
	ca := meshtest.NewCA(t, "p2p-mesh-ca")
	dirs := [2]string{t.TempDir(), t.TempDir()}
	placeTarget(ctx, t, clusters[0], dirs[0], "p2p-ma", "tags: [p2p-ma]\n", "")
	placeTarget(ctx, t, clusters[1], dirs[0], "p2p-mc", "tags: [p2p-mc]\n", "")
	placeTarget(ctx, t, clusters[1], dirs[1], "p2p-mb", "tags: [p2p-mb]\n", "")
	g0 := startGateway(t, dirs[0], gatewayOptions{identity: "p2p-g0", concourse: concourseTSA(t, web), state: newState(t),
		mesh: meshMember(t, ca, ca, "p2p-g0", "127.0.0.1:0")})
	g1 := startGateway(t, dirs[1], gatewayOptions{identity: "p2p-g1", concourse: concourseTSA(t, web), state: newState(t),
		mesh: meshMember(t, ca, ca, "p2p-g1", "", g0.meshAddr)})
	all := map[string]string{"p2p-ma": "p2p-g0/running", "p2p-mc": "p2p-g0/running", "p2p-mb": "p2p-g1/running"}
	waitOwners(t, g0, all)
	waitOwners(t, g1, all)
	for name := range all {
		flyWorker(t, web, name, time.Minute, workerIn("running"))
	}

	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(`jobs:
- name: across
  plan:
  - task: make
    tags: [p2p-ma]
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      outputs: [{name: made}]
      run: {path: sh, args: [-c, 'head -c 16777216 /dev/urandom > made/blob && sha256sum made/blob > made/sums']}
  - task: check
    tags: [p2p-mb]
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      inputs: [{name: made}]
      outputs: [{name: checked}]
      run: {path: sh, args: [-c, 'sha256sum -c made/sums && head -c 8388608 /dev/urandom > checked/blob && sha256sum checked/blob > checked/sums']}
  - task: final
    tags: [p2p-mc]
    config:
      platform: linux
      rootfs_uri: docker:///busybox
      inputs: [{name: made}, {name: checked}]
      run: {path: sh, args: [-c, 'sha256sum -c made/sums checked/sums']}
`))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "p2pmesh", "-c", pipeline)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "p2pmesh")
	out := flyOK(ctx, t, web, 3*time.Minute, "trigger-job", "-j", "p2pmesh/across", "--watch")
	assert.Equal(t, 2, strings.Count(out, "made/blob: OK\r\n"), "made arrived whole on p2p-mb and on p2p-mc: %s", out)
	assert.Contains(t, out, "checked/blob: OK\r\n", "checked arrived whole on p2p-mc")
	assert.Contains(t, out, "succeeded")
	assertNoP2PFallback(t, web)

	// made: p2p-ma (g0) to p2p-mb (g1), over the mesh, asked of g1, and
	// to p2p-mc, through g0's port-forwards; checked: p2p-mb (g1) to
	// p2p-mc (g0), over the mesh, asked of g0.
	assert.Equal(t, 1.0, metricValue(t, g0, `jetway_concourse_p2p_streams_total{path="mesh",result="ok"}`), "made to p2p-mb")
	assert.Equal(t, 1.0, metricValue(t, g0, `jetway_concourse_p2p_streams_total{path="relay",result="ok"}`), "made to p2p-mc")
	assert.Equal(t, 1.0, metricValue(t, g1, `jetway_concourse_p2p_streams_total{path="mesh",result="ok"}`), "checked to p2p-mc")
	for _, g := range []*gateway{g0, g1} {
		assert.Equal(t, 2.0, metricValue(t, g, `jetway_streams_total{mode="mesh",result="ok"}`)+metricValue(t, g, `jetway_streams_total{mode="mesh_send",result="ok"}`),
			"each gateway took one stream's bytes over the mesh and sent another's")
	}
}

// TestConcourseP2PMeshCut: the mesh between the gateways that own a p2p
// stream's source and destination is cut mid-transfer. The stream fails
// at once, naming the destination's side and the gateway that owns it,
// which the web node logs before it relays the volume itself: the build
// succeeds, its artifact whole, and what the cut stream had written is
// never taken for the volume.
func TestConcourseP2PMeshCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{})
	ca := meshtest.NewCA(t, "p2p-cut-ca")
	dirs := [2]string{t.TempDir(), t.TempDir()}
	placeTarget(ctx, t, clusters[0], dirs[0], "p2p-xa", "tags: [p2p-xa]\n", "")
	placeTarget(ctx, t, clusters[1], dirs[1], "p2p-xb", "tags: [p2p-xb]\n", "")
	g0 := startGateway(t, dirs[0], gatewayOptions{identity: "p2p-x0", concourse: concourseTSA(t, web), state: newState(t),
		mesh: meshMember(t, ca, ca, "p2p-x0", "127.0.0.1:0")})
	// p2p-x1 reaches p2p-x0 through a proxy the test cuts.
	proxy := startCutProxy(t, g0.meshAddr)
	g1 := startGateway(t, dirs[1], gatewayOptions{identity: "p2p-x1", concourse: concourseTSA(t, web), state: newState(t),
		mesh: meshMember(t, ca, ca, "p2p-x1", "", proxy.ln.Addr().String())})
	all := map[string]string{"p2p-xa": "p2p-x0/running", "p2p-xb": "p2p-x1/running"}
	waitOwners(t, g0, all)
	waitOwners(t, g1, all)
	for name := range all {
		flyWorker(t, web, name, time.Minute, workerIn("running"))
	}

	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(cwn.ArtifactPipeline(256<<20,
		cwn.ArtifactJob{Name: "cut", Tags: []string{"p2p-xa"}, CheckTags: []string{"p2p-xb"}, RootfsURI: "docker:///busybox"})))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "p2pcut", "-c", pipeline)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "p2pcut")
	inBytes := `jetway_mesh_stream_bytes_total{direction="in"}`
	before := metricValue(t, g1, inBytes)
	done := flyAsync(ctx, web, 4*time.Minute, "trigger-job", "-j", "p2pcut/cut", "--watch")
	// Once 16 MiB of the artifact crossed the mesh into p2p-x1, the
	// connection carrying it is cut.
	eventually(t, 3*time.Minute, func() error {
		if n := metricValue(t, g1, inBytes) - before; n < 16<<20 {
			return errorf("%v bytes in over the mesh", n)
		}
		return nil
	})
	proxy.Cut()
	cut := time.Now()
	var r flyResult
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the build did not end")
	}
	require.NoError(t, r.err, r.out)
	assert.Contains(t, r.out, cwn.ArtifactMarker, "the artifact arrived whole, relayed")
	assert.Contains(t, r.out, "succeeded")

	fallbacks := p2pFallbacks(t, web)
	if assert.Len(t, fallbacks, 1, "the cut stream, relayed") {
		assert.Contains(t, fallbacks[0], "worker p2p-xb's side: destination (mesh member p2p-x1)", "the side and its gateway named")
		var l struct{ Timestamp time.Time }
		require.NoError(t, json.Unmarshal([]byte(fallbacks[0]), &l))
		assert.Less(t, l.Timestamp.Sub(cut), 10*time.Second, "failed within the stall timeout of the cut")
	}
	assert.Equal(t, 1.0, metricValue(t, g0, `jetway_concourse_p2p_streams_total{path="mesh",result="error"}`))
}

// TestConcourseP2PHonoursTheWebNodesLimit: a web node with
// --streaming-size-limitation adds its limit to each stream-in URL. A
// 16 MiB artifact past a 1 MB limit is refused on jetway's own p2p
// stream, naming the limit, as the web node's relay after it refuses it:
// the step errors, and the task never reads a byte of it.
func TestConcourseP2PHonoursTheWebNodesLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{Args: []string{"--streaming-size-limitation", "1"}})
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "p2p-la", "tags: [p2p-la]\n", "")
	placeTarget(ctx, t, clusters[1], dir, "p2p-lb", "tags: [p2p-lb]\n", "")
	g := startGateway(t, dir, gatewayOptions{concourse: concourseTSA(t, web), state: newState(t)})
	flyWorker(t, web, "p2p-la", time.Minute, workerIn("running"))
	flyWorker(t, web, "p2p-lb", time.Minute, workerIn("running"))

	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(p2pPipeline("p2p-la", "p2p-lb")))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "p2plimit", "-c", pipeline)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "p2plimit")
	fctx, fcancel := context.WithTimeout(ctx, 3*time.Minute)
	out, err := web.FlyContext(fctx, "trigger-job", "-j", "p2plimit/across", "--watch")
	fcancel()
	require.Error(t, err, out)
	assert.Contains(t, out, "errored")
	assert.NotContains(t, out, "made/blob: OK", "the task never ran on a partial input")

	fallbacks := p2pFallbacks(t, web)
	if assert.Len(t, fallbacks, 1) {
		assert.Contains(t, fallbacks[0], "past its limit of 1.000000 MB", "jetway's stream refused at the web node's limit")
	}
	assert.Equal(t, 1.0, metricValue(t, g, `jetway_concourse_p2p_streams_total{path="relay",result="error"}`))
}
