package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// otherTeamToken is a token of a team no agent serves.
var otherTeamToken = api.Token{Name: "other-ci", Token: "other-token-0123456789", Team: "other"}

// agentGateway starts a gateway, in this process, whose mesh listener
// agents of ca join; dir holds its cluster targets (it may be empty).
func agentGateway(t *testing.T, ca *meshtest.CA, name, dir string) *gateway {
	t.Helper()
	member := meshMember(t, ca, ca, name, "127.0.0.1:0")
	member.stallAfter = 2 * time.Second
	return startGateway(t, dir, gatewayOptions{identity: name, mesh: member,
		tokens: []api.Token{adminToken, mainToken, otherTeamToken}})
}

// joinedAgent is `gateway agent` joined to a gateway: the process, its
// work dir and its arguments, to start it again.
type joinedAgent struct {
	*agentProcess
	work string
	args []string
}

// joinAgent issues an agent certificate of ca for name, starts `gateway
// agent` with it joined to g (args added), and returns once g lists it
// running. Whatever its steps leave running is killed when the test ends.
func joinAgent(t *testing.T, g *gateway, ca *meshtest.CA, name string, args ...string) *joinedAgent {
	t.Helper()
	caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), name, time.Now().Add(time.Hour), agentURIs(args)...)
	work := t.TempDir()
	args = append([]string{"--join", g.meshAddr, "--ca", caFile, "--cert", certFile, "--key", keyFile,
		"--work-dir", work, "--log-level", "debug"}, args...)
	t.Cleanup(func() { killStepProcesses(t, work) })
	a := &joinedAgent{agentProcess: startAgent(t, args...), work: work, args: args}
	waitWorker(t, g, name, "running")
	return a
}

// agentURIs are the URI SANs of the certificate an operator issues for an
// agent started with args: its role, and the team and tags its --team
// and --tag name (global without --team).
func agentURIs(args []string) []string {
	var team string
	var tags []string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--team":
			team = args[i+1]
		case "--tag":
			tags = append(tags, args[i+1])
		}
	}
	return meshtest.AgentURIs(team, tags...)
}

// restart starts the agent again, on the same work dir.
func (a *joinedAgent) restart(t *testing.T) {
	a.agentProcess = startAgent(t, a.args...)
}

// folder is a step's folder on the agent.
func (a *joinedAgent) folder(v wire.View) string { return filepath.Join(a.work, "steps", v.Pod) }

// proc is a process the test saw alive: its pid and start time, so that a
// pid the kernel gives to another process later never passes for it.
type proc struct {
	pid   int
	start string
}

// procFields are a process's /proc/PID/stat fields from its state on.
func procFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])) // the name may hold spaces
}

// liveProc is the process pid, which must be alive.
func liveProc(t *testing.T, pid int) proc {
	t.Helper()
	f := procFields(pid)
	require.Greater(t, len(f), 19, "process %d is not running", pid)
	p := proc{pid: pid, start: f[19]}
	require.True(t, p.alive(), "process %d", pid)
	return p
}

// alive: the process runs (a zombie was killed, and only waits to be
// reaped).
func (p proc) alive() bool {
	f := procFields(p.pid)
	return len(f) > 19 && f[19] == p.start && f[0] != "Z" && f[0] != "X"
}

// readPid reads a pid a step's script or supervisor wrote into file.
func readPid(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err, "%s: %q", file, b)
	return pid
}

// waitGone waits until none of procs is alive.
func waitGone(t *testing.T, procs ...proc) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		for _, p := range procs {
			if p.alive() {
				return errorf("process %d still runs", p.pid)
			}
		}
		return nil
	})
}

