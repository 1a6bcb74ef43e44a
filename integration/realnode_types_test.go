package integration

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// TestRealNodeConcourseUniqueVersionHistory: a base resource type
// declared with unique_version_history, as a stock worker's
// resource_metadata.json declares the time resource, reaches an
// unmodified web node, which then keeps a version history per resource:
// with global resources on, two resources of such a type with the same
// source get versions of their own, where two of a type without it share
// theirs.
func TestRealNodeConcourseUniqueVersionHistory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "rn-uvh"
	// Global resources: resources of one type and source share their
	// versions, but for a type with unique_version_history (without it,
	// every resource has its own history anyway).
	web, _ := testTypeWorkerOnNode(ctx, t, name, cwn.Options{Args: []string{"--enable-global-resources"}}, gatewayOptions{},
		wire.ResourceType{Type: "shared", Version: "1.0"}, wire.ResourceType{Type: "unique", Version: "1.0", UniqueVersionHistory: true})
	w := flyWorker(t, web, name, time.Minute, workerIn("running"))
	i := slices.IndexFunc(w.ResourceTypes, func(rt wire.ResourceType) bool { return rt.Type == "unique" })
	require.GreaterOrEqual(t, i, 0, "the web node lists the type: %v", w.ResourceTypes)
	assert.True(t, w.ResourceTypes[i].UniqueVersionHistory)

	fly := mustFly(ctx, t, web)
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(`resources:
- {name: s1, type: shared, source: {uri: git://repo}}
- {name: s2, type: shared, source: {uri: git://repo}}
- {name: u1, type: unique, source: {uri: git://repo}}
- {name: u2, type: unique, source: {uri: git://repo}}
jobs:
- name: j
  plan: [{get: s1}, {get: s2}, {get: u1}, {get: u2}]
`))
	fly("set-pipeline", "-n", "-p", "uvh", "-c", pipeline)
	fly("unpause-pipeline", "-p", "uvh")
	versions := map[string][]int{}
	for _, r := range []string{"s1", "s2", "u1", "u2"} {
		fly("check-resource", "-r", "uvh/"+r)
		var vs []struct {
			ID      int               `json:"id"`
			Version map[string]string `json:"version"`
		}
		out := fly("resource-versions", "-r", "uvh/"+r, "--json")
		require.NoError(t, json.Unmarshal([]byte(out), &vs), out)
		require.Len(t, vs, 2, "%s: the check's two versions: %s", r, out)
		for _, v := range vs {
			versions[r] = append(versions[r], v.ID)
		}
		slices.Sort(versions[r])
	}
	assert.Equal(t, versions["s1"], versions["s2"], "a type without unique_version_history: one history for one source")
	for _, id := range versions["u1"] {
		assert.NotContains(t, versions["u2"], id, "unique_version_history: a history per resource")
	}
}

// TestRealNodeConcourseResourceCerts: a target whose target.yaml names a
// ConfigMap of CA certificates (concourse.certs) registers a certs_path,
// as a stock worker with --certs-dir does, and the web node gives its
// resource containers the ConfigMap's files at /etc/ssl/certs: a check
// reads them there. A task gets none, as on a stock worker. The check's
// pod asks for the check requests, the task's for a step's.
func TestRealNodeConcourseResourceCerts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "rn-certs"
	web, _ := testTypeWorkerOnNode(ctx, t, name, cwn.Options{}, gatewayOptions{targetYAML: "concourse: {certs: ci-ca}\n", stepDefaults: gatewayDefaults},
		wire.ResourceType{Type: "test", Version: "1.0"})
	pods := startRealNode(t).Client.CoreV1().Pods(name)
	_, err := startRealNode(t).Client.CoreV1().ConfigMaps(name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ci-ca"},
		Data: map[string]string{"ca-certificates.crt": "-----BEGIN CERTIFICATE-----jetway-test-ca-----END CERTIFICATE-----"}},
		metav1.CreateOptions{})
	require.NoError(t, err)
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	fly := mustFly(ctx, t, web)
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	// check_every never: the web node's own check on unpause would race
	// fly's, and a check that finds the resource checked since its build
	// was made runs nothing (check_step.go's WaitToRun): no output.
	writeFile(t, pipeline, []byte("resources:\n- {name: r, type: test, check_every: never, source: {uri: show-certs}}\n"+
		"jobs:\n- name: j\n  plan: [{get: r}]\n"))
	fly("set-pipeline", "-n", "-p", "certs", "-c", pipeline)
	fly("unpause-pipeline", "-p", "certs")
	out := fly("check-resource", "-r", "certs/r")
	assert.Contains(t, out, "cert file /etc/ssl/certs/ca-certificates.crt: -----BEGIN CERTIFICATE-----jetway-test-ca-----END CERTIFICATE-----")
	assert.Contains(t, out, "succeeded")
	containers := func() map[string]corev1.ResourceList {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
		require.NoError(t, err)
		out := map[string]corev1.ResourceList{}
		for _, p := range list.Items {
			out[p.Name] = p.Spec.Containers[0].Resources.Requests
		}
		return out
	}
	checks := containers()
	require.Len(t, checks, 1, "the check's container")
	for _, req := range checks {
		assert.Equal(t, "10m", req.Cpu().String(), "a check's pod asks for the check requests")
		assert.Equal(t, "32Mi", req.Memory().String())
	}

	task := filepath.Join(t.TempDir(), "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\n"+
		"run: {path: sh, args: [-c, 'ls /etc/ssl/certs 2>&1 || true; echo listed']}\n"))
	out = fly("execute", "-c", task)
	assert.NotContains(t, out, "ca-certificates.crt", "a task gets no CA certificates, as on a stock worker")
	assert.Contains(t, out, "listed")
	tasks := 0
	for pod, req := range containers() {
		if _, ok := checks[pod]; !ok {
			tasks++
			assert.Equal(t, "100m", req.Cpu().String(), "a task's pod asks for a step's requests")
			assert.Equal(t, "256Mi", req.Memory().String())
		}
	}
	assert.Equal(t, 1, tasks, "the task's container")
}

// testTypeWorkerOnNode starts a web node (webOpts, with a client for the
// gateway) and a gateway (o) registering target name on the real node,
// whose base resource types are types, each run in the node's busybox
// image, which holds the test resource type's scripts in /opt/resource.
func testTypeWorkerOnNode(ctx context.Context, t *testing.T, name string, webOpts cwn.Options, o gatewayOptions,
	types ...wire.ResourceType) (*cwn.WebNode, *gateway) {
	t.Helper()
	rn := startRealNode(t)
	client := cwn.Client{ID: "jetway", Secret: name + "-s3cret"}
	webOpts.Clients = append(webOpts.Clients, client)
	web := cwn.ForTest(t, webOpts)
	for i := range types {
		types[i].Image = rn.NodeImage("busybox-image.tar")
	}
	o.concourse, o.state, o.resourceTypes = concourseREST(t, web, client, 2*time.Second), newState(t), types
	return web, nodeGateway(ctx, t, name, o)
}

// mustFly is fly against web, each call within two minutes, failing t if
// it fails.
func mustFly(ctx context.Context, t *testing.T, web *cwn.WebNode) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		fctx, fcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer fcancel()
		out, err := web.FlyContext(fctx, args...)
		require.NoError(t, err, out)
		return out
	}
}
