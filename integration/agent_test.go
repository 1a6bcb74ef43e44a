package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/wire"
)

// agentProcess is `gateway agent` running as its own process.
type agentProcess struct {
	cmd  *exec.Cmd
	logs *syncBuffer
	args []string
}

// startAgent runs `gateway agent` with args until the test ends (or kill).
func startAgent(t *testing.T, args ...string) *agentProcess {
	t.Helper()
	p := &agentProcess{logs: &syncBuffer{}, args: args}
	p.cmd = exec.Command(gatewayBinary(t), append([]string{"agent"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("agent logs:\n%s", p.logs.String())
		}
	})
	return p
}

// kill ends the agent at once, as a crash would: its steps' supervisors
// (processes of their own) go on.
func (p *agentProcess) kill(t *testing.T) {
	require.NoError(t, p.cmd.Process.Kill())
	_ = p.cmd.Wait()
}

// TestAgent: a machine without Kubernetes joins a gateway's mesh as an
// agent (its own process, dialing out) and is a worker: listed with its
// platform, placed on by platform and tags, running a task whose input is
// the output of a task on the gateway's cluster, and whose output feeds a
// task on the cluster again, every stream checked by SHA-256. Killed mid-
// step, it is stalled; restarted, it is running again and the step, which
// went on without it, is read back complete: every line once, run once.
func TestAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "agent-cluster", "", "")
	member := meshMember(t, ca, ca, "agent-gw", "127.0.0.1:0")
	member.stallAfter = 2 * time.Second
	g := startGateway(t, dir, gatewayOptions{identity: "agent-gw", tokens: []api.Token{adminToken, mainToken}, mesh: member})
	ag := joinAgent(t, g, ca, "mac-mini", "--platform", "darwin", "--tag", "mac", "--team", "main")
	var workers []wire.Worker
	g.get(t, "/api/v1/workers", &workers)
	for _, w := range workers {
		if w.Name == "mac-mini" {
			assert.Equal(t, "darwin", w.Platform)
			assert.Equal(t, []string{"mac"}, w.Tags)
			assert.Equal(t, "main", w.Team)
			assert.Equal(t, "agent://mac-mini", w.GardenAddr)
		}
	}
	asMain := *g
	asMain.token = mainToken.Token

	// A task on the cluster makes a blob; a task on the agent hashes it
	// and makes its own; a task on the cluster hashes that.
	produce := shStep("agent-produce", `head -c 3000000 /dev/urandom > out/blob && sha256sum out/blob | cut -d' ' -f1`)
	produce.Outputs = []wire.Output{{Name: "out"}}
	sum := runToEnd(ctx, t, &asMain, produce, "agent-cluster")
	onMac := shStep("agent-mac", `sha256sum in/blob | cut -d' ' -f1; head -c 2000000 /dev/urandom > out/blob2; sha256sum out/blob2 | cut -d' ' -f1 >&2`)
	onMac.Platform, onMac.Tags = "darwin", []string{"mac"}
	onMac.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "agent-produce", Output: "out"}}}
	onMac.Outputs = []wire.Output{{Name: "out"}}
	evs := runEvents(ctx, t, &asMain, onMac, "mac-mini")
	assert.Equal(t, []string{"placed", "input", "started", "exited"}, types(evs))
	assert.Equal(t, sum, outputOf(evs, wire.EventStdout), "the agent got the cluster's bytes")
	sum2 := outputOf(evs, wire.EventStderr)
	back := shStep("agent-back", `sha256sum in/blob2 | cut -d' ' -f1`)
	back.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "agent-mac", Output: "out"}}}
	assert.Equal(t, sum2, runToEnd(ctx, t, &asMain, back, "agent-cluster"), "the cluster got the agent's bytes")

	// Killed mid-step: the step goes on; the agent is stalled, then back.
	const lines = 60
	long := longStep("agent-long", lines)
	long.Platform, long.Tags = "darwin", []string{"mac"}
	asMain.run(t, long)
	asMain.waitEvents(t, "agent-long", 5) // placed, started, lines
	ag.kill(t)
	waitWorker(t, g, "mac-mini", "stalled")
	code, body, _ := call(t, "GET", g.base+"/api/v1/steps/agent-long", mainToken.Token)
	assert.NotEqual(t, 200, code, "while the agent is away: %s", body)
	ag.restart(t)
	waitWorker(t, g, "mac-mini", "running")
	evs = asMain.stepEvents(ctx, t, "agent-long", "", 0)
	v := asMain.step(t, "agent-long")
	runs, err := os.ReadFile(filepath.Join(ag.folder(v), "build", "out", "runs"))
	require.NoError(t, err)
	assert.Equal(t, "run\n", string(runs), "the process ran once")
	assert.Equal(t, []string{"placed", "started", "exited"}, types(evs))
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	assert.Equal(t, want.String(), outputOf(evs, wire.EventStdout), "every line once, in order")
	require.NotNil(t, evs[len(evs)-1].ExitStatus)
	assert.Equal(t, 42, *evs[len(evs)-1].ExitStatus)
}

// waitWorker waits until g lists the worker in state.
func waitWorker(t *testing.T, g *gateway, name, state string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		var workers []wire.Worker
		g.get(t, "/api/v1/workers", &workers)
		for _, w := range workers {
			if w.Name == name && w.State == state {
				return nil
			}
		}
		return errorf("worker %s not %s in %+v", name, state, workers)
	})
}

// runEvents runs req through g to its end, on target, and returns its
// events; it must succeed.
func runEvents(ctx context.Context, t *testing.T, g *gateway, req wire.Request, target string) []wire.Event {
	t.Helper()
	g.run(t, req)
	evs := g.stepEvents(ctx, t, req.Handle, "", 0)
	v := g.step(t, req.Handle)
	require.Equal(t, wire.Succeeded, v.Phase, "%+v\n%+v", v, evs)
	require.Equal(t, target, v.Target)
	return evs
}

// runToEnd is runEvents returning the step's stdout.
func runToEnd(ctx context.Context, t *testing.T, g *gateway, req wire.Request, target string) string {
	t.Helper()
	out := outputOf(runEvents(ctx, t, g, req, target), wire.EventStdout)
	require.Regexp(t, `^[0-9a-f]{64}\n$`, out)
	return out
}
