package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
)

// Settings of the benchmark; BENCH_TARGETS and BENCH_DURATION
// shrink it for a quick try.
var (
	benchTargets  = envInt("BENCH_TARGETS", 1000)
	benchDuration = envDuration("BENCH_DURATION", 2*time.Minute)
)

const (
	benchInterval = 10 * time.Second
	benchClusters = 3
	perNamespace  = 10 // service accounts per namespace
)

// BenchmarkTargets runs a real gateway over 1,000 targets (distinct service
// accounts spread over 3 clusters) at a 10 s health interval and reports
// whether every target is checked within every interval (jitter included),
// the gateway's CPU, and its memory per target.
func BenchmarkTargets(b *testing.B) {
	for range b.N {
		runTargetsBench(b)
	}
}

func runTargetsBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), benchDuration+10*time.Minute)
	defer cancel()
	clusters := cluster.ForTest(b, benchClusters)
	dir := b.TempDir()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range benchTargets {
		g.Go(func() error {
			c := clusters[i%benchClusters]
			ns := fmt.Sprintf("bench-%d", i/(benchClusters*perNamespace))
			t, err := c.CreateTarget(gctx, cluster.TargetOptions{Namespace: ns, ServiceAccount: fmt.Sprintf("jetway-%d", i),
				Rules: targets.RBACRules(targets.Required)})
			if err != nil {
				return err
			}
			return writeFile(filepath.Join(dir, fmt.Sprintf("t%04d.kubeconfig", i)), t.Kubeconfig)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	b.Logf("created %d targets in %s", benchTargets, time.Since(start).Round(time.Second))

	bin := buildGateway(b)
	idle := startGateway(b, bin, b.TempDir())
	time.Sleep(3 * time.Second)
	idleRSS := idle.status("VmRSS")
	idle.stop(b)

	gw := startGateway(b, bin, dir)
	defer gw.stop(b)
	// Warm up: every target listed and checked once.
	waitAllChecked(ctx, b, gw)
	b.ResetTimer()
	requests0 := apiRequests(ctx, b, clusters)
	cpu0, t0 := gw.cpu(), time.Now()
	seen := map[string]map[time.Time]bool{}
	for time.Since(t0) < benchDuration {
		for _, tg := range gw.targets(b) {
			if seen[tg.Name] == nil {
				seen[tg.Name] = map[time.Time]bool{}
			}
			if tg.LastCheck != nil && tg.LastCheck.After(t0.Add(-benchInterval)) {
				seen[tg.Name][*tg.LastCheck] = true
			}
		}
		time.Sleep(2 * time.Second)
	}
	cpu, wall := gw.cpu()-cpu0, time.Since(t0)
	b.StopTimer()
	final := gw.targets(b)
	rss, hwm := gw.status("VmRSS"), gw.status("VmHWM")
	sockets := gw.sockets()

	// A target is on time when no gap between its checks exceeds the
	// interval plus its +10% jitter and a second of check and scheduling
	// slack; the share counts (target, gap) pairs.
	bound := benchInterval + benchInterval/10 + time.Second
	var gaps, onTime int
	var worst time.Duration
	for _, checks := range seen {
		ts := make([]time.Time, 0, len(checks))
		for at := range checks {
			ts = append(ts, at)
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i := 1; i < len(ts); i++ {
			gap := ts[i].Sub(ts[i-1])
			gaps++
			if gap <= bound {
				onTime++
			}
			worst = max(worst, gap)
		}
	}
	running := 0
	for _, tg := range final {
		if tg.State == "running" {
			running++
		}
	}
	share := float64(onTime) / math.Max(1, float64(gaps))
	cpuShare := cpu.Seconds() / wall.Seconds()
	b.ReportMetric(share*100, "%checked-in-interval")
	b.ReportMetric(worst.Seconds(), "max-gap-s")
	b.ReportMetric(cpuShare*100, "%gateway-cpu")
	b.ReportMetric(float64(rss)/float64(benchTargets), "rss-KB/target")
	b.ReportMetric(float64(rss-idleRSS)/float64(benchTargets), "marginal-KB/target")
	b.Logf("targets %d (running %d), interval %s, measured %s", len(final), running, benchInterval, wall.Round(time.Second))
	b.Logf("check gaps within %s: %d of %d (%.2f%%), worst gap %s", bound, onTime, gaps, share*100, worst.Round(time.Millisecond))
	b.Logf("gateway CPU %.1fs over %s = %.1f%% of one core", cpu.Seconds(), wall.Round(time.Second), cpuShare*100)
	b.Logf("gateway RSS %d KB (peak %d KB, idle %d KB): %.0f KB/target total, %.0f KB/target marginal",
		rss, hwm, idleRSS, float64(rss)/float64(benchTargets), float64(rss-idleRSS)/float64(benchTargets))
	b.Logf("gateway holds %d sockets for %d targets on %d clusters (client-go shares one transport per cluster TLS config)",
		sockets, benchTargets, benchClusters)
	gw.logRuntime(b)
	if running != benchTargets {
		b.Errorf("%d of %d targets running", running, benchTargets)
	}
	checks := 0
	for _, at := range seen {
		for t := range at {
			if t.After(t0) {
				checks++
			}
		}
	}
	reportAPIRequests(b, requests0, apiRequests(ctx, b, clusters), checks)
}

// requestResources are the resources the gateway's health checks and
// lifecycle touch; nothing else in the bench clusters asks for them in the
// steady state (kwok and the scheduler hold watches, opened before).
var requestResources = []string{"selfsubjectrulesreviews", "selfsubjectaccessreviews", "configmaps", "pods", "leases"}

// apiRequests reads the API servers' own request counters for
// requestResources, summed over the clusters, keyed "resource verb".
func apiRequests(ctx context.Context, b *testing.B, clusters []*cluster.Cluster) map[string]float64 {
	totals := map[string]float64{}
	for _, c := range clusters {
		raw, err := kubernetes.NewForConfigOrDie(c.AdminConfig()).Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			b.Logf("metrics of %s: %v", c.Name, err)
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(raw)))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "apiserver_request_total{") {
				continue
			}
			for _, res := range requestResources {
				if strings.Contains(line, `resource="`+res+`"`) && label(line, "subresource") == "" {
					v, _ := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
					totals[res+" "+label(line, "verb")] += v
				}
			}
		}
	}
	return totals
}

