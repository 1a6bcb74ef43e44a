package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// benchInFlight is how many steps the replicas benchmark keeps in flight,
// as a CI's parallel jobs would.
var benchInFlight = envInt("BENCH_IN_FLIGHT", 10)

// BenchmarkStepsReplicas runs the same batch of short tasks (BENCH_STEPS,
// default 100; BENCH_IN_FLIGHT at once) through one gateway, then through
// two replicas sharing its target and state namespace (each task
// submitted to, owned and followed by one of them in turn), alternating,
// BENCH_ROUNDS times (default 2), in one run. It reports each setup's
// throughput (tasks per second, from the first submit to the last exited
// event) and p50 from submit to the process's start, and the ratios of
// two replicas to one.
func BenchmarkStepsReplicas(b *testing.B) {
	for range b.N {
		runReplicasBench(b)
	}
}

// batch is one batch's latencies and its throughput.
type batch struct {
	lat     latencies
	perSec  float64
	elapsed time.Duration
}

func runReplicasBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	bed := newStepsBed(ctx, b, kwokNode)
	defer bed.stop()
	first := bed.gateway(b, "")
	defer first.stop(b)
	var one, two []batch
	for round := range envInt("BENCH_ROUNDS", 2) {
		one = append(one, runBatch(ctx, b, []*gatewayProc{first}, fmt.Sprintf("one-%d", round)))
		second := bed.gateway(b, "")
		two = append(two, runBatch(ctx, b, []*gatewayProc{first, second}, fmt.Sprintf("two-%d", round)))
		second.stop(b)
	}
	sum := func(bs []batch) (batch, float64) {
		var all batch
		var perSec float64
		for _, bt := range bs {
			all.lat.start = append(all.lat.start, bt.lat.start...)
			all.lat.exit = append(all.lat.exit, bt.lat.exit...)
			perSec += bt.perSec
		}
		return all, perSec / float64(len(bs))
	}
	oneAll, onePerSec := sum(one)
	twoAll, twoPerSec := sum(two)
	for _, bt := range append(one, two...) {
		b.Logf("batch: %.1f tasks/s (%s), start p50 %s", bt.perSec, bt.elapsed.Round(time.Millisecond), quantile(bt.lat.start, 0.5))
	}
	b.ReportMetric(onePerSec, "one-tasks/s")
	b.ReportMetric(twoPerSec, "two-tasks/s")
	b.ReportMetric(twoPerSec/onePerSec, "throughput-ratio")
	b.ReportMetric(float64(quantile(oneAll.lat.start, 0.5).Microseconds())/1000, "one-start-p50-ms")
	b.ReportMetric(float64(quantile(twoAll.lat.start, 0.5).Microseconds())/1000, "two-start-p50-ms")
	b.ReportMetric(ratio(twoAll.lat.start, oneAll.lat.start, 0.5), "start-p50-ratio")
	b.ReportMetric(ratio(twoAll.lat.start, oneAll.lat.start, 0.99), "start-p99-ratio")
	b.Logf("one gateway: %.1f tasks/s, start p50 %s p99 %s; two replicas: %.1f tasks/s, start p50 %s p99 %s",
		onePerSec, quantile(oneAll.lat.start, 0.5), quantile(oneAll.lat.start, 0.99),
		twoPerSec, quantile(twoAll.lat.start, 0.5), quantile(twoAll.lat.start, 0.99))
}

// runBatch runs benchSteps tasks through the gateways, each submitted to
// the next in turn, benchInFlight at once.
func runBatch(ctx context.Context, b *testing.B, gws []*gatewayProc, name string) batch {
	todo := make(chan int)
	var mu sync.Mutex
	var bt batch
	var wg sync.WaitGroup
	start := time.Now()
	for range benchInFlight {
		wg.Go(func() {
			for i := range todo {
				s := jetwayStep(ctx, b, kwokNode, gws[i%len(gws)].base, fmt.Sprintf("%s-%d", name, i))
				mu.Lock()
				bt.lat.add(b, s)
				mu.Unlock()
			}
		})
	}
	for i := range benchSteps {
		todo <- i
	}
	close(todo)
	wg.Wait()
	bt.elapsed = time.Since(start)
	bt.perSec = float64(benchSteps) / bt.elapsed.Seconds()
	return bt
}
