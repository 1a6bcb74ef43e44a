package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// counts is what jetway's target list says of a target's step pods.
type counts struct{ containers, build, tasks, volumes int }

func (g *gateway) counts(t *testing.T, name string) counts {
	t.Helper()
	tg, ok := g.targetsByName(t)[name]
	require.True(t, ok, "target %s listed", name)
	return counts{tg.ActiveContainers, tg.BuildContainers, tg.ActiveTasks, tg.ActiveVolumes}
}

// workerCounts is what fly workers reads of them (no build containers).
func (g *gateway) workerCounts(t *testing.T, name string) counts {
	t.Helper()
	var workers []wire.Worker
	g.get(t, "/api/v1/workers", &workers)
	for _, w := range workers {
		if w.Name == name {
			return counts{containers: w.ActiveContainers, tasks: w.ActiveTasks, volumes: w.ActiveVolumes}
		}
	}
	t.Fatalf("worker %s not listed", name)
	return counts{}
}

// waitCounts waits until the target list and fly's worker list both show
// want, failing on any negative count seen on the way.
func (g *gateway) waitCounts(t *testing.T, name string, want counts, within time.Duration) {
	t.Helper()
	wantWorker := want
	wantWorker.build = 0
	eventually(t, within, func() error {
		got, worker := g.counts(t, name), g.workerCounts(t, name)
		for _, c := range []counts{got, worker} {
			require.True(t, c.containers >= 0 && c.build >= 0 && c.tasks >= 0 && c.volumes >= 0, "negative count %+v", c)
		}
		if got != want || worker != wantWorker {
			return fmt.Errorf("counts of %s: want %+v, have %+v (workers %+v)", name, want, got, worker)
		}
		return nil
	})
}

// TestCountsFollowStepPodsThroughARestart moves a target's counts with
// its step pods, then restarts its API server and changes the pods as soon
// as it is back: the watch resumes (or relists) and the counts follow.
func TestCountsFollowStepPodsThroughARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	_, dir := lifecycleTarget(ctx, t, c, "counts")
	g := startTargetsGateway(t, dir)
	g.waitTarget(t, "counts", 10*time.Second, running)
	g.waitCounts(t, "counts", counts{}, 5*time.Second)

	for name, typ := range map[string]string{"task-1": "task", "task-2": "task", "get-1": "get", "check-1": "check"} {
		typedStepPod(ctx, t, c, "counts", "counts", "jetway", name, typ)
	}
	g.waitCounts(t, "counts", counts{containers: 4, build: 3, tasks: 2, volumes: 4}, 5*time.Second)
	finish(ctx, t, c, "counts", "task-1", time.Now())
	g.waitCounts(t, "counts", counts{containers: 3, build: 2, tasks: 1, volumes: 4}, 5*time.Second)

	c.StopAPIServer()
	require.NoError(t, c.StartAPIServer(ctx))
	zero := int64(0)
	require.NoError(t, c.Client.CoreV1().Pods("counts").Delete(ctx, "check-1", metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	finish(ctx, t, c, "counts", "get-1", time.Now())
	typedStepPod(ctx, t, c, "counts", "counts", "jetway", "put-1", "put")
	g.waitCounts(t, "counts", counts{containers: 2, build: 2, tasks: 1, volumes: 4}, 20*time.Second)
	g.waitTarget(t, "counts", 20*time.Second, running)
}

// placeTarget prepares a namespace with jetway's permissions on c and puts
// it in dir as a folder holding its kubeconfig and target.yaml. An empty
// server keeps the cluster's; another (an address nothing answers) makes
// a target that never passes a check.
func placeTarget(ctx context.Context, t *testing.T, c *cluster.Cluster, dir, name, targetYAML, server string) {
	t.Helper()
	placeTargetGranting(ctx, t, c, dir, name, targetYAML, server, targets.Required)
}

// placeTargetGranting is placeTarget with the target's Role granting perms.
func placeTargetGranting(ctx context.Context, t *testing.T, c *cluster.Cluster, dir, name, targetYAML, server string, perms []targets.Permission) {
	t.Helper()
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: name, Rules: targets.RBACRules(perms)})
	require.NoError(t, err)
	releaseOnCleanup(t, c, name)
	kubeconfig := tg.Kubeconfig
	if server != "" {
		kc, err := clientcmd.Load(kubeconfig)
		require.NoError(t, err)
		for _, cl := range kc.Clusters {
			cl.Server = server
		}
		kubeconfig, err = clientcmd.Write(*kc)
		require.NoError(t, err)
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, name), 0o700))
	writeFile(t, filepath.Join(dir, name, "kubeconfig"), kubeconfig)
	writeFile(t, filepath.Join(dir, name, "target.yaml"), []byte(targetYAML))
}

