package integration

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// waitChecks waits until g has run n more health checks than when called:
// the event after which a target that should stay hidden would be back.
func (g *gateway) waitChecks(t *testing.T, n float64) {
	t.Helper()
	const series = "jetway_target_checks_total"
	from := metricValue(t, g, series)
	eventually(t, 20*time.Second, func() error {
		if got := metricValue(t, g, series); got < from+n {
			return fmt.Errorf("%v of %v checks", got-from, n)
		}
		return nil
	})
}

// listed reports whether g lists the target, in /api/v1/workers and
// /api/v1/targets alike.
func (g *gateway) listed(t *testing.T, name string) bool {
	t.Helper()
	var workers []wire.Worker
	g.get(t, "/api/v1/workers", &workers)
	inWorkers := false
	for _, w := range workers {
		inWorkers = inWorkers || w.Name == name
	}
	_, inTargets := g.targetsByName(t)[name]
	require.Equal(t, inWorkers, inTargets, "both lists agree")
	return inTargets
}

// land waits for a target with no step pods to run, lands it and waits for
// it to be landed.
func (g *gateway) land(t *testing.T, name string) {
	t.Helper()
	g.waitTarget(t, name, 10*time.Second, running)
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/"+name+"/land", "")
	require.Equal(t, http.StatusOK, code, body)
	g.waitTarget(t, name, 10*time.Second, inState("landed"))
}

// prune prunes a target, expecting 200, and returns how far it reached.
func (g *gateway) prune(t *testing.T, name string) string {
	t.Helper()
	code, body, hdr := call(t, http.MethodPut, g.base+"/api/v1/workers/"+name+"/prune", "")
	require.Equal(t, http.StatusOK, code, body)
	return hdr.Get(api.PruneScopeHeader)
}

// rotate issues a new token for a target made by lifecycleTarget and
// writes its new kubeconfig, as a credential rotation would.
func rotate(ctx context.Context, t *testing.T, c *cluster.Cluster, tg *cluster.Target, dir string) {
	t.Helper()
	token, err := c.Token(ctx, tg.Namespace, tg.ServiceAccount, time.Hour)
	require.NoError(t, err)
	kc, err := c.Kubeconfig(tg.Namespace, token)
	require.NoError(t, err)
	writeFile(t, filepath.Join(dir, tg.Namespace+".kubeconfig"), kc)
}

// cli runs the gateway binary's CLI against g.
func (g *gateway) cli(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), append(args, "--url", g.base)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// TestPruneSticksUntilResumed prunes a landed target whose cluster
// answers: it stays out of every list on every replica, across checks and
// restarts, until `gateway resume` brings it back, running.
func TestPruneSticksUntilResumed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, dir := lifecycleTarget(ctx, t, clusters[0], "sticky")
	a := startGateway(t, dir, gatewayOptions{identity: "replica-a"})
	b := startGateway(t, dir, gatewayOptions{identity: "replica-b"})
	a.waitTarget(t, "sticky", 10*time.Second, running)

	code, body, _ := call(t, http.MethodPut, a.base+"/api/v1/workers/sticky/prune", "")
	assert.Equal(t, http.StatusBadRequest, code, "a running target is not pruned: %s", body)
	out := a.cli(ctx, t, "land", "sticky")
	assert.Equal(t, "landed 'sticky'\n", out)
	a.waitTarget(t, "sticky", 10*time.Second, inState("landed"))

	out = a.cli(ctx, t, "prune", "sticky")
	assert.Contains(t, out, "pruned 'sticky' (recorded in its cluster")
	assert.False(t, a.listed(t, "sticky"))
	a.waitChecks(t, 3)
	b.waitChecks(t, 3)
	assert.False(t, a.listed(t, "sticky"), "still pruned while its checks pass")
	assert.False(t, b.listed(t, "sticky"), "pruned on the other replica too")
	code, _, _ = call(t, http.MethodPut, a.base+"/api/v1/workers/sticky/land", "")
	assert.Equal(t, http.StatusNotFound, code, "a pruned worker is unknown to the worker API")

	a.stop()
	c := startGateway(t, dir, gatewayOptions{identity: "replica-restarted"})
	c.waitChecks(t, 3)
	assert.False(t, c.listed(t, "sticky"), "pruned across a restart")

	out = c.cli(ctx, t, "resume", "sticky")
	assert.Equal(t, "resumed 'sticky'\n", out)
	c.waitTarget(t, "sticky", 10*time.Second, running)
	b.waitTarget(t, "sticky", 10*time.Second, running)
	code, body, _ = call(t, http.MethodPut, c.base+"/api/v1/targets/sticky/resume", "")
	assert.Equal(t, http.StatusOK, code, "resuming a running target is a no-op: %s", body)
}

// TestPrunedTargetBackWithNewKubeconfig prunes a landed target, then
// rotates its credentials: it is listed again, still landed.
func TestPrunedTargetBackWithNewKubeconfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	tg, dir := lifecycleTarget(ctx, t, c, "rotated")
	g := startGateway(t, dir, gatewayOptions{})
	g.land(t, "rotated")
	assert.Equal(t, "installation", g.prune(t, "rotated"))
	assert.False(t, g.listed(t, "rotated"))

	rotate(ctx, t, c, tg, dir)
	g.waitTarget(t, "rotated", 10*time.Second, inState("landed"))
}

// TestPrunedUnreachableTargetReturnsAsItWas prunes a landed target whose
// API server is down: only this replica forgets it (the answer says so),
// and when the server is back it returns landed, not running.
func TestPrunedUnreachableTargetReturnsAsItWas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	_, dir := lifecycleTarget(ctx, t, c, "away")
	g := startGateway(t, dir, gatewayOptions{})
	g.land(t, "away")

	c.StopAPIServer()
	restarted := false
	defer func() {
		if !restarted {
			require.NoError(t, c.StartAPIServer(ctx))
		}
	}()
	g.waitTarget(t, "away", 10*time.Second, func(tg api.Target) bool { return strings.Contains(tg.Error, "unreachable") })
	assert.Equal(t, "replica", g.prune(t, "away"))
	assert.False(t, g.listed(t, "away"))

	require.NoError(t, c.StartAPIServer(ctx))
	restarted = true
	g.waitTarget(t, "away", 15*time.Second, inState("landed"))
}

// TestRefusedRecordIsNotAnOutage lands a target whose Role may not write
// ConfigMaps: the answer names the refusal, not an unreachable cluster.
func TestRefusedRecordIsNotAnOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var perms []targets.Permission
	for _, p := range targets.Required {
		if p.Resource != "configmaps" || p.Verb == "get" || p.Verb == "list" {
			perms = append(perms, p)
		}
	}
	tg, err := clusters[0].CreateTarget(ctx, cluster.TargetOptions{Namespace: "refused", Rules: targets.RBACRules(perms)})
	require.NoError(t, err)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "refused.kubeconfig"), tg.Kubeconfig)
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "refused", 10*time.Second, func(tg api.Target) bool { return len(tg.MissingPermissions) > 0 })

	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/refused/land", "")
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, body, "not allowed")
	assert.Contains(t, body, "forbidden")
	assert.NotContains(t, body, "cannot reach")
}
