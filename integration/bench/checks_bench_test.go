package bench

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/client"
)

// BenchmarkCheckSandboxes runs checks of one resource two ways in one run,
// alternating: in a fresh pod each (no reuse_key), and in the resource's
// warm sandbox (a reuse_key; the check that makes the sandbox is not
// counted). It reports p50 and p99 from the call (the client's
// CheckResource) to its answer (the versions), and the fresh pod's ratios
// to the warm sandbox: how many times faster warm is. For scale it also
// times a bare pods/exec of a shell command into the sandbox pod, the
// floor of any check run by exec in a live pod. It runs on kwok's node and
// on the real node, one after the other; the resource type is the test
// one (integration/testdata/resource), in the real node's busybox image.
func BenchmarkCheckSandboxes(b *testing.B) {
	for _, node := range benchNodes {
		b.Run(node.name, func(b *testing.B) {
			for range b.N {
				runChecksBench(b, node)
			}
		})
	}
}

func runChecksBench(b *testing.B, node benchNode) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var flags []string
	if !node.real { // the step kubelet runs the scripts where they lie
		scripts, err := filepath.Abs("../testdata/resource")
		if err != nil {
			b.Fatal(err)
		}
		flags = []string{"--resource-dir", scripts}
	}
	bed, gw, stop := stepsGateway(ctx, b, node, "", flags...)
	defer stop()
	c, err := client.New(client.Options{URL: gw.base})
	if err != nil {
		b.Fatal(err)
	}
	run := func(handle, reuse string) time.Duration {
		start := time.Now()
		versions, err := c.CheckResource(ctx, client.ResourceStep{Handle: handle, Image: node.image,
			Source: map[string]string{"uri": "https://example.com/repo.git"}, ReuseKey: reuse})
		took := time.Since(start)
		if err != nil || len(versions) != 2 {
			b.Fatalf("check %s: %v, %v", handle, versions, err)
		}
		if reuse == "" { // its pod stays for its log; not timed
			if _, err := c.Abort(ctx, "", handle); err != nil {
				b.Fatal(err)
			}
		}
		return took
	}
	made := run("warm-up", "repo")
	sandbox, err := c.Step(ctx, "", "warm-up")
	if err != nil {
		b.Fatal(err)
	}
	var fresh, warm, bare []time.Duration
	for i := range benchSteps {
		fresh = append(fresh, run(fmt.Sprintf("fresh-%d", i), ""))
		warm = append(warm, run(fmt.Sprintf("warm-%d", i), "repo"))
		var out bytes.Buffer
		start := time.Now()
		if err := execOnce(ctx, bed.restCfg, sandbox.Pod, node.script, &out); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(start))
	}
	b.Logf("the check that made the sandbox: %s", made)
	for _, q := range []float64{0.5, 0.99} {
		p := "p" + strconv.Itoa(int(q*100))
		b.ReportMetric(float64(quantile(fresh, q).Microseconds())/1000, "fresh-"+p+"-ms")
		b.ReportMetric(float64(quantile(warm, q).Microseconds())/1000, "warm-"+p+"-ms")
		b.ReportMetric(float64(quantile(bare, q).Microseconds())/1000, "bare-exec-"+p+"-ms")
		b.ReportMetric(ratio(fresh, warm, q), "fresh/warm-"+p)
		b.ReportMetric(ratio(warm, bare, q), "warm/bare-exec-"+p)
	}
	b.Logf("fresh pod: p50 %s p99 %s; warm sandbox: p50 %s p99 %s; bare exec: p50 %s p99 %s",
		quantile(fresh, 0.5), quantile(fresh, 0.99), quantile(warm, 0.5), quantile(warm, 0.99), quantile(bare, 0.5), quantile(bare, 0.99))
}
