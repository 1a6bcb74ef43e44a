package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
)

// Settings of the built-image benchmark: the rootfs's size past its
// busybox files (BENCH_IMAGE_MIB) and the builds each path runs after one
// to warm up (BENCH_IMAGE_BUILDS).
var (
	imageMiB    = envInt("BENCH_IMAGE_MIB", 200)
	imageBuilds = envInt("BENCH_IMAGE_BUILDS", 3)
)

// imageSteps are the built-image job's tasks: make writes the rootfs,
// first runs in it, reuse runs in it again (another copy of the same
// volume).
var imageSteps = []string{"make", "first", "reuse"}

// builtImagePipeline is one job per worker: a task writes a rootfs of the
// busybox it runs in plus size bytes of incompressible data, with a
// metadata.json, and two tasks run in it as their image:.
func builtImagePipeline(size int64, jobs ...cwn.ArtifactJob) string {
	var b strings.Builder
	b.WriteString("jobs:\n")
	for _, j := range jobs {
		use := func(task string) string {
			return fmt.Sprintf(`  - task: %s
    tags: [%s]
    image: image
    config:
      platform: linux
      run: {path: sh, args: [-ec, 'test -s /blob; echo "%s ran in the built image"']}
`, task, strings.Join(j.Tags, ", "), task)
		}
		fmt.Fprintf(&b, `- name: %[1]s
  plan:
  - task: make
    tags: [%[2]s]
    config:
      platform: linux
      rootfs_uri: %[3]s
      outputs: [{name: image}]
      run: {path: sh, args: [-ec, 'mkdir -p image/rootfs; for d in bin sbin usr etc lib; do if [ -e /$d ]; then cp -a /$d image/rootfs/; fi; done; head -c %[4]d /dev/urandom >image/rootfs/blob; echo "{\"env\":[\"PATH=/usr/sbin:/usr/bin:/sbin:/bin\"],\"user\":\"\"}" >image/metadata.json']}
%[5]s%[6]s`, j.Name, strings.Join(j.Tags, ", "), j.RootfsURI, size, use("first"), use("reuse"))
	}
	return b.String()
}

// BenchmarkConcourseBuiltImage: a task whose image is a rootfs the task
// before it built (busybox plus BENCH_IMAGE_MIB, default 200 MiB, of
// incompressible data), through one real web node on (a) a stock
// Concourse containerd worker and (b) a jetway target on the real node
// whose holder serves images (steps.volumeHolder.images: NodePort),
// alternating builds: the first task in the image (jetway: the layer's
// digest made, the layer pulled by the node's containerd from the
// holder) and a second one (another cow of the same volume: the digest
// inherited, the layer already on the node). It reports each step's
// median and the ratio b/a. Goals (issue 42): first use at most 2x the
// stock worker's, reuse at most 1.2x.
func BenchmarkConcourseBuiltImage(b *testing.B) {
	for range b.N {
		runBuiltImageBench(b)
	}
}

func runBuiltImageBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	bed := newStepsBed(ctx, b, realNode)
	defer bed.stop()
	check(b, writeFile(filepath.Join(bed.dir, stepsTarget, "target.yaml"), []byte("tags: [jetway]\nsteps:\n  volumeHolder: {images: NodePort}\n")))
	web, gw := concourseBed(b, bed)
	defer gw.stop(b)
	stock := cwn.StockForTest(b, web, cwn.StockOptions{})
	fly := flyer(ctx, b, web, 10*time.Minute)
	image := "docker:///" + strings.TrimSuffix(cluster.BusyboxImage, ":1") + "#1"
	const name = "built-image"
	p := filepath.Join(b.TempDir(), name+".yml")
	check(b, writeFile(p, []byte(builtImagePipeline(int64(imageMiB)<<20,
		cwn.ArtifactJob{Name: "stock", Tags: []string{cwn.StockTag}, RootfsURI: "raw://" + stock.Rootfs},
		cwn.ArtifactJob{Name: "jetway", Tags: []string{"jetway"}, RootfsURI: image}))))
	fly("set-pipeline", "-n", "-p", name, "-c", p)
	fly("unpause-pipeline", "-p", name)
	took := map[string][]map[string]time.Duration{}
	for n := range imageBuilds + 1 { // the first of each warms up
		order := []string{"stock", "jetway"}
		if n%2 == 1 {
			order = []string{"jetway", "stock"}
		}
		for _, job := range order {
			out := fly("trigger-job", "-j", name+"/"+job, "--watch")
			if !strings.Contains(out, "reuse ran in the built image") {
				b.Fatalf("%s build %d: the tasks did not run in the built image:\n%s", job, n+1, out)
			}
			steps := stepTimes(b, filepath.Join(web.Dir, "web.log"), name, job, n+1)
			if n > 0 {
				took[job] = append(took[job], steps)
			}
			b.Logf("%s build %d: %s (first %s, reuse %s)", job, n+1, steps["build"].Round(time.Millisecond),
				steps["first"].Round(time.Millisecond), steps["reuse"].Round(time.Millisecond))
		}
	}
	med := func(job, step string) time.Duration {
		var ds []time.Duration
		for _, s := range took[job] {
			ds = append(ds, s[step])
		}
		return quantile(ds, 0.5)
	}
	b.Logf("a task in a %d MiB rootfs built by the task before it, %d builds each, medians (web node's log):", imageMiB, imageBuilds)
	b.Logf("  %-6s %10s %10s %8s", "", "stock (a)", "jetway (b)", "b/a")
	for _, step := range slices.Concat([]string{"build"}, imageSteps) {
		a, j := med("stock", step), med("jetway", step)
		b.Logf("  %-6s %10s %10s %7.2fx", step, a.Round(time.Millisecond), j.Round(time.Millisecond), j.Seconds()/a.Seconds())
		b.ReportMetric(j.Seconds()/a.Seconds(), step+"-jetway/stock")
	}
	if pulls := holderPulls(ctx, b, bed.c); len(pulls) > 0 {
		b.Logf("  of jetway's first use, the node's pulls of the holder's image (kubelet's Pulled events): median %s of %d (%s)",
			quantile(pulls, 0.5).Round(time.Millisecond), len(pulls), pulls)
	}
}

// pulledIn is the time a kubelet's Pulled event says a pull took.
var pulledIn = regexp.MustCompile(`^Successfully pulled image "[^"]*/jetway/[^"]*" in ([0-9.]+[a-zµ]+) `)

// holderPulls are the pulls of images its volume holder served that the
// target's events record, as long as each took.
func holderPulls(ctx context.Context, b *testing.B, c *cluster.Cluster) []time.Duration {
	evs, err := c.Client.CoreV1().Events(stepsNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=Pulled"})
	check(b, err)
	var took []time.Duration
	for _, ev := range evs.Items {
		if m := pulledIn.FindStringSubmatch(ev.Message); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				took = append(took, d)
			}
		}
	}
	return took
}
