package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/wire"
)

// Settings of the issue's benchmark; BENCH_AGENT_MIB shrinks the
// artifact, BENCH_AGENT_ROUNDS runs each path more often.
var (
	agentMiB    = envInt("BENCH_AGENT_MIB", 1024)
	agentRounds = envInt("BENCH_AGENT_ROUNDS", 2)
)

// The agent of the benchmark, and what its tasks ask for.
const (
	agentName     = "bench-agent"
	agentPlatform = "darwin"
	agentTag      = "bench"
	// benchToken is team main's: a gateway serves an agent volumes only
	// for a team's caller, never an admin's (api/agents.go).
	benchToken  = "bench-main-token-0123456789"
	produceStep = "bench-produce"
)

// Lines of the agent's debug log that bracket its bringing a step's
// inputs in (agent/run.go start).
const (
	inputsBegin = "step prepared; bringing its inputs in"
	inputsEnd   = "step inputs in"
)

// BenchmarkAgent carries one artifact (1 GiB, the output of a task on a
// local cluster, served by its step pod's volume sidecar) to a machine
// without Kubernetes three ways in one run, in turn, each at least twice:
//
//   - floor: integration/cmd/pfpipe, a client-go port-forward to the pod
//     (a local listener, as kubectl does) piping its stream-out with one
//     HTTP/1.1 PUT over one plain TLS 1.3 connection (the mesh's
//     certificates and TLS settings) into integration/cmd/tlsrecv, which
//     streams it into a loopback volume server, counting and hashing it,
//     as the agent does;
//   - no-mesh: the same, port-forwarding with jetway's own dialer, as the
//     gateway does: jetway's path with one TLS connection for the mesh;
//   - jetway: a task on a real `gateway agent` process joined to a real
//     gateway's mesh listener, whose input is that output: the gateway
//     port-forwards to the pod and sends the bytes over the mesh, the
//     agent streams them into its step's volume server. Its time is the
//     input event's minus the placed event's, both made on the agent:
//     the step's folder, the transfer and the start of its supervisor.
//
// pfpipe's time is from its first dial to the receiver's answer. Every
// transfer must carry the same bytes (count and SHA-256 of the stream),
// and the agent's task must hash the file as the producing task did. It
// reports MB/s and CPU seconds per GiB (sender and receiver processes)
// of each path, and the medians of the per-round ratios jetway/floor
// (the goal) and jetway/no-mesh (what the mesh itself costs).
func BenchmarkAgent(b *testing.B) {
	for range b.N {
		runAgentBench(b)
	}
}

func runAgentBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	ab := setupAgentBench(ctx, b)
	defer func() { _, _ = ab.client.Abort(context.Background(), "", produceStep) }()
	var floor, noMesh, jetway []transfer
	paths := []func(r int){
		func(r int) { floor = append(floor, ab.pipe(ctx, b, r, "floor", "client-go")) },
		func(r int) { noMesh = append(noMesh, ab.pipe(ctx, b, r, "no-mesh", "jetway")) },
		func(r int) { jetway = append(jetway, ab.viaMesh(ctx, b, r)) },
	}
	b.ResetTimer()
	for r := range agentRounds {
		for _, path := range paths {
			path(r)
		}
		slices.Reverse(paths) // each path first as often as last
	}
	b.StopTimer()
	for _, t := range slices.Concat(floor, noMesh, jetway) {
		if t.bytes != floor[0].bytes || t.sha256 != floor[0].sha256 || t.bytes < int64(agentMiB)<<20 {
			b.Fatalf("%s round %d carried %d bytes, SHA-256 %s; floor round 0: %d bytes, %s", t.path, t.round,
				t.bytes, t.sha256, floor[0].bytes, floor[0].sha256)
		}
	}
	reportAgentBench(b, floor, noMesh, jetway)
}

