package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/wire"
)

// benchOutputMiB is how much the output benchmark's step prints.
var benchOutputMiB = envInt("BENCH_OUTPUT_MIB", 1024)

// BenchmarkStepOutput runs one task that prints BENCH_OUTPUT_MIB (default
// 1 GiB) on a gateway process while a client follows every event of it.
// It reports how much the gateway's RSS grew over its idle size while the
// step ran and after it ended, then restarts the gateway, reads the
// step's events from 0 through the new process (every byte must come,
// in order) and reports its RSS growth while it serves them. The
// gateway keeps a bounded tail of a step's events, whatever it prints:
// the goal is growth under 64 MiB throughout.
func BenchmarkStepOutput(b *testing.B) {
	for range b.N {
		runOutputBench(b)
	}
}

func runOutputBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	bed := newStepsBed(ctx, b, kwokNode)
	defer bed.stop()
	gw := bed.gateway(b, "")
	// Warm up (the first step's clients, exec and port-forward paths),
	// then take the idle size.
	jetwayStep(ctx, b, kwokNode, gw.base, "warm-up")
	time.Sleep(2 * time.Second)
	base := gw.status("VmRSS")
	size := int64(benchOutputMiB) << 20

	c, err := client.New(client.Options{URL: gw.base})
	if err != nil {
		b.Fatal(err)
	}
	script := fmt.Sprintf("head -c %d /dev/zero | tr '\\000' x", size)
	if _, _, err := c.SubmitStep(ctx, wire.Request{Handle: "loud", Type: "task", Image: "busybox:1.37",
		Run: wire.Run{Path: "sh", Args: []string{"-c", script}}}); err != nil {
		b.Fatal(err)
	}
	peak := sampleRSS(gw)
	start := time.Now()
	got := countOutput(ctx, b, gw.base, "loud")
	elapsed := time.Since(start)
	running := peak.stop()
	time.Sleep(2 * time.Second)
	after := gw.status("VmRSS")
	if got != size {
		b.Fatalf("the follower got %d bytes of %d", got, size)
	}

	// A new gateway process reads the step's events from 0.
	gw.stop(b)
	gw = bed.gateway(b, "")
	defer gw.stop(b)
	time.Sleep(2 * time.Second)
	base2 := gw.status("VmRSS")
	peak = sampleRSS(gw)
	start2 := time.Now()
	replayed := countOutput(ctx, b, gw.base, "loud")
	elapsed2 := time.Since(start2)
	replay := peak.stop()
	if replayed != size {
		b.Fatalf("read again from 0 after a restart: %d bytes of %d", replayed, size)
	}
	mib := func(kb int64) float64 { return float64(kb) / 1024 }
	b.ReportMetric(mib(base), "rss-idle-MiB")
	b.ReportMetric(mib(running-base), "rss-growth-running-MiB")
	b.ReportMetric(mib(after-base), "rss-growth-after-MiB")
	b.ReportMetric(mib(replay-base2), "rss-growth-replay-MiB")
	b.ReportMetric(float64(size>>20)/elapsed.Seconds(), "live-MiB/s")
	b.ReportMetric(float64(size>>20)/elapsed2.Seconds(), "replay-MiB/s")
	b.Logf("%d MiB of output: RSS idle %.0f MiB, +%.1f MiB at most while it ran (%.0f MiB/s to the follower), +%.1f MiB after; "+
		"after a restart, read from 0 again whole (%.0f MiB/s) with +%.1f MiB at most",
		size>>20, mib(base), mib(running-base), float64(size>>20)/elapsed.Seconds(), mib(after-base),
		float64(size>>20)/elapsed2.Seconds(), mib(replay-base2))
}

// rssPeak samples a gateway's RSS until stopped, keeping the largest.
type rssPeak struct {
	max  atomic.Int64
	done chan struct{}
	wg   sync.WaitGroup
}

func sampleRSS(gw *gatewayProc) *rssPeak {
	p := &rssPeak{done: make(chan struct{})}
	p.wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if v := gw.status("VmRSS"); v > p.max.Load() {
				p.max.Store(v)
			}
			select {
			case <-p.done:
				return
			case <-t.C:
			}
		}
	})
	return p
}

func (p *rssPeak) stop() int64 {
	close(p.done)
	p.wg.Wait()
	return p.max.Load()
}

// countOutput follows a step's events from 0 to its end and returns the
// bytes of its stdout, checking the events come numbered in order.
func countOutput(ctx context.Context, b *testing.B, base, handle string) int64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/steps/"+handle+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("events of %s: %s", handle, resp.Status)
	}
	var n int64
	next := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e wire.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			b.Fatal(err)
		}
		if e.N != next {
			b.Fatalf("events of %s: %d after %d", handle, e.N, next-1)
		}
		next++
		switch e.Type {
		case wire.EventStdout:
			n += int64(len(e.Output()))
		case wire.EventFailed:
			b.Fatalf("step %s: %+v", handle, e)
		case wire.EventExited:
			if *e.ExitStatus != 0 {
				b.Fatalf("step %s exited %s", handle, strconv.Itoa(*e.ExitStatus))
			}
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return n
}
