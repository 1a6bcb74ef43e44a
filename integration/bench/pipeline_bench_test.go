package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// pipelineBuilds is how many builds each path runs (BENCH_PIPELINE_BUILDS).
var pipelineBuilds = envInt("BENCH_PIPELINE_BUILDS", 5)

// pipelineMount is how the bench's step pods get the agent
// (BENCH_PIPELINE_MOUNT: image-volume, or init-container for the
// fallback's numbers).
var pipelineMount = cmp.Or(os.Getenv("BENCH_PIPELINE_MOUNT"), string(steppod.AgentImageVolume))

// benchPipeline is the five steps, as a Concourse pipeline: a get, two
// tasks each with an input and an output, a task with a cache, a put.
// jetway-test is a base resource type the workers offer (the node's
// busybox image, whose /opt/resource is a test type), so no step fetches
// a type's image; the tasks name their image with rootfs_uri, so none
// fetches one either: both paths run the same five containers.
var benchPipeline = `
resources:
- name: src
  type: jetway-test
  check_every: never
  source: {uri: git://bench}
- name: target
  type: jetway-test
  check_every: never
  source: {uri: git://target}
jobs:
- name: bench
  plan:
  - get: src
  - task: one
    config:
      platform: linux
      rootfs_uri: docker:///` + benchImageRepo + `#1
      inputs: [{name: src}]
      outputs: [{name: a}]
      run: {path: sh, args: [-c, 'cat src/file > a/x']}
  - task: two
    config:
      platform: linux
      rootfs_uri: docker:///` + benchImageRepo + `#1
      inputs: [{name: a}]
      outputs: [{name: b}]
      run: {path: sh, args: [-c, 'cat a/x > b/y']}
  - task: cached
    config:
      platform: linux
      rootfs_uri: docker:///` + benchImageRepo + `#1
      inputs: [{name: b}]
      caches: [{path: c}]
      run: {path: sh, args: [-c, 'cat b/y >> c/seen; wc -l < c/seen']}
  - put: target
    inputs: [src]
    no_get: true
`

// benchImageRepo is the node's busybox image without its tag.
var benchImageRepo = strings.TrimSuffix(cluster.BusyboxImage, ":1")

// BenchmarkConcoursePipeline runs one pipeline of five steps (get, two
// tasks with an input and an output, a cached task, a put) on the real
// node two ways in one run, alternating build by build: (a) through an
// unmodified Concourse web node, on a jetway target registered as its
// worker (fly trigger-job --watch); (b) the same five steps through
// jetway's own step API, one after another, each input from the step
// before (jetway's API has no task cache: the cached task's cache is an
// input from the last build's cached task, as Concourse moves the cache
// in). A Concourse build's time is the web node's own, from its log: from
// the build running to its end, and each step from its initializing to
// its finish (so the scheduler's wait before the build is not counted);
// an API build's, from the first submit to the last step's end. It
// reports each path's median per build and per step, their ratio (the
// goal: Concourse through jetway at most 1.15x), and the volume copies
// (of bytes, and of links) and moves a Concourse build made
// (jetway_concourse_volume_*).
func BenchmarkConcoursePipeline(b *testing.B) {
	for range b.N {
		runPipelineBench(b)
	}
}

// concourseBed starts a web node whose components run every second (not
// 10) and a gateway over bed registering its target as the web node's
// worker (over the REST API), and waits until fly lists it running.
func concourseBed(b *testing.B, bed *stepsBed) (*cwn.WebNode, *gatewayProc) {
	client0 := cwn.Client{ID: "jetway", Secret: "bench-s3cret"}
	web := cwn.ForTest(b, cwn.Options{Clients: []cwn.Client{client0}, GCInterval: time.Second})
	secret, types := filepath.Join(b.TempDir(), "secret"), filepath.Join(b.TempDir(), "types.yml")
	check(b, writeFile(secret, []byte(client0.Secret)))
	check(b, writeFile(types, []byte("jetway-test: "+cluster.BusyboxImage+"\nregistry-image: "+bed.c.NodeImage("registry-image-image.tar")+"\n")))
	flags := []string{"--concourse-url", web.URL, "--concourse-client-id", client0.ID,
		"--concourse-client-secret-file", secret, "--concourse-worker-address", "127.0.0.1",
		"--concourse-insecure", "--concourse-web-node-networks", "127.0.0.1",
		"--concourse-resource-types", types,
		// The real node has two cores: at the default request of 100m,
		// a build's pods, the build's before (the API path keeps them
		// for the cache) and those the web node has not collected yet
		// did not always fit, and a step was unschedulable.
		"--step-default-cpu-request", "10m", "--step-agent-mount", pipelineMount}
	b.Logf("step pods get the agent: %s", pipelineMount)
	if os.Getenv("BENCH_GATEWAY_LOG") != "" {
		flags = append(flags, "--log-level", "debug")
	}
	gw := bed.gateway(b, "", flags...)
	waitFor(b, time.Minute, func() error {
		for _, w := range web.Workers(b) {
			if w.Name == stepsTarget && w.State == "running" {
				return nil
			}
		}
		return fmt.Errorf("worker %s not running yet", stepsTarget)
	})
	return web, gw
}