// stepProcesses are the live processes of the steps under work: their
// supervisors (JETWAY_STEP_ROOT in their environment) and whatever runs in
// a step's folder.
func stepProcesses(work string) []int {
	if real, err := filepath.EvalSymlinks(work); err == nil {
		work = real
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		f := procFields(pid)
		if (strings.HasPrefix(cwd, work+"/") || bytes.Contains(env, []byte(stepagent.RootEnv+"="+work+"/"))) &&
			len(f) > 0 && f[0] != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitNoStepProcesses waits until no process of the steps under work
// runs (a supervisor exits a moment after it wrote the step's end).
func waitNoStepProcesses(t *testing.T, work string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if pids := stepProcesses(work); len(pids) > 0 {
			return errorf("processes %v of steps under %s still run", pids, work)
		}
		return nil
	})
}

// killStepProcesses kills what the steps under work left running: an
// agent's supervisors outlive it, by design.
func killStepProcesses(t *testing.T, work string) {
	for _, pid := range stepProcesses(work) {
		t.Logf("killing process %d of a step under %s", pid, work)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestAgentPlacement: two agents (darwin for the main team, windows for
// every team) and a cluster (linux) on one gateway. A task goes where its
// platform is, and runs there: on an agent, in that agent's step folder.
// A platform no worker has is accepted and waits, saying why, and the
// placement API refuses it naming every worker and its platform. Another
// team's darwin task never goes to the main team's agent, and nothing
// that team is answered names it.
func TestAgentPlacement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "ap-linux", "{}\n", "")
	g := agentGateway(t, ca, "ap-gw", dir)
	g.waitTarget(t, "ap-linux", 10*time.Second, running)
	mac := joinAgent(t, g, ca, "ap-mac", "--platform", "darwin", "--team", "main")
	win := joinAgent(t, g, ca, "ap-win", "--platform", "windows")
	asMain, asOther := *g, *g
	asMain.token, asOther.token = mainToken.Token, otherTeamToken.Token

	for _, tt := range []struct {
		platform, target string
		agent            *joinedAgent
	}{
		{"darwin", "ap-mac", mac},
		{"windows", "ap-win", win},
		{"linux", "ap-linux", nil},
	} {
		req := shStep("ap-"+tt.platform, "pwd")
		req.Platform = tt.platform
		evs := runEvents(ctx, t, &asMain, req, tt.target)
		if tt.agent != nil {
			want, err := filepath.EvalSymlinks(filepath.Join(tt.agent.folder(asMain.step(t, req.Handle)), "build"))
			require.NoError(t, err)
			assert.Equal(t, want+"\n", outputOf(evs, wire.EventStdout), "ran in %s's step folder", tt.target)
		}
	}

	// No worker is plan9: the step waits, saying why; a placement is refused.
	req := shStep("ap-plan9", "true")
	req.Platform = "plan9"
	asMain.run(t, req)
	const plan9 = "no target satisfies team 'main', platform 'plan9'"
	// It names every worker's refusal, the agents' too, as place does.
	const plan9Why = plan9 + ": ap-linux: platform linux; ap-mac: platform darwin; ap-win: platform windows"
	waitWaiting(t, &asMain, "ap-plan9", plan9Why)
	code, p, _ := g.place(t, mainToken.Token, api.PlacementRequest{Type: "task", Team: "main", Platform: "plan9"})
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%+v", p)
	assert.Equal(t, plan9, p.Error)
	assert.Equal(t, map[string]string{"ap-mac": "platform darwin", "ap-win": "platform windows", "ap-linux": "platform linux"},
		p.Rejected)
	endWaiting(ctx, t, &asMain, "ap-plan9", plan9Why)

	// Another team's darwin task: ap-mac is main's, so no worker fits, and
	// no answer to that team names ap-mac.
	req = shStep("ap-other", "true")
	req.Platform = "darwin"
	code, _, body := asOther.submitStep(t, otherTeamToken.Token, req)
	require.Equal(t, http.StatusAccepted, code, body)
	const other = "no target satisfies team 'other', platform 'darwin'"
	const otherWhy = other + ": ap-linux: platform linux; ap-win: platform windows"
	waitWaiting(t, &asOther, "ap-other", otherWhy)
	code, p, _ = g.place(t, otherTeamToken.Token, api.PlacementRequest{Type: "task", Team: "other", Platform: "darwin"})
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%+v", p)
	assert.Equal(t, other, p.Error)
	assert.Equal(t, map[string]string{"ap-win": "platform windows", "ap-linux": "platform linux"}, p.Rejected)
	code, p, _ = g.place(t, adminToken.Token, api.PlacementRequest{Type: "task", Team: "other", Platform: "darwin"})
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%+v", p)
	assert.Equal(t, "team main", p.Rejected["ap-mac"], "an admin sees it, and why it does not fit")
	workers := asOther.get(t, "/api/v1/workers", nil)
	assert.Contains(t, workers, "ap-win")
	assert.NotContains(t, workers, "ap-mac", "another team's agent is not listed")
	evs := endWaiting(ctx, t, &asOther, "ap-other", otherWhy)
	for _, e := range evs {
		assert.NotContains(t, e.Message, "ap-mac")
	}
	assert.NoDirExists(t, filepath.Join(mac.work, "steps", steppod.Name("other", "ap-other")))
}

// waitWaiting waits until the pending step says it waits for why.
func waitWaiting(t *testing.T, g *gateway, handle, why string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if v := g.step(t, handle); v.Phase != wire.Pending || v.Waiting != why {
			return errorf("%s: phase %s, waiting %q", handle, v.Phase, v.Waiting)
		}
		return nil
	})
}

