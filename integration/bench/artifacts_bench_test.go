package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
)

// Settings of the artifact benchmark: the artifact sizes in MiB
// (BENCH_ARTIFACT_MIB, comma-separated) and the builds each path runs at
// each size after one to warm up (BENCH_ARTIFACT_BUILDS, one per size, the
// last repeated), and the file the node's own copy rate is timed with
// (BENCH_ARTIFACT_COPY_MIB).
var (
	artifactMiB     = envInts("BENCH_ARTIFACT_MIB", []int{16, 1024})
	artifactBuilds  = envInts("BENCH_ARTIFACT_BUILDS", []int{5, 3})
	artifactCopyMiB = envInt("BENCH_ARTIFACT_COPY_MIB", 1024)
)

// BenchmarkConcourseArtifacts runs one job, a task writing an N-byte
// output (incompressible, from /dev/urandom) read and checked by the next
// task, through one real web node on (a) a stock Concourse v8.2.5
// containerd worker on this machine (integration/concourse's StartStock,
// its tasks in a busybox rootfs folder) and (b) a jetway target on the
// real node (the node's busybox image, no image fetch), alternating
// builds, for each N (default 16 MiB and 1 GiB). A build's and a step's
// time are the web node's own, from its log. It reports per N each path's
// median build and step times and their ratio b/a; jetway's volume moves
// and copies per build (jetway_concourse_volume_*: bytes by direction,
// counts, and their time from the gateway's histograms), its transfer
// rate (bytes moved / time of the moves) against the node's own: the rate
// of `cp` of a file within the filesystem of the node's pods' emptyDirs,
// into the page cache alone and with the copy synced to the disk;
// and where jetway's build time goes beyond the stock worker's.
// The goals (issue 41): at 16 MiB b/a <= 1.5; at 1 GiB each byte moved at
// most once per direction, at a rate of at least 0.9x the node's copy.
func BenchmarkConcourseArtifacts(b *testing.B) {
	for range b.N {
		runArtifactsBench(b)
	}
}

// artifactSteps are the job's two tasks.
var artifactSteps = []string{"make", "check"}

// artifactBuild is one build's times and, for jetway's, the gateway's
// volume metrics' growth over it.
type artifactBuild struct {
	took    map[string]time.Duration // "build" and each step
	metrics map[string]float64       // series, grown over the build
}

func runArtifactsBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	bed := newStepsBed(ctx, b, realNode)
	defer bed.stop()
	// The jetway target's tag, as the stock worker has its own: each job
	// runs on one worker.
	check(b, writeFile(filepath.Join(bed.dir, stepsTarget, "target.yaml"), []byte("tags: [jetway]\n")))
	web, gw := concourseBed(b, bed)
	defer gw.stop(b)
	// After the node, so that it stops before the node (see StockSocket).
	stock := cwn.StockForTest(b, web, cwn.StockOptions{})
	copyRate := nodeCopyRate(b, bed.c.NodeKubeletDir(), int64(artifactCopyMiB)<<20)
	fly := flyer(ctx, b, web, 10*time.Minute)
	image := "docker:///" + strings.TrimSuffix(cluster.BusyboxImage, ":1") + "#1"
	for i, mib := range artifactMiB {
		builds := artifactBuilds[min(i, len(artifactBuilds)-1)]
		size := int64(mib) << 20
		name := fmt.Sprintf("artifacts-%d", mib)
		p := filepath.Join(b.TempDir(), name+".yml")
		check(b, writeFile(p, []byte(cwn.ArtifactPipeline(size,
			cwn.ArtifactJob{Name: "stock", Tags: []string{cwn.StockTag}, RootfsURI: "raw://" + stock.Rootfs},
			cwn.ArtifactJob{Name: "jetway", Tags: []string{"jetway"}, RootfsURI: image}))))
		fly("set-pipeline", "-n", "-p", name, "-c", p)
		fly("unpause-pipeline", "-p", name)
		var stockBuilds, jetwayBuilds []artifactBuild
		for n := range builds + 1 { // the first of each warms up
			order := []string{"stock", "jetway"}
			if n%2 == 1 {
				order = []string{"jetway", "stock"}
			}
			for _, job := range order {
				m0 := gw.series(b)
				out := fly("trigger-job", "-j", name+"/"+job, "--watch")
				if !strings.Contains(out, fmt.Sprintf("made %d bytes", size)) || !strings.Contains(out, cwn.ArtifactMarker) {
					b.Fatalf("%s build %d: the artifact was not made or not read back whole:\n%s", job, n+1, out)
				}
				ab := artifactBuild{took: stepTimes(b, filepath.Join(web.Dir, "web.log"), name, job, n+1), metrics: grown(m0, gw.series(b))}
				if n == 0 {
					continue
				}
				if job == "stock" {
					stockBuilds = append(stockBuilds, ab)
				} else {
					jetwayBuilds = append(jetwayBuilds, ab)
				}
				b.Logf("%d MiB %s build %d: %s", mib, job, n, ab.took["build"].Round(time.Millisecond))
			}
		}
		reportArtifacts(b, mib, stockBuilds, jetwayBuilds, copyRate)
	}
}

// grown is each series' growth from m0 to m1.
func grown(m0, m1 map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for s, v := range m1 {
		if v != m0[s] {
			d[s] = v - m0[s]
		}
	}
	return d
}

// The volume series jetway's gateway exports (concourse/metrics.go).
const (
	movedBytes  = `jetway_concourse_volume_moved_bytes_total{direction="%s"}`
	moves       = `jetway_concourse_volume_moves_total{direction="%s"}`
	moveSeconds = `jetway_concourse_volume_move_seconds_sum{direction="%s"}`
	copiedBytes = `jetway_concourse_volume_copied_bytes_total`
	copies      = `jetway_concourse_volume_copies_total`
	copySeconds = `jetway_concourse_volume_copy_seconds_sum`
)

