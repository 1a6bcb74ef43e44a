package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cwn "github.com/jetway-ci/jetway/integration/concourse"
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
}

// assertNoP2PFallback asserts the web node relayed no volume after a p2p
// stream failed: its log has no p2pFallback, which it would show.
func assertNoP2PFallback(t *testing.T, web *cwn.WebNode) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(web.Dir, "web.log"))
	require.NoError(t, err)
	var fallbacks []string
	for line := range strings.Lines(string(log)) {
		if strings.Contains(line, p2pFallback) {
			fallbacks = append(fallbacks, line)
		}
	}
	assert.Empty(t, fallbacks, "the web node relayed volumes after p2p streams failed")
}
