package bench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Settings of the benchmark; BENCH_CONCOURSE_TARGETS and
// BENCH_CONCOURSE_STEADY shrink it for a quick try.
var (
	concourseTargets = envInt("BENCH_CONCOURSE_TARGETS", 100)
	concourseSteady  = envDuration("BENCH_CONCOURSE_STEADY", 2*time.Minute)
)

// BenchmarkConcourseRegistration registers 100 targets (namespaces over
// three local clusters) with one real web node through a real `gateway
// run`: the time until fly lists all of them running, the gateway's CPU
// and memory per registered target at steady state, and the web node's
// CPU for their heartbeats and sweeps against 100 idle stock-shaped
// registrations (forward-worker answering empty lists and a sweep round
// every 30 s, as an idle Concourse worker does) made by this process, in
// the same run and the same window.
func BenchmarkConcourseRegistration(b *testing.B) {
	for range b.N {
		runConcourseBench(b)
	}
}

func runConcourseBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	clusters := cluster.ForTest(b, 3)
	web := cwn.ForTest(b, cwn.Options{})
	dir := b.TempDir()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range concourseTargets {
		g.Go(func() error {
			t, err := clusters[i%3].CreateTarget(gctx, cluster.TargetOptions{Namespace: fmt.Sprintf("cc-%03d", i),
				Rules: targets.RBACRules(targets.Required)})
			if err != nil {
				return err
			}
			return writeFile(filepath.Join(dir, fmt.Sprintf("cc-%03d.kubeconfig", i)), t.Kubeconfig)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}

	bin := buildGateway(b)
	// The web node's own cost, with no worker, over the same window.
	web0 := procCPU(web.PID())
	time.Sleep(concourseSteady)
	webIdle := procCPU(web.PID()) - web0
	b.ResetTimer()
	start := time.Now()
	gw := startGateway(b, bin, dir, "--concourse-tsa", web.TSAAddr, "--concourse-tsa-public-key", web.TSAPublicKey,
		"--concourse-worker-key", web.WorkerKey)
	waitRunning(b, web, "cc-", concourseTargets)
	toRunning := time.Since(start)
	gwCPU0 := gw.cpu()
	web0 = procCPU(web.PID())
	time.Sleep(concourseSteady)
	gwCPU, webJetway := gw.cpu()-gwCPU0, procCPU(web.PID())-web0
	rss := gw.status("VmRSS")
	gw.stop(b)
	// Its workers stall without their sessions; pruned, they cost the web
	// node nothing in the next window.
	waitFor(b, 3*time.Minute, func() error {
		if _, err := web.Fly("prune-worker", "--all-stalled"); err != nil {
			return err
		}
		for _, w := range web.Workers(b) {
			if len(w.Name) > 3 && w.Name[:3] == "cc-" {
				return fmt.Errorf("worker %s is %s", w.Name, w.State)
			}
		}
		return nil
	})

	// The same number of stock-shaped registrations, from this process.
	hostKeys, err := concourse.LoadHostKeys(web.TSAPublicKey)
	if err != nil {
		b.Fatal(err)
	}
	key, err := concourse.LoadWorkerKey(web.WorkerKey)
	if err != nil {
		b.Fatal(err)
	}
	tsa := concourse.TSA{Addrs: []string{web.TSAAddr}, HostKeys: hostKeys, Key: key}
	sctx, stopStock := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range concourseTargets {
		w := wire.Worker{Name: fmt.Sprintf("stock-%03d", i), Platform: "linux", Version: wire.WorkerVersion,
			GardenAddr: "0.0.0.0:7777", BaggageclaimURL: "http://0.0.0.0:7788"}
		wg.Go(func() { _ = tsa.Forward(sctx, w, stockGarden(), stockVolumes(), nil) })
		wg.Go(func() { stockSweeps(sctx, tsa, w) })
	}
	waitRunning(b, web, "stock-", concourseTargets)
	web0 = procCPU(web.PID())
	time.Sleep(concourseSteady)
	webStock := procCPU(web.PID()) - web0
	stopStock()
	wg.Wait()
	b.StopTimer()

	n := float64(concourseTargets)
	b.Logf("%d targets registered with one web node; steady window %s", concourseTargets, concourseSteady)
	b.Logf("time until fly lists all running: %s", toRunning.Round(10*time.Millisecond))
	b.Logf("gateway: CPU %.1f ms/s per registered target, RSS %.1f KiB per target (%d KiB in all)",
		gwCPU.Seconds()*1000/concourseSteady.Seconds()/n, float64(rss)/n, rss)
	b.Logf("web node CPU over the window: idle %s, with jetway's %s, with the stock-shaped %s; above idle, jetway/stock %.2f",
		webIdle.Round(time.Millisecond), webJetway.Round(time.Millisecond), webStock.Round(time.Millisecond),
		(webJetway-webIdle).Seconds()/(webStock-webIdle).Seconds())
	b.ReportMetric(toRunning.Seconds(), "s-to-all-running")
	b.ReportMetric(gwCPU.Seconds()*1000/concourseSteady.Seconds()/n, "gateway-CPU-ms/s/target")
	b.ReportMetric(float64(rss)/n, "gateway-RSS-KiB/target")
	b.ReportMetric((webJetway-webIdle).Seconds()/(webStock-webIdle).Seconds(), "web-CPU-jetway/stock")
}

// stockSweeps runs an idle Concourse worker's garbage-collection rounds
// (worker/container_sweeper.go, volume_sweeper.go): every 30 s, report
// no container, ask which to destroy, and the same for volumes.
func stockSweeps(ctx context.Context, tsa concourse.TSA, w wire.Worker) {
	tick := time.NewTicker(concourse.DefaultSweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, command := range []string{"report-containers", "sweep-containers", "report-volumes", "sweep-volumes"} {
			_, _ = tsa.Command(ctx, command, w)
		}
	}
}

// waitRunning waits until fly lists n workers named prefix... running.
func waitRunning(b *testing.B, web *cwn.WebNode, prefix string, n int) {
	waitFor(b, 5*time.Minute, func() error {
		running := 0
		for _, w := range web.Workers(b) {
			if len(w.Name) >= len(prefix) && w.Name[:len(prefix)] == prefix && w.State == "running" {
				running++
			}
		}
		if running < n {
			return fmt.Errorf("%d of %d %s* workers running", running, n, prefix)
		}
		return nil
	})
}

// stockGarden and stockVolumes answer what an idle worker answers the
// TSA's heartbeat: no containers, no volumes.
func stockGarden() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"handles":[]}`))
	})
}

func stockVolumes() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[]`))
	})
}
