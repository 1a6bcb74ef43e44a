package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// lifecycleTarget prepares a namespace with jetway's permissions and a
// targets directory holding its kubeconfig as <name>.kubeconfig.
func lifecycleTarget(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) (*cluster.Target, string) {
	t.Helper()
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: name, Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, name+".kubeconfig"), tg.Kubeconfig)
	return tg, dir
}

// stepPod creates a pod as jetway would for a step on target (ownership
// labels of installation), and waits for it to run.
func stepPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, target, installation, name string) {
	t.Helper()
	typedStepPod(ctx, t, c, ns, target, installation, name, "")
}

// typedStepPod is stepPod for a step of type typ (task, get, put, check;
// no label when ""), with one emptyDir volume.
func typedStepPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, target, installation, name, typ string) {
	t.Helper()
	labels := ownership.Labels(target, installation)
	if typ != "" {
		labels[targets.StepTypeLabel] = typ
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: jetwayAnnotations(target, name, "")},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: "example.invalid/step"}},
			Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
	}
	createJetwayPod(ctx, t, c, target, pod)
	waitRunning(ctx, t, c.Client, ns, name)
}

// finish marks a pod's step done, as its kubelet would.
func finish(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string, at time.Time) {
	t.Helper()
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "step", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: metav1.NewTime(at)}}}}
	_, err = c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// call sends a bodiless request with an optional bearer token.
func call(t *testing.T, method, url, token string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func inState(state string) func(api.Target) bool {
	return func(tg api.Target) bool { return tg.State == state }
}

func metricValue(t *testing.T, g *gateway, series string) float64 {
	t.Helper()
	return seriesValue(scrape(t, g.reg), series)
}

// seriesValue is the value of series in a scrape, 0 when it is absent.
func seriesValue(scrape, series string) float64 {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscanf(v, "%g", &f)
			return f
		}
	}
	return 0
}

// TestLandSurvivesRestartAndLands lands a target with a running step pod:
// it is landing (and says which pod holds it once the land timeout
// passes), stays landing across a gateway restart, and becomes landed when
// the pod finishes.
func TestLandSurvivesRestartAndLands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	_, dir := lifecycleTarget(ctx, t, c, "land")
	g := startGateway(t, dir, gatewayOptions{landTimeout: time.Second})
	g.waitTarget(t, "land", 10*time.Second, running)
	stepPod(ctx, t, c, "land", "land", "jetway", "step-1")

	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/land/land", "")
	require.Equal(t, http.StatusOK, code, body)
	tg := g.waitTarget(t, "land", 5*time.Second, inState("landing"))
	assert.Equal(t, []string{"step-1"}, g.waitTarget(t, "land", 5*time.Second,
		func(tg api.Target) bool { return len(tg.Holding) == 1 }).Holding)
	tg = g.waitTarget(t, "land", 5*time.Second, func(tg api.Target) bool { return strings.Contains(tg.Error, "waiting for step pods step-1") })
	assert.Contains(t, tg.Error, "still landing since")
	assert.Eventually(t, func() bool {
		return strings.Contains(g.logs.String(), "landing is taking longer than the land timeout")
	},
		5*time.Second, 50*time.Millisecond, "logged at the check after the land timeout")

	g.stop()
	g2 := startGateway(t, dir, gatewayOptions{identity: "replica-restarted"})
	g2.waitTarget(t, "land", 10*time.Second, inState("landing"))

	finish(ctx, t, c, "land", "step-1", time.Now())
	g2.waitTarget(t, "land", 10*time.Second, inState("landed"))
	var workers []wire.Worker
	g2.get(t, "/api/v1/workers", &workers)
	require.Len(t, workers, 1)
	assert.Equal(t, "landed", workers[0].State)

	code, _, _ = call(t, http.MethodPut, g2.base+"/api/v1/workers/land/land", "")
	assert.Equal(t, http.StatusOK, code, "landing a landed worker is a no-op")
}