// label returns a label's value in one exposition line.
func label(line, name string) string {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// reportAPIRequests logs what the measured window cost the API servers,
// per request kind and per health check.
func reportAPIRequests(b *testing.B, before, after map[string]float64, checks int) {
	keys := make([]string, 0, len(after))
	for k := range after {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var total float64
	b.Logf("API server requests in the measured window over %d checks:", checks)
	for _, k := range keys {
		d := after[k] - before[k]
		if d == 0 {
			continue
		}
		total += d
		b.Logf("  %-34s %8.0f  %.2f per check", k, d, d/math.Max(1, float64(checks)))
	}
	b.Logf("  %-34s %8.0f  %.2f per check", "total", total, total/math.Max(1, float64(checks)))
	b.ReportMetric(total/math.Max(1, float64(checks)), "requests/check")
}

func waitAllChecked(ctx context.Context, b *testing.B, gw *gatewayProc) {
	deadline := time.Now().Add(3 * benchInterval)
	for {
		list := gw.targets(b)
		checked := 0
		for _, tg := range list {
			if tg.LastCheck != nil {
				checked++
			}
		}
		if len(list) == benchTargets && checked == benchTargets {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.Fatalf("after warm-up %d targets listed, %d checked", len(list), checked)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

type gatewayProc struct {
	cmd  *exec.Cmd
	base string
	// meshAddr is where it accepts mesh peers, when started with
	// --mesh-listen.
	meshAddr string
	// token goes with its calls, for a gateway started with a tokens file.
	token string
	// targetsDir is its --targets-dir.
	targetsDir string
}

func buildGateway(b *testing.B) string { return goBuild(b, "github.com/jetway-ci/jetway/cmd/gateway") }

// goBuild builds the command pkg into a temporary folder and returns the
// binary.
func goBuild(b *testing.B, pkg string) string {
	bin := filepath.Join(b.TempDir(), path.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		b.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// startGateway runs bin as a gateway over the targets in dir, with flags:
// without authentication unless they name an --auth-tokens-file (then set
// the returned gateway's token). It returns once the gateway serves HTTP
// and, with --mesh-listen, accepts mesh peers.
func startGateway(b *testing.B, bin, dir string, flags ...string) *gatewayProc {
	args := []string{"run", "--listen", "127.0.0.1:0", "--targets-dir", dir, "--health-interval", benchInterval.String()}
	if !slices.Contains(flags, "--auth-tokens-file") {
		args = append(args, "--no-auth")
	}
	cmd := exec.Command(bin, append(args, flags...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	addr, meshAddr := make(chan string, 1), make(chan string, 1)
	// BENCH_GATEWAY_LOG, if set, is a file that gets the whole log.
	var all io.Writer = io.Discard
	if path := os.Getenv("BENCH_GATEWAY_LOG"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		all = f
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			_, _ = fmt.Fprintln(all, sc.Text())
			var line struct{ Msg, Level, Addr, Address string }
			_ = json.Unmarshal(sc.Bytes(), &line)
			switch {
			case line.Msg == "serving http":
				addr <- line.Addr
			case line.Msg == "mesh listening":
				meshAddr <- line.Address
			case line.Level == "WARN" && !strings.Contains(line.Msg, "without authentication"), line.Level == "ERROR":
				b.Log(sc.Text())
			}
		}
	}()
	gw := &gatewayProc{cmd: cmd, targetsDir: dir}
	timeout := time.After(10 * time.Second)
	for gw.base == "" || slices.Contains(flags, "--mesh-listen") && gw.meshAddr == "" {
		select {
		case a := <-addr:
			gw.base = "http://" + a
		case a := <-meshAddr:
			gw.meshAddr = a
		case <-timeout:
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b.Fatal("gateway did not start serving")
		}
	}
	return gw
}

func (g *gatewayProc) stop(b *testing.B) {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	_ = g.cmd.Wait()
}

func (g *gatewayProc) targets(b *testing.B) []api.Target {
	var list []api.Target
	g.get(b, "/api/v1/targets", &list)
	return list
}

// get decodes the answer to GET path into out.
func (g *gatewayProc) get(b *testing.B, path string, out any) {
	req, err := http.NewRequest(http.MethodGet, g.base+path, nil)
	if err != nil {
		b.Fatal(err)
	}
	if g.token != "" {
		req.Header.Set("Authorization", "Bearer "+g.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		b.Fatal(err)
	}
}

// cpu is the process's user+system CPU time.
func (g *gatewayProc) cpu() time.Duration { return procCPU(g.cmd.Process.Pid) }

// sockets counts the process's open sockets (listener included).
func (g *gatewayProc) sockets() int {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", g.cmd.Process.Pid))
	n := 0
	for _, fd := range fds {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", g.cmd.Process.Pid, fd.Name())); err == nil && strings.HasPrefix(link, "socket:") {
			n++
		}
	}
	return n
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// status reads a kB value such as VmRSS from /proc/<pid>/status.
func (g *gatewayProc) status(key string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

// logRuntime logs where the gateway's memory is, from its Go collector:
// goroutines, stacks and heap, per target.
func (g *gatewayProc) logRuntime(b *testing.B) {
	resp, err := http.Get(g.base + "/metrics")
	if err != nil {
		b.Logf("metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	want := map[string]float64{"go_goroutines": 0, "go_memstats_stack_inuse_bytes": 0, "go_memstats_heap_inuse_bytes": 0}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if _, known := want[name]; ok && known {
			want[name], _ = strconv.ParseFloat(value, 64)
		}
	}
	n := float64(benchTargets)
	b.Logf("gateway runtime: %.0f goroutines (%.1f per target), stacks %.0f KB (%.1f KB/target), heap in use %.0f KB (%.1f KB/target)",
		want["go_goroutines"], want["go_goroutines"]/n, want["go_memstats_stack_inuse_bytes"]/1024,
		want["go_memstats_stack_inuse_bytes"]/1024/n, want["go_memstats_heap_inuse_bytes"]/1024, want["go_memstats_heap_inuse_bytes"]/1024/n)
}