// targetGateway places target name (with targetYAML) on c and starts a
// gateway with o owning it alone, returned once the target runs.
func targetGateway(ctx context.Context, t *testing.T, c *cluster.Cluster, name, targetYAML string, o gatewayOptions) *gateway {
	t.Helper()
	dir := t.TempDir()
	perms := targets.Required
	if o.claims {
		perms = append(slices.Clip(perms), targets.ClaimPermissions...)
	}
	if o.images {
		perms = append(slices.Clip(perms), targets.ImagePermissions...)
	}
	placeTargetGranting(ctx, t, c, dir, name, targetYAML, "", perms)
	g := startGateway(t, dir, o)
	g.waitTarget(t, name, 10*time.Second, running)
	return g
}

// place asks g where step would run, with token, and decodes the answer.
func (g *gateway) place(t *testing.T, token string, step api.PlacementRequest) (int, api.Placement, http.Header) {
	t.Helper()
	body, err := json.Marshal(step)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, g.base+"/api/v1/placements", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var p api.Placement
	if resp.StatusCode != http.StatusForbidden {
		require.NoError(t, json.Unmarshal(raw, &p), "%s", raw)
	}
	return resp.StatusCode, p, resp.Header
}

// TestPlacementFollowsTeamsTagsStatesAndCounts places steps over targets
// of two teams, a global one, a tagged one, a Windows one, a landed and a
// stalled one, on two clusters: each rule and each live count decides as
// Concourse would, every target that falls out says why, and a team token
// never learns of another team's target.
func TestPlacementFollowsTeamsTagsStatesAndCounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, tg := range []struct {
		c                  *cluster.Cluster
		name, yaml, server string
	}{
		{clusters[0], "pl-a", "team: main\n", ""},
		{clusters[1], "pl-b", "team: main\n", ""},
		{clusters[0], "pl-gpu", "team: main\ntags: [gpu]\nmaxActiveTasks: 1\n", ""},
		{clusters[1], "pl-global", "{}\n", ""},
		{clusters[0], "pl-other", "team: other\n", ""},
		{clusters[0], "pl-windows", "team: main\nplatform: windows\n", ""},
		{clusters[1], "pl-landed", "team: main\n", ""},
		{clusters[1], "pl-stalled", "team: main\n", "https://127.0.0.1:1"},
	} {
		placeTarget(ctx, t, tg.c, dir, tg.name, tg.yaml, tg.server)
	}
	g := startGateway(t, dir, gatewayOptions{tokens: []api.Token{adminToken, mainToken}})
	admin, main := adminToken.Token, mainToken.Token
	for _, name := range []string{"pl-a", "pl-b", "pl-gpu", "pl-global", "pl-other", "pl-windows", "pl-landed"} {
		g.waitTarget(t, name, 10*time.Second, running)
	}
	g.waitTarget(t, "pl-stalled", 10*time.Second, inState("stalled"))
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/pl-landed/land", admin)
	require.Equal(t, http.StatusOK, code, body)
	g.waitTarget(t, "pl-landed", 10*time.Second, inState("landed"))

	// Two running tasks on pl-a: fewest build containers picks pl-b.
	typedStepPod(ctx, t, clusters[0], "pl-a", "pl-a", "jetway", "a-task-1", "task")
	typedStepPod(ctx, t, clusters[0], "pl-a", "pl-a", "jetway", "a-task-2", "task")
	g.waitCounts(t, "pl-a", counts{containers: 2, build: 2, tasks: 2, volumes: 2}, 5*time.Second)
	task := api.PlacementRequest{Type: "task", Team: "main", Platform: "linux", Strategy: "fewest-build-containers"}
	code, p, _ := g.place(t, admin, task)
	require.Equal(t, http.StatusOK, code, "%+v", p)
	assert.Equal(t, "pl-b", p.Target)
	assert.Equal(t, []string{"pl-b", "pl-a"}, p.Order)
	assert.Equal(t, map[string]string{
		"pl-gpu":     "untagged step",
		"pl-global":  "global target; team targets preferred",
		"pl-other":   "team other",
		"pl-windows": "platform windows",
		"pl-landed":  "state landed",
		"pl-stalled": "state stalled",
	}, p.Rejected)
	out := g.cli(ctx, t, "place", "--team", "main", "--platform", "linux", "--strategy", "fewest-build-containers",
		"--token", admin)
	assert.Contains(t, out, "target: pl-b")
	assert.Regexp(t, `pl-a\s+main\s+none\s+linux\s+2\s+2\s+#2`, out, "the runner-up, with its live counts")
	assert.Regexp(t, `pl-gpu\s+main\s+gpu\s+linux\s+0\s+0\s+untagged step`, out)

	// The tasks end and three gets start on pl-b: the choice turns to pl-a.
	finish(ctx, t, clusters[0], "pl-a", "a-task-1", time.Now())
	finish(ctx, t, clusters[0], "pl-a", "a-task-2", time.Now())
	for _, name := range []string{"b-get-1", "b-get-2", "b-get-3"} {
		typedStepPod(ctx, t, clusters[1], "pl-b", "pl-b", "jetway", name, "get")
	}
	g.waitCounts(t, "pl-a", counts{volumes: 2}, 5*time.Second)
	g.waitCounts(t, "pl-b", counts{containers: 3, build: 3, volumes: 3}, 5*time.Second)
	code, p, _ = g.place(t, admin, task)
	require.Equal(t, http.StatusOK, code, "%+v", p)
	assert.Equal(t, []string{"pl-a", "pl-b"}, p.Order)

	// A gpu step goes to the one gpu target, until its own limit is reached.
	gpu := api.PlacementRequest{Type: "task", Team: "main", Tags: []string{"gpu"}, Strategy: "limit-active-tasks"}
	code, p, _ = g.place(t, main, gpu)
	require.Equal(t, http.StatusOK, code, "%+v", p)
	assert.Equal(t, "pl-gpu", p.Target)
	assert.Equal(t, "missing tags gpu", p.Rejected["pl-a"])
	typedStepPod(ctx, t, clusters[0], "pl-gpu", "pl-gpu", "jetway", "gpu-task", "task")
	g.waitCounts(t, "pl-gpu", counts{containers: 1, build: 1, tasks: 1, volumes: 1}, 5*time.Second)
	code, p, header := g.place(t, main, gpu)
	require.Equal(t, http.StatusServiceUnavailable, code, "%+v", p)
	assert.Equal(t, "5", header.Get("Retry-After"))
	assert.Equal(t, "at limit active-tasks 1/1", p.Rejected["pl-gpu"])

	// No target has a tpu: 422, every target the caller sees and why.
	code, p, _ = g.place(t, admin, api.PlacementRequest{Type: "task", Team: "main", Tags: []string{"tpu"}, Platform: "linux"})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%+v", p)
	assert.Equal(t, "no target satisfies team 'main', tags 'tpu', platform 'linux'", p.Error)
	assert.Len(t, p.Rejected, 8, "every target, the other team's too, for an admin")

	// A team token sees its team's targets and global ones, nothing else.
	code, p, _ = g.place(t, main, api.PlacementRequest{Type: "task", Team: "main", Tags: []string{"tpu"}})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%+v", p)
	assert.NotContains(t, p.Rejected, "pl-other")
	assert.Len(t, p.Rejected, 7)
	code, _, _ = g.place(t, main, api.PlacementRequest{Type: "task", Team: "other"})
	assert.Equal(t, http.StatusForbidden, code, "a team token places only for its team")
}