// TestTwoReplicasAgreeAndActOnce runs two gateways on one targets
// directory: both see the same lifecycle, and exactly one of them performs
// each transition and each garbage collection.
func TestTwoReplicasAgreeAndActOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	_, dir := lifecycleTarget(ctx, t, c, "replicas")
	a := startGateway(t, dir, gatewayOptions{identity: "replica-a", gcGrace: time.Second})
	b := startGateway(t, dir, gatewayOptions{identity: "replica-b", gcGrace: time.Second})
	a.waitTarget(t, "replicas", 10*time.Second, running)
	b.waitTarget(t, "replicas", 10*time.Second, running)
	stepPod(ctx, t, c, "replicas", "replicas", "jetway", "busy")

	code, body, _ := call(t, http.MethodPut, a.base+"/api/v1/workers/replicas/land", "")
	require.Equal(t, http.StatusOK, code, body)
	b.waitTarget(t, "replicas", 5*time.Second, inState("landing"))

	finish(ctx, t, c, "replicas", "busy", time.Now())
	a.waitTarget(t, "replicas", 15*time.Second, inState("landed"))
	b.waitTarget(t, "replicas", 15*time.Second, inState("landed"))
	landed := `jetway_lifecycle_transitions_total{state="landed"}`
	assert.Equal(t, 1.0, metricValue(t, a, landed)+metricValue(t, b, landed), "one replica landed it")

	// The finished pod outlives gc-grace: one replica deletes it.
	eventually(t, 20*time.Second, func() error {
		pods, err := c.Client.CoreV1().Pods("replicas").List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) > 0 {
			return fmt.Errorf("pods left: %v %v", len(pods.Items), err)
		}
		return nil
	})
	// The pod can be gone (kwok deletes it at once) a moment before the
	// replica that deleted it counts it.
	gc := `jetway_step_pods_deleted_total{reason="gc"}`
	eventually(t, 5*time.Second, func() error {
		if n := metricValue(t, a, gc) + metricValue(t, b, gc); n != 1 {
			return fmt.Errorf("%v replicas collected it, want one", n)
		}
		return nil
	})
}

// TestRetireRemovesOnlyOwnObjects retires a target whose namespace also
// holds another installation's and unlabelled objects: only jetway's own
// go, nothing of theirs, verified by listing from the API server.
func TestRetireRemovesOnlyOwnObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	tg, dir := lifecycleTarget(ctx, t, c, "retire")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "retire", 10*time.Second, running)

	stepPod(ctx, t, c, "retire", "retire", "jetway", "running-step")
	stepPod(ctx, t, c, "retire", "retire", "jetway", "done-step")
	finish(ctx, t, c, "retire", "done-step", time.Now())
	stepPod(ctx, t, c, "retire", "retire", "other-install", "their-step")
	_, err := c.Client.CoreV1().Pods("retire").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled", Namespace: "retire"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "example.invalid/x"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for name, labels := range map[string]map[string]string{
		"ours":       ownership.Labels("retire", "jetway"),
		"theirs":     ownership.Labels("retire", "other-install"),
		"unlabelled": nil,
	} {
		_, err := c.Client.CoreV1().ConfigMaps("retire").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "retire", Labels: labels}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err = c.Client.CoordinationV1().Leases("retire").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "ours", Namespace: "retire", Labels: ownership.Labels("retire", "jetway")}}, metav1.CreateOptions{})
	require.NoError(t, err)

	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/retire/retire", "")
	require.Equal(t, http.StatusOK, code, body)
	g.waitTarget(t, "retire", 5*time.Second, inState("retiring"))
	tgt := g.waitTarget(t, "retire", 5*time.Second, func(tg api.Target) bool { return len(tg.Holding) > 0 })
	assert.Equal(t, []string{"running-step"}, tgt.Holding, "running step pods finish first")

	finish(ctx, t, c, "retire", "running-step", time.Now())
	eventually(t, 15*time.Second, func() error {
		if _, ok := g.targetsByName(t)["retire"]; ok {
			return fmt.Errorf("retired target still listed")
		}
		return nil
	})

	sel := metav1.ListOptions{LabelSelector: ownership.Selector("retire", "jetway")}
	pods, err := c.Client.CoreV1().Pods("retire").List(ctx, sel)
	require.NoError(t, err)
	assert.Empty(t, pods.Items, "no jetway pods left")
	cms, err := c.Client.CoreV1().ConfigMaps("retire").List(ctx, sel)
	require.NoError(t, err)
	require.Len(t, cms.Items, 1, "only the record that says it is retired")
	assert.Equal(t, "retired", cms.Items[0].Data["state"])
	eventually(t, 10*time.Second, func() error {
		leases, err := c.Client.CoordinationV1().Leases("retire").List(ctx, sel)
		if err != nil || len(leases.Items) > 0 {
			return fmt.Errorf("leases left: %d %v", len(leases.Items), err)
		}
		return nil
	})
	for _, name := range []string{"their-step", "unlabelled"} {
		_, err := c.Client.CoreV1().Pods("retire").Get(ctx, name, metav1.GetOptions{})
		assert.NoError(t, err, "pod %s left alone", name)
	}
	for _, name := range []string{"theirs", "unlabelled"} {
		_, err := c.Client.CoreV1().ConfigMaps("retire").Get(ctx, name, metav1.GetOptions{})
		assert.NoError(t, err, "configmap %s left alone", name)
	}

	// Forgotten across restarts while the kubeconfig is unchanged...
	g.stop()
	g2 := startGateway(t, dir, gatewayOptions{identity: "after-retire"})
	g2.waitChecks(t, 3) // it would be listed by now
	var workers []wire.Worker
	g2.get(t, "/api/v1/workers", &workers)
	assert.Empty(t, workers)
	// ...and back as new with a changed one.
	rotate(ctx, t, c, tg, dir)
	g2.waitTarget(t, "retire", 10*time.Second, running)
}