// benchStepNames are the five steps, by their names in the pipeline.
var benchStepNames = []string{"src", "one", "two", "cached", "target"}

// flyer runs fly against web, each command within timeout, and fails the
// benchmark with its output if it fails.
func flyer(ctx context.Context, b *testing.B, web *cwn.WebNode, timeout time.Duration) func(args ...string) string {
	return func(args ...string) string {
		fctx, fcancel := context.WithTimeout(ctx, timeout)
		defer fcancel()
		out, err := web.FlyContext(fctx, args...)
		if err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		return out
	}
}

func runPipelineBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bed := newStepsBed(ctx, b, realNode)
	defer bed.stop()
	web, gw := concourseBed(b, bed)
	defer gw.stop(b)
	fly := flyer(ctx, b, web, 5*time.Minute)
	pipeline := filepath.Join(b.TempDir(), "pipeline.yml")
	check(b, writeFile(pipeline, []byte(benchPipeline)))
	fly("set-pipeline", "-n", "-p", "bench", "-c", pipeline)
	fly("unpause-pipeline", "-p", "bench")
	fly("check-resource", "-r", "bench/src")

	c, err := client.New(client.Options{URL: gw.base})
	check(b, err)
	cc, api := map[string][]time.Duration{}, map[string][]time.Duration{}
	var copies, linked, moves, movedBytes float64
	for i := range pipelineBuilds + 1 { // the first of each warms the image and the caches
		m0 := gw.metrics(b)
		out := fly("trigger-job", "-j", "bench/bench", "--watch")
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^%d\r?$`, i+1)).MatchString(out) { // a task's terminal ends lines with \r\n
			b.Fatalf("build %d: the cache does not hold %d lines: %s", i+1, i+1, out)
		}
		m1 := gw.metrics(b)
		took := stepTimes(b, filepath.Join(web.Dir, "web.log"), "bench", "bench", i+1)
		for _, name := range benchStepNames {
			if _, ok := took[name]; !ok {
				b.Fatalf("build %d: the web node's log has no time for step %s", i+1, name)
			}
		}
		tookAPI := apiBuild(ctx, b, c, i)
		if i == 0 {
			continue
		}
		// The web node reuses its resource cache for the get (nothing
		// runs); the API runs it each time: the builds are compared
		// without it too.
		took["build-without-get"] = took["build"] - took["src"]
		tookAPI["build-without-get"] = tookAPI["build"] - tookAPI["src"]
		for name, d := range took {
			cc[name] = append(cc[name], d)
		}
		for name, d := range tookAPI {
			api[name] = append(api[name], d)
		}
		copies += m1["jetway_concourse_volume_copies_total"] - m0["jetway_concourse_volume_copies_total"]
		linked += m1["jetway_concourse_volume_linked_copies_total"] - m0["jetway_concourse_volume_linked_copies_total"]
		moves += m1["jetway_concourse_volume_moves_total"] - m0["jetway_concourse_volume_moves_total"]
		movedBytes += m1["jetway_concourse_volume_moved_bytes_total"] - m0["jetway_concourse_volume_moved_bytes_total"]
		b.Logf("build %d: through Concourse %s, through jetway's API %s", i, took["build"].Round(time.Millisecond), tookAPI["build"].Round(time.Millisecond))
	}
	layers := imageGets(b, fly, gw, bed.c.RegistryMirror(), filepath.Join(web.Dir, "web.log"))
	n := float64(pipelineBuilds)
	med := func(m map[string][]time.Duration, name string) time.Duration { return quantile(m[name], 0.5) }
	ccBuild, apiBuild := med(cc, "build"), med(api, "build")
	b.ReportMetric(ccBuild.Seconds(), "s/build-concourse")
	b.ReportMetric(apiBuild.Seconds(), "s/build-api")
	b.ReportMetric(ccBuild.Seconds()/apiBuild.Seconds(), "concourse/api")
	ccRest, apiRest := med(cc, "build-without-get"), med(api, "build-without-get")
	b.ReportMetric(ccRest.Seconds()/apiRest.Seconds(), "concourse/api-without-get")
	b.ReportMetric(copies/n, "copies/build")
	b.ReportMetric(linked/n, "linked-copies/build")
	b.ReportMetric(moves/n, "moves/build")
	b.ReportMetric(movedBytes/n, "moved-B/build")
	for _, name := range benchStepNames {
		b.Logf("step %-6s through Concourse %6s, through jetway's API %6s: %.2fx", name,
			med(cc, name).Round(time.Millisecond), med(api, name).Round(time.Millisecond), med(cc, name).Seconds()/med(api, name).Seconds())
	}
	b.Logf("an image's get used as a task's image: with its layers %s and %.0f bytes moved out of its pod, without (skip_download) %s and %.0f bytes",
		layers.with.Round(time.Millisecond), layers.withBytes, layers.without.Round(time.Millisecond), layers.withoutBytes)
	b.ReportMetric(layers.with.Seconds()/layers.without.Seconds(), "get-with/without-layers")
	b.Logf("median build: through Concourse %s, through jetway's API %s: %.2fx; without the get %s and %s: %.2fx; per build %.1f volume copies of bytes and %.1f of links, %.1f moves of %.0f bytes",
		ccBuild.Round(time.Millisecond), apiBuild.Round(time.Millisecond), ccBuild.Seconds()/apiBuild.Seconds(),
		ccRest.Round(time.Millisecond), apiRest.Round(time.Millisecond), ccRest.Seconds()/apiRest.Seconds(), copies/n, linked/n, moves/n, movedBytes/n)
}

// imagesPipeline has two jobs, each a get of the node's busybox image
// (the registry-image stand-in, from the node's registry) used as its
// task's image: one with the layers, one without (skip_download).
var imagesPipeline = `
resources:
- name: with-layers
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
- name: without-layers
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
jobs:
- name: with
  plan:
  - get: with-layers
  - task: run
    image: with-layers
    config: {platform: linux, run: {path: "true"}}
- name: without
  plan:
  - get: without-layers
    params: {skip_download: true}
  - task: run
    image: without-layers
    config: {platform: linux, run: {path: "true"}}
`

// layerTimes is the get of an image with and without its layers: the
// get step's time, and the bytes moved out of its pod.
type layerTimes struct {
	with, without           time.Duration
	withBytes, withoutBytes float64
}

// imageGets runs the images pipeline's jobs once each (a first fetch: no
// resource cache yet) and times their gets.
func imageGets(b *testing.B, fly func(...string) string, gw *gatewayProc, mirror, log string) layerTimes {
	p := filepath.Join(b.TempDir(), "images.yml")
	check(b, writeFile(p, []byte(strings.ReplaceAll(imagesPipeline, "MIRROR", mirror))))
	fly("set-pipeline", "-n", "-p", "images", "-c", p)
	fly("unpause-pipeline", "-p", "images")
	var lt layerTimes
	for _, job := range []string{"with", "without"} {
		fly("check-resource", "-r", "images/"+job+"-layers")
		m0 := gw.metrics(b)
		out := fly("trigger-job", "-j", "images/"+job, "--watch")
		moved := gw.metrics(b)["jetway_concourse_volume_moved_bytes_total"] - m0["jetway_concourse_volume_moved_bytes_total"]
		took := stepTimes(b, log, "images", job, 1)[job+"-layers"]
		if job == "with" {
			lt.with, lt.withBytes = took, moved
			if !strings.Contains(out, "with its layers") {
				b.Fatalf("the get fetched no layers: %s", out)
			}
		} else {
			lt.without, lt.withoutBytes = took, moved
			if !strings.Contains(out, "without its layers") {
				b.Fatalf("the get fetched layers: %s", out)
			}
		}
	}
	return lt
}

// trackerEvent is a build's event in the web node's log.
var trackerEvent = regexp.MustCompile(`^atc\.tracker\.[a-z-]+\.run\.(.+)$`)

// stepTimes reads the web node's log for build number n of pipeline's
// job: the build's time from running to its end ("build"), and each
// step's from initializing to finished, by its name.
func stepTimes(b *testing.B, log, pipeline, job string, n int) map[string]time.Duration {
	f, err := os.Open(log)
	check(b, err)
	defer f.Close()
	type line struct {
		Timestamp time.Time
		Message   string
		Data      map[string]any
	}
	began := map[string]time.Time{}
	took := map[string]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Data["build"] != strconv.Itoa(n) || l.Data["pipeline"] != pipeline || l.Data["job"] != job {
			continue
		}
		// The tracker runs a build from a notification or its tick.
		m := trackerEvent.FindStringSubmatch(l.Message)
		if m == nil {
			continue
		}
		event := m[1]
		step, _ := l.Data["step-name"].(string)
		switch {
		case event == "running":
			began["build"] = l.Timestamp
		case event == "finish.succeeded":
			took["build"] = l.Timestamp.Sub(began["build"])
		case strings.HasSuffix(event, "-step.initializing"):
			began[step] = l.Timestamp
		case strings.HasSuffix(event, "-step.finished"):
			took[step] = l.Timestamp.Sub(began[step])
		}
	}
	check(b, sc.Err())
	if _, ok := took["build"]; !ok {
		b.Fatalf("%s/%s build %d: the web node's log has no end for it", pipeline, job, n)
	}
	return took
}

// apiBuild runs the five steps through jetway's step API, one after
// another, as build i, and returns each step's time by its pipeline name,
// and the whole ("build").
func apiBuild(ctx context.Context, b *testing.B, c *client.Client, i int) map[string]time.Duration {
	took := map[string]time.Duration{}
	start := time.Now()
	timed := func(name string, run func()) {
		t0 := time.Now()
		run()
		took[name] = time.Since(t0)
	}
	h := func(step string) string { return fmt.Sprintf("b%d-%s", i, step) }
	image := cluster.BusyboxImage
	timed("src", func() {
		if _, err := c.GetResource(ctx, client.ResourceStep{Handle: h("get"), Image: image, Source: map[string]string{"uri": "git://bench"},
			Version: client.Version{"ref": "b"}}); err != nil {
			b.Fatal(err)
		}
	})
	task := func(name, script string, in []wire.Input, out ...string) {
		req := wire.Request{Handle: h(name), Type: "task", Image: image, Inputs: in,
			Run: wire.Run{Path: "sh", Args: []string{"-c", script}}}
		for _, o := range out {
			req.Outputs = append(req.Outputs, wire.Output{Name: o})
		}
		timed(name, func() {
			v, err := c.RunTask(ctx, req, nil)
			if err != nil || v.Phase != wire.Succeeded {
				b.Fatalf("%s: %s %v", req.Handle, v.Phase, err)
			}
		})
	}
	from := func(name, step, output string) wire.Input {
		return wire.Input{Name: name, From: wire.InputSource{Step: h(step), Output: output}}
	}
	task("one", "cat src/file > a/x", []wire.Input{from("src", "get", "resource")}, "a")
	task("two", "cat a/x > b/y", []wire.Input{from("a", "one", "a")}, "b")
	cached := []wire.Input{from("b", "two", "b")}
	if i > 0 {
		cached = append(cached, wire.Input{Name: "last", From: wire.InputSource{Step: fmt.Sprintf("b%d-cached", i-1), Output: "c"}})
	}
	task("cached", "cp last/seen c/ 2>/dev/null; cat b/y >> c/seen; wc -l < c/seen", cached, "c")
	timed("target", func() {
		if _, err := c.PutResource(ctx, client.ResourceStep{Handle: h("put"), Image: image, Source: map[string]string{"uri": "git://target"},
			Inputs: []wire.Input{from("src", "get", "resource")}}); err != nil {
			b.Fatal(err)
		}
	})
	took["build"] = time.Since(start)
	// The build before is done with: its pods go (its cache was copied).
	if i > 0 {
		for _, step := range []string{"get", "one", "two", "cached", "put"} {
			if _, err := c.Abort(ctx, "", fmt.Sprintf("b%d-%s", i-1, step)); err != nil {
				b.Fatal(err)
			}
		}
	}
	return took
}

// metrics are the gateway's counters now, by name (summed over labels).
func (g *gatewayProc) metrics(b *testing.B) map[string]float64 {
	got := map[string]float64{}
	for s, v := range g.series(b) {
		name, _, _ := strings.Cut(s, "{")
		got[name] += v
	}
	return got
}

// series are the gateway's metrics now, by series: the name and its
// labels as /metrics writes them (name{label="value"}).
func (g *gatewayProc) series(b *testing.B) map[string]float64 {
	resp, err := http.Get(g.base + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	got := map[string]float64{}
	line := regexp.MustCompile(`^([a-z_]+(\{[^}]*\})?) (\S+)$`)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[3], 64)
			got[m[1]] += v
		}
	}
	return got
}

func check(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
