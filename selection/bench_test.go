package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkPlace measures one decision the way a step makes it (Top: 1,
// over a prepared Pool, reasons not asked for) against the straightforward
// algorithm (shuffle, then a full stable sort per strategy), in the same
// process. The compare sub-benchmark alternates the two and reports
// ratio-p50 / ratio-p99 = reference / jetway. pool-build is what preparing
// the pool costs (once per change of the target set; counts move with
// SetLoad), including the classes and ranks the first decision of each
// chain makes; set-load is one target's counts moving; place-with-reasons
// is Place as the API calls it: a fresh pool, every rejected target's
// reason and the whole order; pool-order-with-reasons is the same answer
// over a kept pool.
func BenchmarkPlace(b *testing.B) {
	chains := []string{"volume-locality", "fewest-build-containers,limit-active-tasks"}
	for _, n := range []int{1000, 10000} {
		step, cands := benchPool(n)
		prepare := func() *Pool {
			pool := NewPool(cands)
			for _, c := range chains {
				chain, _ := ParseChain(c)
				pool.Place(step, benchOptions(chain, nil))
			}
			return pool
		}
		pool := prepare()
		b.Run(fmt.Sprintf("n=%d/pool-build", n), func(b *testing.B) {
			reportLatency(b, "", timeEach(b, func() { prepare() }))
		})
		b.Run(fmt.Sprintf("n=%d/set-load", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(3, 4))
			reportLatency(b, "", timeEach(b, func() {
				c := &cands[r.IntN(n)]
				pool.SetLoad(c.Name, r.IntN(40), r.IntN(20), r.IntN(10), r.IntN(100))
			}))
		})
		for _, chainS := range chains {
			chain, err := ParseChain(chainS)
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			opts := benchOptions(chain, r)
			jetway := func() { pool.Place(step, opts) }
			ref := func() { reference(step, cands, opts, shuffleFisherYates(r)) }
			name := fmt.Sprintf("n=%d/%s", n, chainS)
			b.Run(name+"/jetway", func(b *testing.B) { reportLatency(b, "", timeEach(b, jetway)) })
			b.Run(name+"/reference", func(b *testing.B) { reportLatency(b, "", timeEach(b, ref)) })
			b.Run(name+"/compare", func(b *testing.B) { compare(b, jetway, ref) })
			all := opts
			all.Top = 0
			b.Run(name+"/place-with-reasons", func(b *testing.B) {
				reportLatency(b, "", timeEach(b, func() { Place(step, cands, all) }))
			})
			b.Run(name+"/pool-order-with-reasons", func(b *testing.B) {
				reportLatency(b, "", timeEach(b, func() { d := pool.Place(step, all); d.Reasons() }))
			})
		}
	}
}

// benchOptions is a step's decision: one target, a task limit that
// refuses about a fifth of the targets, a worker version to check.
func benchOptions(chain Chain, r *rand.Rand) Options {
	return Options{Chain: chain, Limits: Limits{ActiveTasks: 8}, WorkerVersion: "2.5", Rand: r, Top: 1}
}

func timeEach(b *testing.B, f func()) []time.Duration {
	b.ReportAllocs()
	durs := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		f()
		durs = append(durs, time.Since(start))
	}
	return durs
}

func compare(b *testing.B, jetway, ref func()) {
	var j, r []time.Duration
	for b.Loop() {
		start := time.Now()
		jetway()
		j = append(j, time.Since(start))
		start = time.Now()
		ref()
		r = append(r, time.Since(start))
	}
	jp50, jp99 := reportLatency(b, "jetway-", j)
	rp50, rp99 := reportLatency(b, "ref-", r)
	b.ReportMetric(rp50/jp50, "ratio-p50")
	b.ReportMetric(rp99/jp99, "ratio-p99")
}

// reportLatency reports the p50 and p99 of the recorded decisions in µs.
func reportLatency(b *testing.B, prefix string, durs []time.Duration) (p50, p99 float64) {
	if len(durs) == 0 {
		return 1, 1
	}
	slices.Sort(durs)
	at := func(q float64) float64 {
		return float64(durs[min(len(durs)-1, int(q*float64(len(durs))))].Nanoseconds()) / 1e3
	}
	p50, p99 = at(0.50), at(0.99)
	b.ReportMetric(p50, prefix+"p50-us")
	b.ReportMetric(p99, prefix+"p99-us")
	return p50, p99
}

// benchPool is n running global targets with a spread of load, a few landed,
// tagged or on another platform, and the step's three inputs on three targets.
func benchPool(n int) (Step, []Candidate) {
	r := rand.New(rand.NewPCG(7, 7))
	step := Step{Type: StepTask, Platform: "linux", Inputs: map[string]int{}}
	cands := make([]Candidate, n)
	for i := range cands {
		c := Candidate{Name: fmt.Sprint("target-", i), State: StateRunning, Platform: "linux", Version: "2.5",
			ActiveContainers: r.IntN(40), BuildContainers: r.IntN(20), ActiveTasks: r.IntN(10),
			ActiveVolumes: r.IntN(100)}
		switch r.IntN(50) {
		case 0:
			c.State = "landed"
		case 1:
			c.Tags = []string{"gpu"}
		case 2:
			c.Platform = "windows"
		}
		cands[i] = c
	}
	for _, i := range []int{n / 7, n / 3, n / 2} {
		step.Inputs[cands[i].Name]++
	}
	return step, cands
}