// endWaiting aborts a waiting step and returns its events: it waited for
// why, and ends aborted, never placed.
func endWaiting(ctx context.Context, t *testing.T, g *gateway, handle, why string) []wire.Event {
	t.Helper()
	code, body, _ := call(t, http.MethodDelete, g.base+"/api/v1/steps/"+handle, g.token)
	require.Equal(t, http.StatusOK, code, body)
	evs := g.stepEvents(ctx, t, handle, "", 0)
	assert.Equal(t, []string{wire.EventWaiting, wire.EventFailed}, types(evs), "%+v", evs)
	assert.Equal(t, wire.ReasonNoTargetFits, evs[0].Reason)
	assert.Equal(t, why, evs[0].Message)
	v := g.step(t, handle)
	assert.Equal(t, wire.Aborted, v.Phase)
	return evs
}

// TestAgentAbortAndTimeout: a task on an agent whose processes ignore
// TERM is aborted through the gateway: its shell gets TERM first, then,
// after the agent's --kill-grace, the shell and its child are killed; the
// step ends aborted with 137, its folder goes, and no process of it is
// left. Another team's token cannot abort it. A task past its timeout
// ends as on a cluster (TestStepAbortAndTimeout): errored, reason
// timeout, "timed out after 2s", and its process is gone.
func TestAgentAbortAndTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	g := agentGateway(t, ca, "aa-gw", t.TempDir())
	const grace = 2 * time.Second
	ag := joinAgent(t, g, ca, "aa-mac", "--platform", "darwin", "--kill-grace", grace.String())
	asMain := *g
	asMain.token = mainToken.Token

	req := shStep("aa-abort", `trap 'echo got TERM' TERM; (trap '' TERM; exec sleep 600) & echo $! > child; echo $$ > pid; `+
		`echo started; while :; do wait; done`)
	req.Platform = "darwin"
	asMain.run(t, req)
	asMain.waitEvents(t, "aa-abort", 3) // placed, started, "started"
	v := asMain.step(t, "aa-abort")
	require.Equal(t, "aa-mac", v.Target)
	build := filepath.Join(ag.folder(v), "build")
	shell, child := liveProc(t, readPid(t, filepath.Join(build, "pid"))), liveProc(t, readPid(t, filepath.Join(build, "child")))
	followed := asMain.followEvents(ctx, t, "aa-abort", "", 0)
	code, body, _ := call(t, http.MethodDelete, g.base+"/api/v1/steps/aa-abort", otherTeamToken.Token)
	assert.Equal(t, http.StatusNotFound, code, "another team's token: %s", body)
	require.True(t, shell.alive())
	start := time.Now()
	code, body, _ = call(t, http.MethodDelete, g.base+"/api/v1/steps/aa-abort", mainToken.Token)
	require.Equal(t, http.StatusOK, code, body)
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, grace, "TERM is ignored: KILL comes after the kill grace")
	assert.Less(t, took, grace+10*time.Second)
	waitGone(t, shell, child)
	waitNoStepProcesses(t, ag.work)
	assert.NoDirExists(t, ag.folder(v), "released: its folder is deleted")

	v = asMain.step(t, "aa-abort")
	assert.Equal(t, wire.Aborted, v.Phase)
	assert.True(t, v.Released)
	evs := <-followed
	assert.Equal(t, []string{"placed", "started", "failed"}, types(evs))
	code, body, _ = call(t, http.MethodGet, g.base+"/api/v1/steps/aa-abort/events", mainToken.Token)
	assert.Equal(t, http.StatusGone, code, "its log went with its folder: %s", body)
	assert.Equal(t, "started\ngot TERM\n", outputOf(evs, wire.EventStdout), "TERM first")
	last := evs[len(evs)-1]
	assert.Equal(t, wire.Aborted, last.Phase)
	assert.Equal(t, "aborted", last.Reason)
	require.NotNil(t, last.ExitStatus)
	assert.Equal(t, 128+int(syscall.SIGKILL), *last.ExitStatus, "then KILL")

	req = shStep("aa-timeout", `echo $$ > pid; echo going; exec sleep 600`)
	req.Platform, req.Timeout = "darwin", "2s"
	asMain.run(t, req)
	asMain.waitEvents(t, "aa-timeout", 3) // placed, started, "going"
	v = asMain.step(t, "aa-timeout")
	sleeper := liveProc(t, readPid(t, filepath.Join(ag.folder(v), "build", "pid")))
	evs = asMain.stepEvents(ctx, t, "aa-timeout", "", 0)
	assert.Equal(t, []string{"placed", "started", "failed"}, types(evs))
	last = evs[len(evs)-1]
	assert.Equal(t, wire.EventFailed, last.Type)
	assert.Equal(t, wire.Errored, last.Phase)
	assert.Equal(t, "timeout", last.Reason)
	assert.Contains(t, last.Message, "timed out after 2s")
	v = asMain.step(t, "aa-timeout")
	assert.Equal(t, wire.Errored, v.Phase)
	assert.GreaterOrEqual(t, v.FinishedAt.Sub(v.StartedAt), 2*time.Second)
	assert.Less(t, v.FinishedAt.Sub(v.StartedAt), 10*time.Second, "killed after its timeout and the kill grace")
	waitGone(t, sleeper)
	waitNoStepProcesses(t, ag.work)
	assert.DirExists(t, ag.folder(v), "kept until released")
}

