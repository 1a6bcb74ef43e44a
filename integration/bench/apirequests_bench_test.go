package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// Settings of the API-request benchmark: BENCH_API_WINDOW is each phase's
// window, BENCH_API_CHECKS and BENCH_API_BUILDS its containers.
var (
	apiWindow = envDuration("BENCH_API_WINDOW", 90*time.Second)
	apiChecks = envInt("BENCH_API_CHECKS", 50)
	apiBuilds = envInt("BENCH_API_BUILDS", 10)
)

// BenchmarkConcourseAPIRequests measures what one jetway target costs
// the API servers while a real web node uses it as its worker, on the
// real node: the requests per minute the gateway makes of the target's
// API server and of the state namespace's (jetway_target_api_requests_total
// and jetway_state_api_requests_total) and the bytes of their answers
// read, over a window in each of three
// phases: idle; with 50 idle check containers (50 resources checked
// once); and with those and 10 running builds (a task sleeping in each).
// The goal: requests per minute independent of the number of
// containers. It logs each phase's busiest requests by verb and resource.
func BenchmarkConcourseAPIRequests(b *testing.B) {
	for range b.N {
		runAPIRequestsBench(b)
	}
}

func runAPIRequestsBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	bed := newStepsBed(ctx, b, realNode)
	defer bed.stop()
	web, gw := concourseBed(b, bed)
	defer gw.stop(b)
	fly := flyer(ctx, b, web, 5*time.Minute)

	type rates struct{ target, state, targetBytes, stateBytes float64 }
	phases := []string{"idle", fmt.Sprintf("%d check containers", apiChecks),
		fmt.Sprintf("%d check containers and %d running builds", apiChecks, apiBuilds)}
	var got []rates
	window := func(phase string) {
		s0, t0 := gw.series(b), time.Now()
		time.Sleep(apiWindow)
		s1, took := gw.series(b), time.Since(t0)
		perMin := func(prefix string) (float64, []string) {
			total, by := 0.0, map[string]float64{}
			for s, v := range s1 {
				if strings.HasPrefix(s, prefix) {
					d := (v - s0[s]) / took.Minutes()
					total += d
					by[s[len(prefix):]] += d
				}
			}
			var busiest []string
			for s, d := range by {
				if d >= 0.5 {
					busiest = append(busiest, fmt.Sprintf("%6.1f %s", d, s))
				}
			}
			sort.Sort(sort.Reverse(sort.StringSlice(busiest)))
			return total, busiest
		}
		t, tby := perMin("jetway_target_api_requests_total")
		s, sby := perMin("jetway_state_api_requests_total")
		tb, _ := perMin("jetway_target_api_response_bytes_total")
		sb, sbby := perMin("jetway_state_api_response_bytes_total")
		got = append(got, rates{t, s, tb, sb})
		b.Logf("%s: %.1f requests/min of the target's API server (%.0f KiB/min read), %.1f of the state namespace's (%.0f KiB/min)",
			phase, t, tb/1024, s, sb/1024)
		b.Logf("  state namespace, bytes per minute:\n    %s", strings.Join(sbby, "\n    "))
		b.Logf("  target, per minute:\n    %s", strings.Join(tby, "\n    "))
		b.Logf("  state namespace, per minute:\n    %s", strings.Join(sby, "\n    "))
	}

	window(phases[0])

	pipeline := filepath.Join(b.TempDir(), "pipeline.yml")
	check(b, writeFile(pipeline, []byte(apiPipeline(apiChecks, apiBuilds))))
	fly("set-pipeline", "-n", "-p", "api", "-c", pipeline)
	fly("unpause-pipeline", "-p", "api")
	awaitContainers(b, fly, "check", apiChecks)
	window(phases[1])

	for i := range apiBuilds {
		fly("trigger-job", "-j", fmt.Sprintf("api/sleep-%d", i))
	}
	awaitContainers(b, fly, "task", apiBuilds)
	window(phases[2])
	for i := range apiBuilds {
		fly("abort-build", "-j", fmt.Sprintf("api/sleep-%d", i), "-b", "1")
	}

	for i, r := range got {
		b.Logf("%-45s target %6.1f requests/min %6.0f KiB/min, state namespace %6.1f requests/min %6.0f KiB/min",
			phases[i], r.target, r.targetBytes/1024, r.state, r.stateBytes/1024)
	}
	b.ReportMetric(got[0].target+got[0].state, "req/min-idle")
	b.ReportMetric(got[1].target+got[1].state, "req/min-checks")
	b.ReportMetric(got[2].target+got[2].state, "req/min-checks-builds")
	b.ReportMetric((got[1].target+got[1].state)/(got[0].target+got[0].state), "checks/idle")
	b.ReportMetric((got[1].targetBytes+got[1].stateBytes)/1024, "KiB/min-checks")
}

// apiPipeline has checks resources of the bed's test type, each checked
// once when the pipeline is unpaused (so each leaves a check container,
// idle until its next check a day later), and builds jobs whose task
// sleeps until aborted.
func apiPipeline(checks, builds int) string {
	var p strings.Builder
	p.WriteString("resources:\n")
	for i := range checks {
		fmt.Fprintf(&p, "- name: r-%d\n  type: jetway-test\n  check_every: 24h\n  source: {uri: git://r-%d}\n", i, i)
	}
	// A job that uses them, never run: a pipeline's resources must be used.
	p.WriteString("jobs:\n- name: uses\n  plan:\n")
	for i := range checks {
		fmt.Fprintf(&p, "  - get: r-%d\n", i)
	}
	for i := range builds {
		fmt.Fprintf(&p, `- name: sleep-%d
  plan:
  - task: sleep
    config:
      platform: linux
      rootfs_uri: docker:///%s#1
      run: {path: sleep, args: ["3600"]}
`, i, benchImageRepo)
	}
	return p.String()
}

// awaitContainers waits until the web node lists n containers of kind
// (check, task) that are running: created, on the bed's worker.
func awaitContainers(b *testing.B, fly func(args ...string) string, kind string, n int) {
	waitFor(b, 10*time.Minute, func() error {
		var cs []struct {
			Type  string `json:"type"`
			State string `json:"state"`
		}
		if err := json.Unmarshal([]byte(fly("containers", "--json")), &cs); err != nil {
			return err
		}
		have := 0
		for _, c := range cs {
			if c.Type == kind && (c.State == "" || c.State == "created") {
				have++
			}
		}
		if have < n {
			return fmt.Errorf("%d of %d %s containers", have, n, kind)
		}
		return nil
	})
}
