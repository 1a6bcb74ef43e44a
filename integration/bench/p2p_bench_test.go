package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// Settings of the p2p benchmark: the artifact's size (BENCH_P2P_MIB) and
// the builds of each path after one to warm up (BENCH_P2P_BUILDS).
var (
	p2pMiB    = envInt("BENCH_P2P_MIB", 1024)
	p2pBuilds = envInt("BENCH_P2P_BUILDS", 2)
)

// The p2p benchmark's targets: a and b in one local cluster, c in
// another. Each is tagged with its name.
var p2pTargets = []struct {
	name    string
	cluster int
}{{"p2p-a", 0}, {"p2p-b", 0}, {"p2p-c", 1}}

// BenchmarkConcourseP2P runs one job per path, a task writing an N-byte
// artifact (incompressible, default 1 GiB) and a task on another worker
// reading and checking it (cwn.ArtifactPipeline), through real web nodes:
// (a) on the one stock Concourse worker this machine can run (its socket
// and bridge are fixed), so no stream: the baseline of the two tasks
// alone; (b) from jetway target p2p-a to p2p-b in one local cluster and
// (c) from p2p-a to p2p-c in another, jetway carrying the artifact (the
// web node with p2p streaming); (d) as c with a web node without p2p,
// relaying the artifact itself. A gateway process owns the three targets,
// registered over REST. It reports each path's median build time, its
// stream's time (the web node's stream.start to stream.end) and rate, the
// gateway's and the web node's CPU per GiB over the build, and the
// ratios. The goals (issue 44): c's rate at least 3x d's.
func BenchmarkConcourseP2P(b *testing.B) {
	for range b.N {
		runP2PBench(b)
	}
}

// p2pRun is one build's measures.
type p2pRun struct {
	build, stream time.Duration
	gatewayCPU    time.Duration
	webCPU        time.Duration
}

func runP2PBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cs := cluster.ForTest(b, 2)
	agent := buildStepAgent(b)
	kctx, stopKubelets := context.WithCancel(ctx)
	var kwg sync.WaitGroup
	defer func() { stopKubelets(); kwg.Wait() }()
	for _, c := range cs {
		kwg.Go(func() {
			if err := c.RunStepPods(kctx, agent); err != nil && kctx.Err() == nil {
				b.Error(err)
			}
		})
	}
	dir := b.TempDir()
	for _, tg := range p2pTargets {
		made, err := cs[tg.cluster].CreateTarget(ctx, cluster.TargetOptions{Namespace: "bench-" + tg.name, Rules: targets.RBACRules(targets.Required)})
		check(b, err)
		check(b, os.MkdirAll(filepath.Join(dir, tg.name), 0o700))
		check(b, writeFile(filepath.Join(dir, tg.name, "kubeconfig"), made.Kubeconfig))
		check(b, writeFile(filepath.Join(dir, tg.name, "target.yaml"), []byte("tags: ["+tg.name+"]\n")))
	}
	state, err := cs[0].CreateTarget(ctx, cluster.TargetOptions{Namespace: "bench-p2p-state", Rules: targets.RBACRules(steps.StatePermissions)})
	check(b, err)
	stateFile := filepath.Join(b.TempDir(), "state.kubeconfig")
	check(b, writeFile(stateFile, state.Kubeconfig))
	bin := buildGateway(b)
	size := int64(p2pMiB) << 20
	image := "docker:///" + kwokNode.image

	runs := map[string][]p2pRun{}
	for _, p2p := range []bool{true, false} {
		client := cwn.Client{ID: "jetway", Secret: "bench-s3cret"}
		web := cwn.ForTest(b, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second, NoP2P: !p2p})
		secret := filepath.Join(b.TempDir(), "secret")
		check(b, writeFile(secret, []byte(client.Secret)))
		gw := startGateway(b, bin, dir, "--state-kubeconfig", stateFile, "--state-namespace", "bench-p2p-state",
			"--concourse-url", web.URL, "--concourse-client-id", client.ID, "--concourse-client-secret-file", secret,
			"--concourse-worker-address", "127.0.0.1", "--concourse-insecure", "--concourse-web-node-networks", "127.0.0.1",
			"--step-default-cpu-request", "10m")
		waitFor(b, 2*time.Minute, func() error {
			running := 0
			for _, w := range web.Workers(b) {
				if strings.HasPrefix(w.Name, "p2p-") && w.State == "running" {
					running++
				}
			}
			if running < len(p2pTargets) {
				return fmt.Errorf("%d of %d workers running", running, len(p2pTargets))
			}
			return nil
		})
		jobs := []cwn.ArtifactJob{{Name: "d-relayed", Tags: []string{"p2p-a"}, CheckTags: []string{"p2p-c"}, RootfsURI: image}}
		if p2p {
			stock := cwn.StockForTest(b, web, cwn.StockOptions{})
			jobs = []cwn.ArtifactJob{
				{Name: "a-stock", Tags: []string{cwn.StockTag}, RootfsURI: "raw://" + stock.Rootfs},
				{Name: "b-one-cluster", Tags: []string{"p2p-a"}, CheckTags: []string{"p2p-b"}, RootfsURI: image},
				{Name: "c-two-clusters", Tags: []string{"p2p-a"}, CheckTags: []string{"p2p-c"}, RootfsURI: image},
			}
		}
		p := filepath.Join(b.TempDir(), "p2p.yml")
		check(b, writeFile(p, []byte(cwn.ArtifactPipeline(size, jobs...))))
		fly := flyer(ctx, b, web, 15*time.Minute)
		fly("set-pipeline", "-n", "-p", "p2p", "-c", p)
		fly("unpause-pipeline", "-p", "p2p")
		for n := range p2pBuilds + 1 { // the first of each warms up
			for _, j := range jobs {
				gw0, web0 := gw.cpu(), procCPU(web.PID())
				out := fly("trigger-job", "-j", "p2p/"+j.Name, "--watch")
				if !strings.Contains(out, fmt.Sprintf("made %d bytes", size)) || !strings.Contains(out, cwn.ArtifactMarker) {
					b.Fatalf("%s build %d: the artifact was not made or not read back whole:\n%s", j.Name, n+1, out)
				}
				log := filepath.Join(web.Dir, "web.log")
				r := p2pRun{build: stepTimes(b, log, "p2p", j.Name, n+1)["build"], stream: streamTime(b, log, "p2p", j.Name, n+1),
					gatewayCPU: gw.cpu() - gw0, webCPU: procCPU(web.PID()) - web0}
				b.Logf("%s build %d: %s, stream %s", j.Name, n+1, r.build.Round(time.Millisecond), r.stream.Round(time.Millisecond))
				if n > 0 {
					runs[j.Name] = append(runs[j.Name], r)
				}
			}
		}
		if p2p && slices.Contains(fallbacks(b, filepath.Join(web.Dir, "web.log")), "p2p") {
			b.Errorf("the web node fell back to relaying a p2p stream")
		}
		gw.stop(b)
		web.Stop()
	}
	reportP2P(b, size, runs)
}

