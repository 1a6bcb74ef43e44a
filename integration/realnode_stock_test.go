package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// TestRealNodeStockWorker: a stock Concourse v8.2.5 worker (`concourse
// worker --runtime containerd`, the reference jetway is benchmarked
// against) registers through the same web node's TSA as a jetway target
// on the real node beside it; one pipeline runs its artifact job on each,
// by tags: a task writes 4 MiB into an output and the next reads and
// checks it, on the stock worker in a Garden container (its pid 1 is
// Concourse's init) with the busybox rootfs folder, on jetway in the
// node's busybox image. Once stopped, the stock worker leaves nothing on
// the machine: no bridge, no garden cgroup, no process or mount of its,
// no containerd socket, the nft tables as they were.
func TestRealNodeStockWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "stock-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	const name = "rn-stock"
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		targetYAML: "tags: [jetway]\n"})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	tablesBefore := nftTables(t)
	// Its baggageclaim listens on the node's bridge, its p2p URL there:
	// the node's pods reach it.
	stock := cwn.StockForTest(t, web, cwn.StockOptions{BaggageclaimBindIP: cluster.NodeIP, P2PInterface: cluster.NodeBridge})
	flyWorker(t, web, stock.Name, time.Minute, func(w wire.Worker, found bool) bool {
		return found && w.State == "running" && len(w.Tags) == 1 && w.Tags[0] == cwn.StockTag
	})

	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(cwn.ArtifactPipeline(4<<20,
		cwn.ArtifactJob{Name: "stock", Tags: []string{cwn.StockTag}, RootfsURI: "raw://" + stock.Rootfs},
		cwn.ArtifactJob{Name: "jetway", Tags: []string{"jetway"}, RootfsURI: "docker:///" + strings.TrimSuffix(cluster.BusyboxImage, ":1") + "#1"})))
	fly := func(args ...string) string {
		t.Helper()
		fctx, fcancel := context.WithTimeout(ctx, 3*time.Minute)
		defer fcancel()
		out, err := web.FlyContext(fctx, args...)
		require.NoError(t, err, out)
		return out
	}
	fly("set-pipeline", "-n", "-p", "artifacts", "-c", pipeline)
	fly("unpause-pipeline", "-p", "artifacts")
	for _, job := range []string{"stock", "jetway"} {
		out := fly("trigger-job", "-j", "artifacts/"+job, "--watch")
		assert.Contains(t, out, "made 4194304 bytes", job)
		assert.Contains(t, out, cwn.ArtifactMarker, job)
		assert.Contains(t, out, "succeeded", job)
		if job == "stock" {
			assert.Contains(t, out, "pid 1: /tmp/gdn-init", "a Garden container")
		} else {
			assert.NotContains(t, out, "gdn-init", "a pod")
		}
	}

	// One build across the two: what the stock worker's task makes (GNU
	// tar out of its baggageclaim: a hard link, a file of another owner
	// and mode) is the input of a task on jetway's worker, and what that
	// makes, alike, the input of a task back on the stock worker. The web
	// node tries each p2p first: jetway's holder pushes what the jetway
	// task made into the stock worker's baggageclaim itself; the stock
	// worker cannot reach jetway's p2p URL, and the web node relays that
	// one (docs/concourse.md).
	cross := filepath.Join(t.TempDir(), "cross.yml")
	writeFile(t, cross, []byte(`jobs:
- name: cross
  plan:
  - task: stock-makes
    tags: [`+cwn.StockTag+`]
    config:
      platform: linux
      rootfs_uri: raw://`+stock.Rootfs+`
      outputs: [{name: made}]
      run: {path: sh, args: [-c, '`+linkedFiles("made", "1234:2345")+`']}
  - task: jetway-checks
    tags: [jetway]
    config:
      platform: linux
      rootfs_uri: docker:///`+strings.TrimSuffix(cluster.BusyboxImage, ":1")+`#1
      inputs: [{name: made}]
      outputs: [{name: back}]
      run: {path: sh, args: [-c, '`+checkLinkedFiles("made", "1234:2345")+` && `+linkedFiles("back", "4321:5432")+`']}
  - task: stock-checks
    tags: [`+cwn.StockTag+`]
    config:
      platform: linux
      rootfs_uri: raw://`+stock.Rootfs+`
      inputs: [{name: back}]
      run: {path: sh, args: [-c, '`+checkLinkedFiles("back", "4321:5432")+`']}
`))
	fly("set-pipeline", "-n", "-p", "cross", "-c", cross)
	fly("unpause-pipeline", "-p", "cross")
	out := fly("trigger-job", "-j", "cross/cross", "--watch")
	for _, dir := range []string{"made", "back"} {
		assert.Contains(t, out, dir+"/d/a: OK\r\n", "the content, across")
		assert.Contains(t, out, dir+": linked\r\n", "the hard link, across")
	}
	assert.Contains(t, out, "made: 1234:2345 600\r\n", "owner and mode, stock to jetway")
	assert.Contains(t, out, "back: 4321:5432 600\r\n", "owner and mode, jetway to stock")
	assert.Contains(t, out, "succeeded")
	assert.Equal(t, 1.0, metricValue(t, g, `jetway_concourse_p2p_streams_total{path="push",result="ok"}`),
		"jetway pushed back into the stock worker")
	fallbacks := p2pFallbacks(t, web)
	if assert.Len(t, fallbacks, 1, "the web node relayed only stock to jetway") {
		assert.Contains(t, fallbacks[0], `"src-worker":"`+stock.Name+`"`)
		assert.Contains(t, fallbacks[0], "jetway-p2p.invalid", "the stock worker could not resolve jetway's p2p URL")
	}

	stock.Stop()
	for _, h := range cluster.CgroupHierarchies() {
		assert.NoDirExists(t, filepath.Join(h, "garden"))
	}
	assert.Error(t, exec.Command("ip", "link", "show", cwn.StockBridge).Run(), "the bridge is gone")
	assert.NoFileExists(t, cwn.StockSocket)
	assert.NoDirExists(t, "/var/lib/cni/networks/concourse")
	assert.Equal(t, tablesBefore, nftTables(t), "nft tables")
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), stock.Dir)
	assert.NotContains(t, string(mounts), "/run/containerd/io.containerd.runtime")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		assert.False(t, strings.Contains(cmd, cwn.StockSocket) || strings.Contains(cmd, stock.Dir), "left running: %s", cmd)
	}
}