// agentBench is what a run sets up: a gateway with the step kubelet's
// cluster and a mesh listener, an agent joined to it, the floor's
// receiver, and the cluster task's output.
type agentBench struct {
	gw         *gatewayProc
	agent      *agentProc
	recv       *receiverProc
	client     *client.Client
	certs      meshCerts
	pfpipe     string
	kubeconfig string // the cluster target's, for pfpipe
	srcToken   string // the artifact's pod's volume server's, for pfpipe
	bed        *stepsBed
	src        wire.Volume // the cluster task's output
	sum        string      // the SHA-256 of its file
	// shared are the processes both paths go through: the cluster's
	// (the API server's and kwok's port-forward relays among them) and
	// this one (the pod's volume sidecar).
	shared []int
}

// sharedCPU is the CPU time of the shared processes.
func (ab *agentBench) sharedCPU() time.Duration {
	var d time.Duration
	for _, pid := range ab.shared {
		d += procCPU(pid)
	}
	return d
}

// pidsUnder lists the processes with dir in their command line.
func pidsUnder(dir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(cmdline, []byte(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// transfer is one carrying of the artifact. sender and receiver are CPU
// time: the gateway's and the agent's, or pfpipe's and tlsrecv's.
type transfer struct {
	path             string
	round            int
	seconds          float64
	sender, receiver time.Duration
	shared           time.Duration // of agentBench.shared
	bytes            int64
	sha256           string
	detail           string
}

func setupAgentBench(ctx context.Context, b *testing.B) *agentBench {
	certs := writeMeshCerts(b)
	tokens := filepath.Join(b.TempDir(), "tokens.yaml")
	if err := writeFile(tokens, []byte("tokens:\n- {name: bench, token: "+benchToken+", team: main}\n")); err != nil {
		b.Fatal(err)
	}
	bed, gw, stop := stepsGateway(ctx, b, kwokNode, benchToken, "--auth-tokens-file", tokens, "--mesh-listen", "127.0.0.1:0",
		"--mesh-ca", certs.ca, "--mesh-cert", certs.gatewayCert, "--mesh-key", certs.gatewayKey, "--gc-grace", "1h")
	b.Cleanup(stop)
	cli, err := client.New(client.Options{URL: gw.base, Token: benchToken})
	if err != nil {
		b.Fatal(err)
	}
	ab := &agentBench{gw: gw, bed: bed, client: cli, certs: certs, kubeconfig: filepath.Join(gw.targetsDir, stepsTarget, "kubeconfig"),
		shared: append(pidsUnder(filepath.Dir(bed.c.AdminKubeconfig())), os.Getpid())}
	ab.agent = startAgentProc(b, gw.cmd.Path, gw.meshAddr, certs)
	waitFor(b, time.Minute, func() error {
		workers, err := cli.Workers(ctx)
		for _, w := range workers {
			if w.Name == agentName && w.State == "running" {
				return nil
			}
		}
		return fmt.Errorf("agent %s not running: %+v, %v", agentName, workers, err)
	})
	ab.recv = startReceiver(b, certs)
	ab.pfpipe = goBuild(b, "github.com/jetway-ci/jetway/integration/cmd/pfpipe")
	ab.produce(ctx, b)
	return ab
}

// meshCerts are the files of the mesh CA, the gateway's certificate and
// the agent's. The floor uses them too: the gateway's for its sender,
// the agent's for its receiver.
type meshCerts struct {
	ca, gatewayCert, gatewayKey, agentCert, agentKey string
}

func writeMeshCerts(b *testing.B) meshCerts {
	ca := meshtest.NewCA(b, "bench-mesh-ca")
	dir := b.TempDir()
	until := time.Now().Add(time.Hour) // the CA's own end
	var m meshCerts
	m.ca, m.gatewayCert, m.gatewayKey = ca.Files(b, ca, dir, "bench-gateway", until)
	m.agentCert, m.agentKey = ca.Issue(b, dir, agentName, until, meshtest.AgentURIs("", agentTag)...)
	return m
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// produce runs the task on the cluster whose output is the artifact.
func (ab *agentBench) produce(ctx context.Context, b *testing.B) {
	script := fmt.Sprintf("head -c %d /dev/urandom > out/blob && sha256sum out/blob | cut -d' ' -f1", int64(agentMiB)<<20)
	req := wire.Request{Handle: produceStep, Type: "task", Image: "busybox:1.37",
		Run: wire.Run{Path: "sh", Args: []string{"-c", script}}, Outputs: []wire.Output{{Name: "out"}}}
	v, out := ab.run(ctx, b, req, nil)
	if v.Target != stepsTarget || len(v.Outputs) != 1 || !sha256Hex.MatchString(out) {
		b.Fatalf("%s: on %q, outputs %+v, stdout %q", produceStep, v.Target, v.Outputs, out)
	}
	ab.src, ab.sum = v.Outputs[0], out
	key, err := ownership.LoadKey(ctx, ab.bed.c.Client.CoreV1(), "bench-state", "jetway")
	if err != nil {
		b.Fatal(err)
	}
	pod, err := ab.bed.c.Client.CoreV1().Pods(stepsNamespace).Get(ctx, ab.src.Pod, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ab.srcToken = key.PodToken(ab.src.Target, pod)
}

// run runs req to its success, calling onEvent with its events, and
// returns its view and its stdout, trimmed.
func (ab *agentBench) run(ctx context.Context, b *testing.B, req wire.Request, onEvent func(wire.Event)) (wire.View, string) {
	var out strings.Builder
	v, err := ab.client.Run(ctx, req, func(e wire.Event) {
		if e.Type == wire.EventStdout {
			out.WriteString(e.Data)
		}
		if onEvent != nil {
			onEvent(e)
		}
	})
	if err != nil {
		b.Fatalf("step %s: %v", req.Handle, err)
	}
	return v, strings.TrimSpace(out.String())
}

// viaMesh runs a task on the agent whose input is the artifact.
func (ab *agentBench) viaMesh(ctx context.Context, b *testing.B, round int) transfer {
	handle := fmt.Sprintf("bench-agent-%d", round)
	req := wire.Request{Handle: handle, Type: "task", Image: "busybox:1.37", Platform: agentPlatform, Tags: []string{agentTag},
		Run:    wire.Run{Path: "sh", Args: []string{"-c", "sha256sum in/blob | cut -d' ' -f1"}},
		Inputs: []wire.Input{{Name: "in", From: wire.InputSource{Step: produceStep, Output: "out"}}}}
	gw0, agent0, shared0 := ab.gw.cpu(), ab.agent.cpu(), ab.sharedCPU()
	var placed, input wire.Event
	t := transfer{path: "jetway", round: round}
	v, sum := ab.run(ctx, b, req, func(e wire.Event) {
		switch e.Type {
		case wire.EventPlaced:
			placed = e
		case wire.EventInput:
			input = e
			t.sender, t.receiver, t.shared = ab.gw.cpu()-gw0, ab.agent.cpu()-agent0, ab.sharedCPU()-shared0
		}
	})
	// Released, the step's folder (the artifact's copy) goes.
	if _, err := ab.client.Abort(ctx, "", handle); err != nil {
		b.Fatalf("release %s: %v", handle, err)
	}
	if v.Target != agentName || input.Time.IsZero() || placed.Time.IsZero() {
		b.Fatalf("%s: on %q, placed %+v, input %+v", handle, v.Target, placed, input)
	}
	if sum != ab.sum {
		b.Fatalf("%s: the agent's file hashes %q, the cluster's %q", handle, sum, ab.sum)
	}
	t.seconds = input.Time.Sub(placed.Time).Seconds()
	t.bytes, t.sha256 = input.Bytes, input.SHA256
	begin, ok1 := ab.agent.mark(handle, inputsBegin)
	end, ok2 := ab.agent.mark(handle, inputsEnd)
	if ok1 && ok2 {
		t.detail = fmt.Sprintf("inputs brought in %.3fs of it", end.Sub(begin).Seconds())
	}
	return t
}

// pipe pipes the artifact with pfpipe into tlsrecv, port-forwarding to
// the pod with dialer (pfpipe --src-dialer).
func (ab *agentBench) pipe(ctx context.Context, b *testing.B, round int, path, dialer string) transfer {
	handle := fmt.Sprintf("%s-%d", path, round)
	recv0, shared0 := ab.recv.cpu(), ab.sharedCPU()
	cmd := exec.CommandContext(ctx, ab.pfpipe, "--src-dialer", dialer, "--src-kubeconfig", ab.kubeconfig, "--src-pod", ab.src.Pod,
		"--src-path", "/volumes/"+url.PathEscape(ab.src.Handle)+"/stream-out?path=", "--src-token", ab.srcToken,
		"--dst-url", "https://"+ab.recv.addr+"/volumes/"+handle+"/stream-in",
		"--dst-ca", ab.certs.ca, "--dst-cert", ab.certs.gatewayCert, "--dst-key", ab.certs.gatewayKey)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("pfpipe: %v\n%s", err, stderr.Bytes())
	}
	t := transfer{path: path, round: round, receiver: ab.recv.cpu() - recv0, shared: ab.sharedCPU() - shared0,
		sender: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
	_ = os.RemoveAll(filepath.Join(ab.recv.dir, "volumes", handle))
	var res struct {
		Bytes   int64   `json:"bytes"`
		Seconds float64 `json:"seconds"`
		Answer  struct {
			Bytes   int64   `json:"bytes"`
			SHA256  string  `json:"sha256"`
			Seconds float64 `json:"seconds"`
		} `json:"answer"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Answer.Bytes != res.Bytes {
		b.Fatalf("pfpipe printed %q (%v)", out, err)
	}
	t.seconds, t.bytes, t.sha256 = res.Seconds, res.Answer.Bytes, res.Answer.SHA256
	t.detail = fmt.Sprintf("receiver's request %.3fs of it", res.Answer.Seconds)
	return t
}

func reportAgentBench(b *testing.B, floor, noMesh, jetway []transfer) {
	gib := float64(floor[0].bytes) / (1 << 30)
	mbps := func(t transfer) float64 { return float64(t.bytes) / 1e6 / t.seconds }
	cpu := func(t transfer) float64 { return (t.sender + t.receiver).Seconds() / gib }
	b.Logf("artifact %d MiB (a tar stream of %d bytes), a pod's volume -> an agent's step volume, %d rounds",
		agentMiB, floor[0].bytes, agentRounds)
	b.Logf("%-5s %-7s %8s %8s %10s %9s %9s %9s %5s  %s", "round", "path", "s", "MB/s", "CPU s/GiB", "sender s", "recv s", "shared s", "CPUs", "")
	var vsFloor, vsNoMesh []float64
	for r := range floor {
		for _, t := range []transfer{floor[r], noMesh[r], jetway[r]} {
			b.Logf("%-5d %-7s %8.3f %8.1f %10.2f %9.2f %9.2f %9.2f %5.2f  %s", r, t.path, t.seconds, mbps(t), cpu(t),
				t.sender.Seconds(), t.receiver.Seconds(), t.shared.Seconds(), (t.sender+t.receiver+t.shared).Seconds()/t.seconds, t.detail)
		}
		vsFloor = append(vsFloor, mbps(jetway[r])/mbps(floor[r]))
		vsNoMesh = append(vsNoMesh, mbps(jetway[r])/mbps(noMesh[r]))
	}
	b.Logf("floor: pfpipe, client-go port-forward (a local listener) -> one TLS 1.3 connection -> tlsrecv")
	b.Logf("no-mesh: pfpipe, jetway's port-forward dialer (as the gateway) -> one TLS 1.3 connection -> tlsrecv")
	b.Logf("jetway: the gateway -> the mesh -> the agent; from the placed event to the input event")
	b.Logf("CPU s/GiB: sender's and receiver's (pfpipe's and tlsrecv's, or the gateway's and the agent's); shared: the")
	b.Logf("  cluster's processes (API server, kwok, ...) and this one (the pod's volume sidecar), for every path;")
	b.Logf("  CPUs: all three over the time, the CPUs the pipeline got (of %d; other tenants take the rest)", runtime.NumCPU())
	b.Logf("jetway/floor throughput per round %.3f, median %.3f (goal >= 0.8)", vsFloor, median(vsFloor))
	b.Logf("jetway/no-mesh (the mesh against one TLS connection) per round %.3f, median %.3f", vsNoMesh, median(vsNoMesh))
	// Every process of the pipeline competes for the same CPUs, so where
	// the transfer is CPU-bound (here: both CPUs busy) throughput goes as
	// 1 / all the CPU a byte costs, the steadier number on a shared box.
	all := func(t transfer) float64 { return (t.sender + t.receiver + t.shared).Seconds() / gib }
	f, n, j := median(apply(floor, all)), median(apply(noMesh, all)), median(apply(jetway, all))
	b.Logf("all CPU s/GiB (sender, receiver, shared), median: floor %.2f, no-mesh %.2f, jetway %.2f; "+
		"CPU-bound, that predicts jetway/floor %.3f, jetway/no-mesh %.3f", f, n, j, f/j, n/j)
	b.ReportMetric(median(apply(floor, mbps)), "floor-MB/s")
	b.ReportMetric(median(apply(noMesh, mbps)), "no-mesh-MB/s")
	b.ReportMetric(median(apply(jetway, mbps)), "jetway-MB/s")
	b.ReportMetric(median(vsFloor), "jetway/floor")
	b.ReportMetric(median(vsNoMesh), "jetway/no-mesh")
	b.ReportMetric(median(apply(floor, cpu)), "floor-CPU-s/GiB")
	b.ReportMetric(median(apply(noMesh, cpu)), "no-mesh-CPU-s/GiB")
	b.ReportMetric(median(apply(jetway, cpu)), "jetway-CPU-s/GiB")
}

func apply(ts []transfer, f func(transfer) float64) []float64 {
	out := make([]float64, len(ts))
	for i, t := range ts {
		out[i] = f(t)
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// agentProc is `gateway agent` as its own process. It keeps the times of
// its debug log's lines by step handle, and its warnings and errors.
type agentProc struct {
	cmd *exec.Cmd

	mu      sync.Mutex
	marks   map[string]time.Time // handle + " " + message
	notable []string
}

// startAgentProc joins an agent to the gateway's mesh listener at join;
// it is stopped when the benchmark ends.
func startAgentProc(b *testing.B, bin, join string, certs meshCerts) *agentProc {
	p := &agentProc{marks: map[string]time.Time{}}
	p.cmd = exec.Command(bin, "agent", "--join", join, "--ca", certs.ca, "--cert", certs.agentCert, "--key", certs.agentKey,
		"--work-dir", b.TempDir(), "--platform", agentPlatform, "--tag", agentTag, "--log-level", "debug")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		p.read(stderr)
	}()
	b.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-read
		_ = p.cmd.Wait()
		for _, line := range p.notable {
			b.Logf("agent: %s", line)
		}
	})
	return p
}

func (p *agentProc) read(log interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(log)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Time               time.Time
			Level, Msg, Handle string
		}
		_ = json.Unmarshal(sc.Bytes(), &line)
		p.mu.Lock()
		switch {
		case line.Msg == inputsBegin || line.Msg == inputsEnd:
			p.marks[line.Handle+" "+line.Msg] = line.Time
		case line.Level == "WARN" || line.Level == "ERROR":
			p.notable = append(p.notable, sc.Text())
		}
		p.mu.Unlock()
	}
}

// mark is the time of the agent's log line msg about the step handle.
func (p *agentProc) mark(handle, msg string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.marks[handle+" "+msg]
	return t, ok
}

func (p *agentProc) cpu() time.Duration { return procCPU(p.cmd.Process.Pid) }

// receiverProc is integration/cmd/tlsrecv, the floor's receiver.
type receiverProc struct {
	cmd       *exec.Cmd
	addr, dir string
}

// startReceiver starts tlsrecv with the agent's certificate; it is
// stopped when the benchmark ends.
func startReceiver(b *testing.B, certs meshCerts) *receiverProc {
	p := &receiverProc{dir: b.TempDir()}
	p.cmd = exec.Command(goBuild(b, "github.com/jetway-ci/jetway/integration/cmd/tlsrecv"),
		"--ca", certs.ca, "--cert", certs.agentCert, "--key", certs.agentKey, "--dir", p.dir)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.Stderr = os.Stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_ = p.cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		addr <- strings.TrimPrefix(strings.TrimSpace(line), "listening ")
	}()
	select {
	case p.addr = <-addr:
	case <-time.After(10 * time.Second):
	}
	if p.addr == "" {
		b.Fatal("tlsrecv did not start listening")
	}
	return p
}

func (p *receiverProc) cpu() time.Duration { return procCPU(p.cmd.Process.Pid) }