// TestAgentLostStep: an agent dies mid-step, and its step's supervisor
// and process die with it (as in a reboot). The restarted agent does not
// run the step again, nor leave it running or drop it: the step ends
// errored, reason lost, saying so, with the output it had made.
func TestAgentLostStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	g := agentGateway(t, ca, "al-gw", t.TempDir())
	ag := joinAgent(t, g, ca, "al-mac", "--platform", "darwin")
	asMain := *g
	asMain.token = mainToken.Token

	req := shStep("al-lost", `echo run >> out/runs; i=1; while :; do echo "line $i"; i=$((i+1)); sleep 0.05; done`)
	req.Platform, req.Outputs = "darwin", []wire.Output{{Name: "out"}}
	asMain.run(t, req)
	asMain.waitEvents(t, "al-lost", 5) // placed, started, lines
	v := asMain.step(t, "al-lost")
	root := ag.folder(v)
	supervisor := liveProc(t, readPid(t, stepagent.Path(root, stepagent.LockFile)))
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", supervisor.pid))
	require.NoError(t, err)
	assert.Contains(t, string(cmdline), "step-agent\x00supervise", "run/lock names the supervisor")
	raw, err := os.ReadFile(stepagent.Path(root, stepagent.StartedFile))
	require.NoError(t, err)
	var started stepagent.Started
	require.NoError(t, json.Unmarshal(raw, &started))
	process := liveProc(t, started.PID)

	// The machine goes down: the agent, the supervisor, the process.
	ag.kill(t)
	require.NoError(t, syscall.Kill(supervisor.pid, syscall.SIGKILL))
	require.NoError(t, syscall.Kill(-process.pid, syscall.SIGKILL))
	waitGone(t, supervisor, process)
	waitWorker(t, g, "al-mac", "stalled")
	ag.restart(t)
	waitWorker(t, g, "al-mac", "running")

	// Read back, it ends within seconds; left running, it would never end.
	ectx, cancelEvents := context.WithTimeout(ctx, 30*time.Second)
	defer cancelEvents()
	evs := asMain.stepEvents(ectx, t, "al-lost", "", 0)
	assert.Equal(t, []string{"placed", "started", "failed"}, types(evs))
	last := evs[len(evs)-1]
	assert.Equal(t, wire.Errored, last.Phase)
	assert.Equal(t, "lost", last.Reason)
	assert.Equal(t, "the step's supervisor died before its process ended", last.Message)
	out := outputOf(evs, wire.EventStdout)
	assert.True(t, strings.HasPrefix(out, "line 1\nline 2\nline 3\n"), "the output made before: %q", out)
	v = asMain.step(t, "al-lost")
	assert.Equal(t, wire.Errored, v.Phase)
	assert.Equal(t, "lost", v.Reason)
	assert.False(t, v.FinishedAt.IsZero())
	runs, err := os.ReadFile(filepath.Join(root, "build", "out", "runs"))
	require.NoError(t, err)
	assert.Equal(t, "run\n", string(runs), "never run again")
	waitNoStepProcesses(t, ag.work)
}

