package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/kubecount"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// sweepContainers is how many containers the sweep benchmark keeps
// (BENCH_SWEEP_CONTAINERS).
var sweepContainers = envInt("BENCH_SWEEP_CONTAINERS", 1000)

// BenchmarkConcourseSweep times the sweep that reports a target's
// containers to the web node (concourse.Pods.Containers, the code the
// web node's report-containers runs) with 1,000 containers recorded in a
// local cluster's state namespace, two ways in one run, alternating: (a)
// the records listed from the API server each sweep, as before the
// records' watch; (b) read from the watch (ContainerRecords.Start). It
// reports each way's median sweep, the ratio, and the API requests one
// sweep makes. The containers' pods are not made: each container is
// younger than a create's timeout, so the sweep takes it as being made
// and reads no pod, and what is timed is the records' part, the one that
// grows with the containers.
func BenchmarkConcourseSweep(b *testing.B) {
	for range b.N {
		runSweepBench(b)
	}
}

func runSweepBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.ForTest(b, 1)[0]
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "sweep", Rules: targets.RBACRules(targets.Required)})
	check(b, err)
	st, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "sweep-state", Rules: targets.RBACRules(steps.StatePermissions)})
	check(b, err)
	targetREST, err := clientcmd.RESTConfigFromKubeConfig(tg.Kubeconfig)
	check(b, err)
	stateREST, err := clientcmd.RESTConfigFromKubeConfig(st.Kubeconfig)
	check(b, err)

	target, err := targets.NewTarget(&targets.Config{Name: "sweep", Meta: targets.Metadata{Namespace: "sweep"}, REST: targetREST}, "bench")
	check(b, err)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { target.Run(ctx) })
	records := func(start bool) (*concourse.ContainerRecords, *kubecount.Counts) {
		counts := &kubecount.Counts{}
		rc := rest.CopyConfig(stateREST)
		rc.QPS, rc.Burst = 100, 200
		rc.Wrap(counts.Wrap)
		client, err := kubernetes.NewForConfig(rc)
		check(b, err)
		r := &concourse.ContainerRecords{Secrets: client.CoreV1().Secrets("sweep-state"), Installation: "bench"}
		if start {
			wg.Go(func() { _ = r.Start(ctx) })
		}
		return r, counts
	}
	listing, listCounts := records(false)
	watching, watchCounts := records(true)

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range sweepContainers {
		g.Go(func() error {
			h := fmt.Sprintf("sweep-%04d", i)
			return listing.Create(gctx, &concourse.Container{Target: "sweep", Pod: "concourse-" + h, Image: "busybox",
				Spec: garden.ContainerSpec{Handle: h, Env: []string{"A=1"}}, Created: time.Now().UTC()})
		})
	}
	check(b, g.Wait())
	key, err := ownership.NewKey(make([]byte, 32))
	check(b, err)
	pods := func(r *concourse.ContainerRecords) concourse.Pods {
		return concourse.Pods{Targets: oneTarget{target}, Key: func() ownership.Key { return key }, Records: r}
	}
	sweep := func(p concourse.Pods) time.Duration {
		start := time.Now()
		handles, err := p.Containers(ctx, "sweep")
		took := time.Since(start)
		check(b, err)
		if len(handles) != sweepContainers {
			b.Fatalf("the sweep reported %d containers, not %d", len(handles), sweepContainers)
		}
		return took
	}
	waitFor(b, time.Minute, func() error {
		if ok, err := watching.Synced(); !ok {
			return fmt.Errorf("the records' watch has not listed them: %v", err)
		}
		if ok, err := target.Synced(); !ok {
			return fmt.Errorf("the target's pods are not listed: %v", err)
		}
		cts, err := watching.List(ctx, "sweep")
		if err != nil || len(cts) != sweepContainers {
			return fmt.Errorf("the watch shows %d records: %v", len(cts), err)
		}
		return nil
	})

	b.ResetTimer()
	const rounds = 20
	var listed, watched []time.Duration
	l0, w0 := total(listCounts), total(watchCounts)
	for range rounds {
		listed = append(listed, sweep(pods(listing)))
		watched = append(watched, sweep(pods(watching)))
	}
	b.StopTimer()
	perList := float64(total(listCounts)-l0) / rounds
	perWatch := float64(total(watchCounts)-w0) / rounds
	ml, mw := quantile(listed, 0.5), quantile(watched, 0.5)
	b.Logf("a sweep of %d containers: listed from the API server %s (%.1f requests), read from the watch %s (%.1f requests): %.0fx",
		sweepContainers, ml.Round(time.Microsecond), perList, mw.Round(time.Microsecond), perWatch, ml.Seconds()/mw.Seconds())
	b.ReportMetric(ml.Seconds()*1000, "ms/sweep-listed")
	b.ReportMetric(mw.Seconds()*1000, "ms/sweep-watched")
	b.ReportMetric(ml.Seconds()/mw.Seconds(), "listed/watched")
	b.ReportMetric(perWatch, "requests/sweep-watched")
}

// oneTarget is a registry of one target, for concourse.Pods.
type oneTarget struct{ t *targets.Target }

func (o oneTarget) Target(name string) (*targets.Target, error) {
	if name != o.t.Name() {
		return nil, targets.ErrNotFound
	}
	return o.t, nil
}

// total is every request counts has seen.
func total(counts *kubecount.Counts) uint64 {
	var n uint64
	counts.Each(func(_ kubecount.Request, c kubecount.Count) { n += c.Requests })
	return n
}