// TestAPIAsFlyDrivesIt drives the worker endpoints with the requests a
// released fly sends (GET /api/v1/info first, bearer token on every call)
// and checks Concourse's status codes and bodies, team scoping included.
func TestAPIAsFlyDrivesIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	_, dir := lifecycleTarget(ctx, t, c, "fly-global")
	team, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "fly-main", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	writeFile(t, filepath.Join(dir, "fly-main", "kubeconfig"), team.Kubeconfig)
	writeFile(t, filepath.Join(dir, "fly-main", "target.yaml"), []byte("team: main\n"))
	g := startGateway(t, dir, gatewayOptions{tokens: []api.Token{adminToken, mainToken}})
	eventually(t, 10*time.Second, func() error {
		for _, name := range []string{"fly-global", "fly-main"} {
			_, body, _ := call(t, http.MethodGet, g.base+"/api/v1/targets/"+name, adminToken.Token)
			if !strings.Contains(body, `"state":"running"`) {
				return fmt.Errorf("%s: %s", name, body)
			}
		}
		return nil
	})

	fly := func(method, path, token string) (int, string, http.Header) {
		code, body, _ := call(t, http.MethodGet, g.base+"/api/v1/info", "")
		require.Equal(t, http.StatusOK, code, "fly checks the server version first")
		var info map[string]string
		require.NoError(t, json.Unmarshal([]byte(body), &info))
		require.Equal(t, "8.2.5", info["version"])
		return call(t, method, g.base+path, token)
	}

	code, _, _ := fly(http.MethodGet, "/api/v1/workers", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = fly(http.MethodPut, "/api/v1/workers/fly-global/land", "")
	assert.Equal(t, http.StatusUnauthorized, code)

	code, _, _ = fly(http.MethodPut, "/api/v1/workers/fly-global/land", mainToken.Token)
	assert.Equal(t, http.StatusForbidden, code, "a team token cannot land a global worker")
	code, _, _ = fly(http.MethodPut, "/api/v1/workers/nope/land", adminToken.Token)
	assert.Equal(t, http.StatusNotFound, code)

	code, body, hdr := fly(http.MethodPut, "/api/v1/workers/fly-main/prune", mainToken.Token)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	assert.JSONEq(t, `{"stderr":"cannot prune running worker"}`, body)

	code, body, _ = fly(http.MethodPut, "/api/v1/workers/fly-main/land", mainToken.Token)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Empty(t, body)
	// No step pods: landing becomes landed at the next reconcile.
	eventually(t, 5*time.Second, func() error {
		code, body, _ := fly(http.MethodGet, "/api/v1/workers", mainToken.Token)
		var workers []wire.Worker
		if err := json.Unmarshal([]byte(body), &workers); err != nil || code != http.StatusOK {
			return fmt.Errorf("%d %s", code, body)
		}
		states := map[string]string{}
		for _, w := range workers {
			states[w.Name] = w.State
		}
		if fmt.Sprint(states) != "map[fly-global:running fly-main:landed]" {
			return fmt.Errorf("states %v", states)
		}
		return nil
	})

	code, body, _ = fly(http.MethodPut, "/api/v1/workers/fly-main/prune", mainToken.Token)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Empty(t, body, "prune answers 200 with an empty body")
	code, _, _ = fly(http.MethodGet, "/api/v1/targets/fly-main", adminToken.Token)
	assert.Equal(t, http.StatusNotFound, code, "pruned")
}