// TestAgentCertificates: the mesh's roles end to end, through processes
// and real listeners. `gateway agent` with a gateway's certificate, and
// `gateway run` with an agent's, each exit at once with status 2 (a
// configuration error) saying which certificate to issue; so does an
// agent with a certificate that names no team (issued before agents'
// scopes were bound to certificates), which the gateway also refuses at
// the handshake, and an agent whose --team claims more than its
// certificate. A member with an agent's certificate that announces
// targets besides itself has its own route kept and the others refused;
// the gateway serves a well-behaved agent afterwards.
func TestAgentCertificates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ca := meshtest.NewCA(t, "mesh-ca")
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[1], dir, "ac-cluster", "{}\n", "")
	g := agentGateway(t, ca, "ac-gw", dir)
	g.waitTarget(t, "ac-cluster", 10*time.Second, running)

	t.Run("an agent with a gateway's certificate", func(t *testing.T) {
		caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "ac-wrong", time.Now().Add(time.Hour))
		code, out := runGatewayCommand(ctx, t, "agent", "--join", g.meshAddr, "--ca", caFile, "--cert", certFile,
			"--key", keyFile, "--work-dir", t.TempDir())
		assert.Equal(t, 2, code, out)
		assert.Contains(t, out, "gateway: invalid configuration: cert: mesh: certificate "+certFile+
			" is a gateway's; gateway agent needs an agent certificate: gateway mesh issue --agent\n")
		assert.False(t, g.listed(t, "ac-wrong"))
	})
	t.Run("an agent with a certificate from before scopes", func(t *testing.T) {
		caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "ac-old-agent", time.Now().Add(time.Hour), meshtest.AgentURI)
		code, out := runGatewayCommand(ctx, t, "agent", "--join", g.meshAddr, "--ca", caFile, "--cert", certFile,
			"--key", keyFile, "--work-dir", t.TempDir())
		assert.Equal(t, 2, code, out)
		assert.Contains(t, out, `gateway: invalid configuration: cert: mesh: `+certFile+`: agent certificate of "ac-old-agent" has no team: `+
			"issue it again with gateway mesh issue --agent --team TEAM (or --global for an agent of every team)")
		// Its key in a member of its own, as a forger would: refused at the
		// handshake.
		before := metricValue(t, g, `jetway_mesh_handshake_failures_total{reason="agent-scope"}`)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		require.NoError(t, err)
		conn, err := tls.Dial("tcp", g.meshAddr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
			Certificates: []tls.Certificate{pair}, NextProtos: []string{"jetway-mesh/1"}})
		if err == nil {
			_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the refusal comes as an alert
			conn.Close()
		}
		require.Error(t, err)
		eventually(t, 10*time.Second, func() error {
			if metricValue(t, g, `jetway_mesh_handshake_failures_total{reason="agent-scope"}`) <= before {
				return errorf("the handshake refusal not counted yet")
			}
			return nil
		})
		assert.False(t, g.listed(t, "ac-old-agent"))
	})
	t.Run("an agent whose flags claim more than its certificate", func(t *testing.T) {
		caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "ac-team", time.Now().Add(time.Hour), meshtest.AgentURIs("main", "mac")...)
		code, out := runGatewayCommand(ctx, t, "agent", "--join", g.meshAddr, "--ca", caFile, "--cert", certFile,
			"--key", keyFile, "--work-dir", t.TempDir(), "--team", "")
		assert.Equal(t, 2, code, out)
		assert.Contains(t, out, `team: "" (every team) but the certificate `+certFile+` makes this agent one of team main, tags mac`)
		assert.False(t, g.listed(t, "ac-team"))
	})
	t.Run("a gateway with an agent's certificate", func(t *testing.T) {
		caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), "ac-wrong", time.Now().Add(time.Hour), meshtest.AgentURIs("")...)
		code, out := runGatewayCommand(ctx, t, "run", "--listen", "127.0.0.1:0", "--targets-dir", t.TempDir(), "--no-auth",
			"--mesh-listen", "127.0.0.1:0", "--mesh-peers", g.meshAddr, "--mesh-ca", caFile, "--mesh-cert", certFile, "--mesh-key", keyFile)
		assert.Equal(t, 2, code, out)
		assert.Contains(t, out, "gateway: invalid configuration: mesh-cert: mesh: certificate "+certFile+
			" is an agent's (URI SAN urn:jetway:mesh:agent); a gateway needs a gateway certificate: gateway mesh issue without --agent\n")
		assert.NotContains(t, out, "serving http")
		assert.False(t, g.listed(t, "ac-wrong"))
	})
	t.Run("a gateway with a certificate that says nothing of what it is for", func(t *testing.T) {
		dir := t.TempDir()
		caFile := filepath.Join(dir, "ca.crt")
		writeFile(t, caFile, ca.PEM)
		certFile, keyFile := ca.IssueWith(t, dir, "ac-old", time.Now().Add(time.Hour), func(*x509.Certificate) {})
		code, out := runGatewayCommand(ctx, t, "run", "--listen", "127.0.0.1:0", "--targets-dir", t.TempDir(), "--no-auth",
			"--mesh-listen", "127.0.0.1:0", "--mesh-peers", g.meshAddr, "--mesh-ca", caFile, "--mesh-cert", certFile, "--mesh-key", keyFile)
		assert.Equal(t, 2, code, out)
		assert.Contains(t, out, "gateway: invalid configuration: mesh-cert: mesh: "+certFile+`: certificate of "ac-old" has no role URI`)
		assert.NotContains(t, out, "serving http")
	})
	t.Run("an agent announcing other targets", func(t *testing.T) {
		// ac-rogue announces itself, a target the gateway owns, and one more.
		joinRogue(t, g, ca, "ac-rogue", "ac-cluster", "ac-extra")
		// One announcement is taken or refused route by route, at once:
		// once its own is listed, the others were refused.
		eventually(t, 20*time.Second, func() error {
			if _, ok := g.targetsByName(t)["ac-rogue"]; !ok {
				return errorf("ac-rogue not listed")
			}
			return nil
		})
		assert.Equal(t, map[string]string{"ac-cluster": "ac-gw/running", "ac-rogue": "ac-rogue/running"}, owners(t, g))
		assert.NotContains(t, g.get(t, "/api/v1/workers", nil), "ac-extra")
		assert.GreaterOrEqual(t, metricValue(t, g, `jetway_mesh_routes_refused_total{reason="agent-not-itself"}`), 2.0)

		// The gateway goes on serving agents that behave.
		joinAgent(t, g, ca, "ac-mac", "--platform", "darwin")
		req := shStep("ac-task", "echo fine")
		req.Platform = "darwin"
		asMain := *g
		asMain.token = mainToken.Token
		assert.Equal(t, "fine\n", outputOf(runEvents(ctx, t, &asMain, req, "ac-mac"), wire.EventStdout))
		waitOwners(t, g, map[string]string{"ac-cluster": "ac-gw/running", "ac-rogue": "ac-rogue/running", "ac-mac": "ac-mac/running"})
	})
}