// nftTables is `nft -s list ruleset` (no counters): the rules of every
// table, a table by its rules, sorted; but the real node's kube-proxy's
// (its KUBE-* chains and the rules that jump to them), which it writes as
// the node's Services change whatever the stock worker does, and tables
// left with no rule (kube-proxy's, which the stock worker's teardown may
// take with its own).
func nftTables(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "-s", "list", "ruleset").Output()
	require.NoError(t, err)
	var tables []string
	var table, rules []string
	inKube := false
	flush := func() {
		if len(rules) > 0 {
			tables = append(tables, strings.Join(append(table, rules...), "\n"))
		}
		table, rules = nil, nil
	}
	for line := range strings.Lines(string(out)) {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "table "):
			flush()
			table = []string{trimmed}
		case strings.HasPrefix(trimmed, "chain KUBE-"):
			inKube = true
		case inKube:
			inKube = trimmed != "}"
		case trimmed == "" || trimmed == "}" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "chain ") ||
			strings.HasPrefix(trimmed, "type ") || strings.Contains(line, "KUBE-"):
		default:
			rules = append(rules, trimmed)
		}
	}
	flush()
	slices.Sort(tables)
	return strings.Join(tables, "\n")
}

// linkedFiles is a shell command writing into dir a random file of owner
// (uid:gid) and mode 0600, a hard link to it, and their sum.
func linkedFiles(dir, owner string) string {
	return "mkdir " + dir + "/d && head -c 1048576 /dev/urandom > " + dir + "/d/a && ln " + dir + "/d/a " + dir + "/d/b && " +
		"chown " + owner + " " + dir + "/d/a && chmod 0600 " + dir + "/d/a && sha256sum " + dir + "/d/a > " + dir + "/sums"
}

// checkLinkedFiles is a shell command checking what linkedFiles wrote
// into dir: it prints "<dir>: linked", the owner and mode, and the sum's
// check.
func checkLinkedFiles(dir, owner string) string {
	return "[ \"$(stat -c %i " + dir + "/d/a)\" = \"$(stat -c %i " + dir + "/d/b)\" ] && echo " + dir + ": linked; " +
		"echo " + dir + ": $(stat -c \"%u:%g %a\" " + dir + "/d/a) && sha256sum -c " + dir + "/sums"
}