// streamTime is the time of the web node's stream of a volume in build n
// of pipeline's job: from its stream.start to its stream.end (0 if the
// build streamed nothing: its steps ran on one worker).
func streamTime(b *testing.B, log, pipeline, job string, n int) time.Duration {
	f, err := os.Open(log)
	check(b, err)
	defer f.Close()
	var began time.Time
	var took time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Timestamp time.Time
			Message   string
			Data      map[string]any
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Data["build"] != strconv.Itoa(n) || l.Data["pipeline"] != pipeline || l.Data["job"] != job {
			continue
		}
		switch {
		case strings.HasSuffix(l.Message, ".stream.start"):
			began = l.Timestamp
		case strings.HasSuffix(l.Message, ".stream.end") && !began.IsZero():
			took += l.Timestamp.Sub(began)
		}
	}
	check(b, sc.Err())
	return took
}

// fallbacks are "p2p" once per p2p stream the web node's log says it
// relayed after the stream failed.
func fallbacks(b *testing.B, log string) []string {
	data, err := os.ReadFile(log)
	check(b, err)
	var out []string
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, "p2p-stream-failed-falling-back-to-atc") {
			out = append(out, "p2p")
		}
	}
	return out
}

// reportP2P prints the paths' table and ratios, and reports them.
func reportP2P(b *testing.B, size int64, runs map[string][]p2pRun) {
	gib := float64(size) / (1 << 30)
	median := func(rs []p2pRun, f func(p2pRun) time.Duration) time.Duration {
		ds := make([]time.Duration, len(rs))
		for i, r := range rs {
			ds[i] = f(r)
		}
		slices.Sort(ds)
		if len(ds)%2 == 0 { // the mean of the middle two
			return (ds[len(ds)/2-1] + ds[len(ds)/2]) / 2
		}
		return ds[len(ds)/2]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d MiB artifact, median of %d builds per path\n", size>>20, p2pBuilds)
	fmt.Fprintf(&sb, "%-16s %10s %10s %10s %14s %14s %10s\n", "path", "build", "stream", "MB/s", "gw CPU s/GiB", "web CPU s/GiB", "build/a")
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range runs {
			if !yield(k) {
				return
			}
		}
	})
	base := median(runs["a-stock"], func(r p2pRun) time.Duration { return r.build })
	rate := map[string]float64{}
	for _, name := range names {
		rs := runs[name]
		build, stream := median(rs, func(r p2pRun) time.Duration { return r.build }), median(rs, func(r p2pRun) time.Duration { return r.stream })
		gwCPU, webCPU := median(rs, func(r p2pRun) time.Duration { return r.gatewayCPU }), median(rs, func(r p2pRun) time.Duration { return r.webCPU })
		mbps := "-"
		if stream > 0 {
			rate[name] = float64(size) / 1e6 / stream.Seconds()
			mbps = fmt.Sprintf("%.0f", rate[name])
			b.ReportMetric(rate[name], name+"-MB/s")
		}
		fmt.Fprintf(&sb, "%-16s %10s %10s %10s %14.2f %14.2f %9.2fx\n", name, build.Round(time.Millisecond), stream.Round(time.Millisecond), mbps,
			gwCPU.Seconds()/gib, webCPU.Seconds()/gib, build.Seconds()/base.Seconds())
		b.ReportMetric(build.Seconds(), name+"-build-s")
	}
	if rate["d-relayed"] > 0 {
		fmt.Fprintf(&sb, "c/d transfer rate: %.2fx (goal >= 3)\n", rate["c-two-clusters"]/rate["d-relayed"])
		b.ReportMetric(rate["c-two-clusters"]/rate["d-relayed"], "c/d-rate")
	}
	if rate["c-two-clusters"] > 0 {
		fmt.Fprintf(&sb, "b/c transfer rate: %.2fx\n", rate["b-one-cluster"]/rate["c-two-clusters"])
	}
	b.Log(sb.String())
}