// TestPruneUnreachableAndSync prunes a target whose API server is down
// (prune needs no access to it), sees it come back when its health
// succeeds, and syncs its step pods.
func TestPruneUnreachableAndSync(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	_, dir := lifecycleTarget(ctx, t, c, "prune")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "prune", 10*time.Second, running)

	for _, name := range []string{"keep", "drop-1", "drop-2"} {
		stepPod(ctx, t, c, "prune", "prune", "jetway", name)
	}
	req, err := http.NewRequest(http.MethodPut, g.base+"/api/v1/targets/prune/sync", strings.NewReader(`{"handles": ["keep", "not-here"]}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var synced struct{ Deleted []string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&synced))
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.ElementsMatch(t, []string{"drop-1", "drop-2"}, synced.Deleted)
	eventually(t, 10*time.Second, func() error {
		pods, err := c.Client.CoreV1().Pods("prune").List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "keep" {
			return fmt.Errorf("pods: %v %v", pods, err)
		}
		return nil
	})
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/targets/prune/sync", "")
	assert.Equal(t, http.StatusBadRequest, code, body)

	c.StopAPIServer()
	g.waitTarget(t, "prune", 10*time.Second, inState("stalled"))
	code, body, _ = call(t, http.MethodPut, g.base+"/api/v1/workers/prune/prune", "")
	require.Equal(t, http.StatusOK, code, body)
	_, ok := g.targetsByName(t)["prune"]
	assert.False(t, ok, "pruned target is forgotten")

	require.NoError(t, c.StartAPIServer(ctx))
	g.waitTarget(t, "prune", 15*time.Second, running)
}

// TestForeignRecordIsLeftAlone puts an unlabelled ConfigMap where jetway
// keeps a target's record: land refuses, the target says why, and the
// ConfigMap is unchanged.
func TestForeignRecordIsLeftAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := clusters[0]
	_, dir := lifecycleTarget(ctx, t, c, "foreign")
	foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "jetway-jetway-foreign", Namespace: "foreign"},
		Data: map[string]string{"state": "someone else's"}}
	_, err := c.Client.CoreV1().ConfigMaps("foreign").Create(ctx, foreign, metav1.CreateOptions{})
	require.NoError(t, err)
	g := startGateway(t, dir, gatewayOptions{})
	tg := g.waitTarget(t, "foreign", 10*time.Second, func(tg api.Target) bool { return strings.Contains(tg.Error, "lifecycle:") })
	assert.Contains(t, tg.Error, "configmap foreign/jetway-jetway-foreign exists without this installation's ownership labels")

	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/foreign/land", "")
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "ownership labels")
	assert.NotContains(t, body, "cannot reach")
	got, err := c.Client.CoreV1().ConfigMaps("foreign").Get(ctx, foreign.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, foreign.Data, got.Data)
	assert.Empty(t, got.Labels)
}
