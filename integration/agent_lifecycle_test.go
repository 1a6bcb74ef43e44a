package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
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
	"github.com/jetway-ci/jetway/wire"
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
	ag := joinAgent(t, g, ca, "mac-life", "--platform", "darwin", "--kill-grace", "1s", "--listen", "127.0.0.1:0")
	work := ag.work

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
	g.waitPhase(t, "life-wait", wire.Running)
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
	assert.Equal(t, "done\n", outputOf(evs, wire.EventStdout), "the running step ended as it would have")
	waitWorker(t, g, "mac-life", "landed")

	// Pruned while landed: it leaves and exits; restarted, it is landed.
	assert.Equal(t, "mesh", g.prune(t, "mac-life"))
	ag.exited(t)
	waitUnlisted(t, g, "mac-life")
	ag.restart(t)
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
	ag.restart(t)
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

// TestAgentSurvivesADroppedTunnel cuts the agent's tunnel to its gateway in
// the middle of a step, as a network blip would: the agent dials again,
// and the step's events, followed through the gateway and resumed from
// where the reader was, are complete and in order; the process ran once.
func TestAgentSurvivesADroppedTunnel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	member := meshMember(t, ca, ca, "blip-gw", "127.0.0.1:0")
	g := startGateway(t, t.TempDir(), gatewayOptions{identity: "blip-gw", mesh: member})
	proxy := startCutProxy(t, g.meshAddr)
	caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "mac-blip", time.Now().Add(time.Hour), meshtest.AgentURIs("")...)
	work := t.TempDir()
	ag := startAgent(t, "--join", proxy.ln.Addr().String(), "--ca", caFile, "--cert", certFile, "--key", keyFile,
		"--work-dir", work, "--platform", "darwin")
	waitWorker(t, g, "mac-blip", "running")

	const lines = 60
	long := longStep("blip", lines)
	long.Platform = "darwin"
	g.run(t, long)
	g.waitEvents(t, "blip", 8)
	proxy.Cut()
	evs := followResumed(ctx, t, g, "blip")
	v := g.step(t, "blip")
	assert.Equal(t, wire.Failed, v.Phase)
	assert.Equal(t, []string{"placed", "started", "exited"}, types(evs))
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	assert.Equal(t, want.String(), outputOf(evs, wire.EventStdout), "every line once, in order")
	for i, e := range evs {
		require.Equal(t, i, e.N)
	}
	runs, err := os.ReadFile(filepath.Join(work, "steps", v.Pod, "build", "out", "runs"))
	require.NoError(t, err)
	assert.Equal(t, "run\n", string(runs), "the process ran once")
	eventually(t, 30*time.Second, func() error {
		if n := strings.Count(ag.logs.String(), `"msg":"mesh peer joined"`); n < 2 {
			return errorf("the agent joined %d time(s): the tunnel was not cut and dialed again", n)
		}
		return nil
	})
}

// followResumed follows a step's events through g to its end as a client
// that loses its stream does: asking again from the next event it lacks.
func followResumed(ctx context.Context, t *testing.T, g *gateway, handle string) []wire.Event {
	t.Helper()
	var evs []wire.Event
	eventually(t, 60*time.Second, func() error {
		url := fmt.Sprintf("%s/api/v1/steps/%s/events?since=%d", g.base, handle, len(evs))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errorf("events: %s", resp.Status)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e wire.Event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				break // a line cut short
			}
			evs = append(evs, e)
		}
		if n := len(evs); n > 0 && evs[n-1].Phase.Final() {
			return nil
		}
		return errorf("the stream ended after %d events, the step's end not among them", len(evs))
	})
	return evs
}

// TestAnAgentDyingMidStreamFailsTheInputLoudly: a cluster task's input is
// the output of a task on an agent; the agent is killed while the bytes
// flow. The cluster task ends errored, naming its input and the agent,
// and its process never starts.
func TestAnAgentDyingMidStreamFailsTheInputLoudly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "die-cluster", "", "")
	member := meshMember(t, ca, ca, "die-gw", "127.0.0.1:0")
	g := startGateway(t, dir, gatewayOptions{identity: "die-gw", mesh: member})
	ag := joinAgent(t, g, ca, "mac-die", "--platform", "darwin")

	blob := shStep("die-make", `head -c 500000000 /dev/urandom > out/blob`)
	blob.Platform, blob.Image = "darwin", ""
	blob.Outputs = []wire.Output{{Name: "out"}}
	runEvents(ctx, t, g, blob, "mac-die")
	use := shStep("die-use", `echo ran`)
	use.Platform = "linux" // else it goes where its input is, the agent
	use.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "die-make", Output: "out"}}}
	g.run(t, use)
	eventually(t, 60*time.Second, func() error { // the bytes flow into the cluster's pod
		v := g.step(t, "die-use")
		if n := dirBytes(clusters[0].StepRoot("die-cluster", v.Pod)); v.Pod == "" || n < 10<<20 {
			return errorf("%d bytes in so far: %+v", n, v)
		}
		return nil
	})
	ag.kill(t)
	v := g.waitPhase(t, "die-use", wire.Errored)
	t.Logf("the step's end: %s: %s", v.Reason, v.Message)
	assert.Equal(t, "StepFailed", v.Reason)
	assert.Contains(t, v.Message, "input in")
	assert.Contains(t, v.Message, "(mesh member mac-die)")
	evs := g.stepEvents(ctx, t, "die-use", "", 0)
	assert.NotContains(t, types(evs), "started", "the process never started: %+v", evs)
}

// dirBytes is the size of the files under dir (0 if it is not there).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