// runGatewayCommand runs the gateway binary with args, which must end
// within 10 s, and returns its exit status and output.
func runGatewayCommand(ctx context.Context, t *testing.T, args ...string) (int, string) {
	t.Helper()
	bin := gatewayBinary(t) // built before the clock starts
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "gateway %s did not exit within 10 s:\n%s", args[0], out)
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		return exit.ExitCode(), string(out)
	}
	return 0, string(out)
}

// announcing is a member's targets: one per name, platform plan9 (no
// step asks for it).
type announcing []string

func (a announcing) Snapshot() []targets.Status {
	var out []targets.Status
	for _, name := range a {
		out = append(out, targets.Status{Name: name, Server: targets.AgentServer(name), State: targets.StateRunning,
			Meta: targets.Metadata{Platform: "plan9"}})
	}
	return out
}

func (announcing) Changed() <-chan struct{} { return nil }

// joinRogue joins a member with an agent's certificate for name to g's
// mesh, built with package mesh as `gateway agent` builds its own, but
// announcing every target of names, until the test ends.
func joinRogue(t *testing.T, g *gateway, ca *meshtest.CA, name string, names ...string) {
	t.Helper()
	caFile, certFile, keyFile := ca.Files(t, ca, t.TempDir(), name, time.Now().Add(time.Hour), meshtest.AgentURIs("")...)
	joinForged(t, g, name, []string{caFile, certFile, keyFile}, announcing(append([]string{name}, names...)))
}

// joinForged joins a member with the agent certificate files (CA,
// certificate, key) to g's mesh, built with package mesh as `gateway
// agent` builds its own, but announcing what local says: an attacker
// holding an agent's key. It runs until the test ends.
func joinForged(t *testing.T, g *gateway, name string, files []string, local mesh.Local) *mesh.Mesh {
	t.Helper()
	id, err := mesh.LoadIdentity(files[0], files[1], files[2])
	require.NoError(t, err)
	logs := &syncBuffer{}
	node, err := mesh.New(mesh.Options{Identity: id, Kind: mesh.KindAgent, Peers: []string{g.meshAddr},
		Local: local, Logger: slog.New(slog.NewJSONHandler(logs, nil)), MinBackoff: 100 * time.Millisecond,
		MaxBackoff: time.Second, Metrics: mesh.NewMetrics(prometheus.NewRegistry())})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, node.Start(ctx)) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, logs.String())
		}
	})
	return node
}