// reportArtifacts prints one size's table and reports its metrics.
func reportArtifacts(b *testing.B, mib int, stock, jetway []artifactBuild, copyRate copyRates) {
	med := func(builds []artifactBuild, name string) time.Duration {
		var ds []time.Duration
		for _, ab := range builds {
			ds = append(ds, ab.took[name])
		}
		return quantile(ds, 0.5)
	}
	mean := func(series string) float64 {
		var sum float64
		for _, ab := range jetway {
			sum += ab.metrics[series]
		}
		return sum / float64(len(jetway))
	}
	size := float64(int64(mib) << 20)
	a, j := med(stock, "build"), med(jetway, "build")
	prefix := fmt.Sprintf("%dMiB-", mib)
	b.Logf("artifact of %d MiB, %d builds each, medians (web node's log):", mib, len(stock))
	b.Logf("  %-8s %10s %10s %8s", "", "stock (a)", "jetway (b)", "b/a")
	for _, name := range append([]string{"build"}, artifactSteps...) {
		b.Logf("  %-8s %10s %10s %7.2fx", name, med(stock, name).Round(time.Millisecond), med(jetway, name).Round(time.Millisecond),
			med(jetway, name).Seconds()/med(stock, name).Seconds())
	}
	in, out := mean(fmt.Sprintf(movedBytes, "in")), mean(fmt.Sprintf(movedBytes, "out"))
	inT, outT := mean(fmt.Sprintf(moveSeconds, "in")), mean(fmt.Sprintf(moveSeconds, "out"))
	copied, copyT := mean(copiedBytes), mean(copySeconds)
	b.Logf("  jetway per build: moved in %.0f B (%.2fx N) in %.1f moves, %.2f s; out %.0f B (%.2fx N) in %.1f moves, %.2f s; copied %.0f B (%.2fx N) in %.1f copies, %.2f s",
		in, in/size, mean(fmt.Sprintf(moves, "in")), inT, out, out/size, mean(fmt.Sprintf(moves, "out")), outT, copied, copied/size, mean(copies), copyT)
	rate := (in + out) / (inT + outT)
	b.Logf("  transfer rate: jetway's moves %.0f MiB/s; the node's cp %.0f MiB/s into the page cache (%.2fx), %.0f MiB/s synced to its disk (%.2fx)",
		rate/(1<<20), copyRate.cache/(1<<20), rate/copyRate.cache, copyRate.disk/(1<<20), rate/copyRate.disk)
	transfers := time.Duration((inT + outT + copyT) * float64(time.Second))
	b.Logf("  jetway's build beyond the stock worker's: %s, of which moves and copies %s, the rest %s",
		(j - a).Round(time.Millisecond), transfers.Round(time.Millisecond), (j - a - transfers).Round(time.Millisecond))
	b.ReportMetric(a.Seconds(), prefix+"s/build-stock")
	b.ReportMetric(j.Seconds(), prefix+"s/build-jetway")
	b.ReportMetric(j.Seconds()/a.Seconds(), prefix+"jetway/stock")
	b.ReportMetric(in, prefix+"moved-in-B/build")
	b.ReportMetric(out, prefix+"moved-out-B/build")
	b.ReportMetric(copied, prefix+"copied-B/build")
	b.ReportMetric(rate/copyRate.cache, prefix+"move-rate/cp-rate")
	b.ReportMetric(rate/copyRate.disk, prefix+"move-rate/cp-sync-rate")
}

// copyRates are the node's own copy rates, in bytes per second: a `cp`
// into the page cache, and the same with the copy synced to the disk.
type copyRates struct{ cache, disk float64 }

// nodeCopyRate is the rate of `cp` of a file of size bytes within the
// filesystem of dir (the node's kubelet root), the median of three, and
// of the same `cp` followed by `sync` of the copy: jetway's moves write
// into the page cache as cp does, and the disk takes what neither syncs
// at its own pace.
func nodeCopyRate(b *testing.B, dir string, size int64) copyRates {
	work, err := os.MkdirTemp(filepath.Dir(dir), "bench-copy-")
	check(b, err)
	defer os.RemoveAll(work)
	var st1, st2 syscall.Stat_t
	check(b, syscall.Stat(dir, &st1))
	check(b, syscall.Stat(work, &st2))
	if st1.Dev != st2.Dev {
		b.Fatalf("%s and %s are not on one filesystem", dir, work)
	}
	src := filepath.Join(work, "src")
	writeArtifact(b, src, size)
	var cached, synced []time.Duration
	for i := range 3 {
		dst := filepath.Join(work, "dst"+strconv.Itoa(i))
		start := time.Now()
		if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v: %s", err, out)
		}
		cached = append(cached, time.Since(start))
		if out, err := exec.Command("sync", dst).CombinedOutput(); err != nil {
			b.Fatalf("sync: %v: %s", err, out)
		}
		synced = append(synced, time.Since(start))
		check(b, os.Remove(dst))
	}
	c, d := quantile(cached, 0.5), quantile(synced, 0.5)
	b.Logf("the node's cp of %d MiB within %s: %s (of %v); with sync: %s (of %v)", size>>20, filepath.Dir(dir),
		c.Round(time.Millisecond), cached, d.Round(time.Millisecond), synced)
	return copyRates{cache: float64(size) / c.Seconds(), disk: float64(size) / d.Seconds()}
}

// envInts reads a comma-separated list of positive integers.
func envInts(key string, def []int) []int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return def
		}
		out = append(out, n)
	}
	return out
}
