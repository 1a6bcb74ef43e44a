package integration

import (
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
	"github.com/jetway-ci/jetway/steps"
)

// exited waits for the agent to end of its own accord (retired, pruned),
// and requires that it ended well.
func (p *agentProcess) exited(t *testing.T) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "the agent's exit\n%s", p.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit")
	}
}

// servingAt is the address the agent's --listen serves on, from its log.
func (p *agentProcess) servingAt(t *testing.T) string {
	t.Helper()
	var addr string
	eventually(t, 10*time.Second, func() error {
		for _, line := range strings.Split(p.logs.String(), "\n") {
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "serving http" {
				addr = l.Addr
				return nil
			}
		}
		return errorf("the agent does not serve http yet")
	})
	return "http://" + addr
}

// waitUnlisted waits until g lists no worker name.
func waitUnlisted(t *testing.T, g *gateway, name string) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		if g.listed(t, name) {
			return errorf("worker %s still listed", name)
		}
		return nil
	})
}

// TestAgentLifecycle lands, prunes and retires a real agent through a
// gateway, as `fly land-worker`, `prune-worker` and `retire-worker` do: a
// landing agent waits for its running step and takes no new one; a
// running agent cannot be pruned; a landed one leaves the mesh and exits,
// and comes back landed; a killed (stalled) one is pruned by the gateway
// and comes back running when it joins again; a retired one deletes its
// steps' folders and its state, leaves and exits.
func TestAgentLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	member := meshMember(t, ca, ca, "life-gw", "127.0.0.1:0")
	member.stallAfter = 2 * time.Second
	g := startGateway(t, t.TempDir(), gatewayOptions{identity: "life-gw", mesh: member})
	caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "mac-life", time.Now().Add(time.Hour), meshtest.AgentURI)
	work := t.TempDir()
	args := []string{"--join", g.meshAddr, "--ca", caFile, "--cert", certFile, "--key", keyFile,
		"--work-dir", work, "--platform", "darwin", "--kill-grace", "1s", "--listen", "127.0.0.1:0"}
	ag := startAgent(t, args...)
	waitWorker(t, g, "mac-life", "running")

	// Its own listener: health, readiness (joined) and metrics; nothing
	// else without a token, which it has none of.
	own := ag.servingAt(t)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/api/v1/workers": 401, "/api/v1/steps/x": 401} {
		code, body, _ := call(t, http.MethodGet, own+path, "")
		assert.Equal(t, want, code, "%s: %s", path, body)
	}
	_, metrics, _ := call(t, http.MethodGet, own+"/metrics", "")
	assert.Contains(t, metrics, `jetway_mesh_peers{state="up"} 1`)
	assert.Contains(t, metrics, "process_cpu_seconds_total")
	worker := g.base + "/api/v1/workers/mac-life"
	onMac := api.PlacementRequest{Type: "task", Platform: "darwin"}

	// Landing: the running step goes on to its end; nothing new is placed.
	gate := filepath.Join(t.TempDir(), "go")
	wait := shStep("life-wait", `while [ ! -e `+gate+` ]; do sleep 0.02; done; echo done`)
	wait.Platform, wait.Image = "darwin", "" // a task for an agent needs no image
	g.run(t, wait)
	g.waitPhase(t, "life-wait", steps.Running)
	code, body, _ := call(t, http.MethodPut, worker+"/prune", "")
	assert.Equal(t, http.StatusBadRequest, code, "a running agent: %s", body)
	assert.JSONEq(t, `{"stderr":"cannot prune running worker"}`, body)
	code, body, _ = call(t, http.MethodPut, worker+"/land", "")
	require.Equal(t, http.StatusOK, code, body)
	waitWorker(t, g, "mac-life", "landing")
	_, p, _ := g.place(t, "", onMac)
	assert.Empty(t, p.Target, "a landing agent takes no step: %+v", p)
	assert.Contains(t, p.Rejected["mac-life"], "landing")
	writeFile(t, gate, nil)
	evs := g.stepEvents(ctx, t, "life-wait", "", 0)
	assert.Equal(t, "done\n", outputOf(evs, steps.EventStdout), "the running step ended as it would have")
	waitWorker(t, g, "mac-life", "landed")

	// Pruned while landed: it leaves and exits; restarted, it is landed.
	assert.Equal(t, "mesh", g.prune(t, "mac-life"))
	ag.exited(t)
	waitUnlisted(t, g, "mac-life")
	ag = startAgent(t, args...)
	waitWorker(t, g, "mac-life", "landed")
	code, body, _ = call(t, http.MethodPut, g.base+"/api/v1/targets/mac-life/resume", "")
	require.Equal(t, http.StatusOK, code, body)
	waitWorker(t, g, "mac-life", "running")
	_, p, _ = g.place(t, "", onMac)
	assert.Equal(t, "mac-life", p.Target)

	// Killed, it is stalled; the gateway prunes it; joining again, it runs.
	ag.kill(t)
	waitWorker(t, g, "mac-life", "stalled")
	assert.Equal(t, "mesh", g.prune(t, "mac-life"))
	assert.False(t, g.listed(t, "mac-life"), "forgotten at once")
	code, _, _ = call(t, http.MethodPut, worker+"/prune", "")
	assert.Equal(t, http.StatusNotFound, code)
	ag = startAgent(t, args...)
	waitWorker(t, g, "mac-life", "running")

	// Retired: its steps' folders and state go, it leaves and exits.
	require.DirExists(t, filepath.Join(work, "steps", g.step(t, "life-wait").Pod))
	code, body, _ = call(t, http.MethodPut, worker+"/retire", "")
	require.Equal(t, http.StatusOK, code, body)
	ag.exited(t)
	waitUnlisted(t, g, "mac-life")
	for _, f := range []string{"steps", "state.json"} {
		_, err := os.Stat(filepath.Join(work, f))
		assert.ErrorIs(t, err, os.ErrNotExist, "%s after retire", f)
	}
}
