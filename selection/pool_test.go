package selection

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPoolFollowsLoadAndKeepsClasses(t *testing.T) {
	pool := NewPool([]Candidate{run("a"), run("b"), with(run("c"), func(c *Candidate) { c.Team = "other" })})
	opts := Options{Chain: Chain{FewestBuildContainers}, Top: 1, Rand: seeded(1)}
	step := Step{Type: StepTask}
	require.True(t, pool.SetLoad("a", 3, 3, 1, 3))
	assert.Equal(t, []string{"b"}, pool.Place(step, opts).Order)
	require.True(t, pool.SetLoad("b", 5, 5, 1, 5))
	d := pool.Place(step, opts)
	assert.Equal(t, []string{"a"}, d.Order, "the class is kept, the counts are new")
	assert.Equal(t, map[string]string{"c": "team other"}, d.Reasons())
	assert.False(t, pool.SetLoad("nope", 1, 1, 1, 1))
}

func TestPoolPlacesConcurrently(t *testing.T) {
	t.Run("walking the class", placesConcurrently)
	t.Run("through ranks made on first use", func(t *testing.T) { ranked(t, func() { placesConcurrently(t) }) })
}

func placesConcurrently(t *testing.T) {
	cands := make([]Candidate, 200)
	for i := range cands {
		cands[i] = with(run(fmt.Sprint("t", i)), func(c *Candidate) { c.BuildContainers = i % 7 })
	}
	pool := NewPool(cands)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for k := range 50 {
				d := pool.Place(Step{Type: StepTask, Team: fmt.Sprint("team", k%3)},
					Options{Chain: Chain{FewestBuildContainers}, Top: 1, Rand: seeded(uint64(g*100 + k))})
				assert.Len(t, d.Order, 1)
				assert.Zero(t, cands[pool.index[d.Order[0]]].BuildContainers)
			}
		})
	}
	wg.Wait()
}

func TestPoolWithManyTagsComparesThemAsStrings(t *testing.T) {
	cands := make([]Candidate, 70)
	for i := range cands {
		cands[i] = with(run(fmt.Sprint("t", i)), func(c *Candidate) { c.Tags = []string{fmt.Sprint("tag", i)} })
	}
	pool := NewPool(cands)
	require.True(t, pool.wide, "more than 64 distinct tags")
	for _, i := range []int{5, 69} {
		d := pool.Place(Step{Tags: []string{fmt.Sprint("tag", i)}}, Options{Top: 1})
		assert.Equal(t, []string{fmt.Sprint("t", i)}, d.Order)
	}
	assert.False(t, pool.Place(Step{Tags: []string{"none"}}, Options{}).Compatible)
}

// ranked runs f with every one-target decision going through a rank, as
// it does over large pools.
func ranked(t *testing.T, f func()) {
	t.Helper()
	old := rankedFrom
	rankedFrom = 0
	t.Cleanup(func() { rankedFrom = old })
	f()
}

// TestRankedMatchesReference: a one-target decision through a rank picks
// one of the reference's best, the same keys in first place, also after
// SetLoad moved counts under the prepared pool, and says the same about
// compatibility and limits as a walk of the class.
func TestRankedMatchesReference(t *testing.T) {
	ranked(t, func() {
		chains := []string{"volume-locality", "random", "fewest-build-containers,limit-active-tasks",
			"limit-active-tasks,fewest-build-containers", "volume-locality,limit-active-tasks",
			"limit-active-containers,limit-active-volumes,volume-locality,fewest-build-containers",
			"limit-active-tasks,volume-locality"} // the last cannot use a rank: it walks
		gen := seeded(7)
		for i := range 600 {
			chain, err := ParseChain(chains[i%len(chains)])
			require.NoError(t, err)
			step, cands := randomPool(gen, 1+gen.IntN(80))
			pool := NewPool(cands)
			opts := Options{Chain: chain, WorkerVersion: "2.5", Top: 1, Limits: Limits{
				ActiveTasks: gen.IntN(4), ActiveContainers: gen.IntN(6), ActiveVolumes: gen.IntN(6)}}
			for round := range 3 {
				opts.Rand = seeded(gen.Uint64())
				got := pool.Place(step, opts)
				want := reference(step, cands, opts, shuffleFisherYates(seeded(1)))
				require.Equal(t, signature(step, cands, opts, want[:min(1, len(want))]),
					signature(step, cands, opts, got.Order), "case %d round %d", i, round)
				walk := Place(step, cands, opts)
				require.Equal(t, walk.Compatible, got.Compatible, "case %d round %d", i, round)
				require.Equal(t, walk.AllAtLimit, got.AllAtLimit, "case %d round %d", i, round)
				for range 1 + gen.IntN(len(cands)) {
					c := cands[gen.IntN(len(cands))]
					require.True(t, pool.SetLoad(c.Name, gen.IntN(6), gen.IntN(3), gen.IntN(4), gen.IntN(6)))
				}
			}
		}
	})
}

// TestRankedTiesAreRandom: through a rank, the one target among equal ones
// is any of them, each about as often, never a busier or refused one.
func TestRankedTiesAreRandom(t *testing.T) {
	ranked(t, func() {
		cands := []Candidate{run("a"), run("b"), run("c"), with(run("d"), func(c *Candidate) { c.BuildContainers = 1 }),
			with(run("e"), func(c *Candidate) { c.ActiveContainers = 3 })}
		pool := NewPool(cands)
		seen := map[string]int{}
		for seed := range uint64(300) {
			d := pool.Place(Step{}, Options{Chain: Chain{LimitActiveContainers, FewestBuildContainers},
				Limits: Limits{ActiveContainers: 3}, Rand: seeded(seed), Top: 1})
			require.Len(t, d.Order, 1)
			seen[d.Order[0]]++
		}
		assert.Len(t, seen, 3, "never the busier d nor e at its limit: %v", seen)
		for _, name := range []string{"a", "b", "c"} {
			assert.InDelta(t, 100, seen[name], 35, "each tie about a third of the time: %v", seen)
		}
	})
}

// TestRankedFollowsLoad: SetLoad refiles a target, so the rank's best
// bucket follows the counts, and an emptied bucket is gone.
func TestRankedFollowsLoad(t *testing.T) {
	ranked(t, func() {
		pool := NewPool([]Candidate{run("a"), run("b")})
		opts := Options{Chain: Chain{FewestBuildContainers}, Top: 1, Rand: seeded(1)}
		require.True(t, pool.SetLoad("a", 0, 2, 0, 0))
		assert.Equal(t, []string{"b"}, pool.Place(Step{}, opts).Order)
		require.True(t, pool.SetLoad("b", 0, 5, 0, 0))
		assert.Equal(t, []string{"a"}, pool.Place(Step{}, opts).Order)
		require.True(t, pool.SetLoad("a", 0, 7, 0, 0))
		assert.Equal(t, []string{"b"}, pool.Place(Step{}, opts).Order)
		r := pool.ranks[rankKey{kindBuild}]
		require.Len(t, r.order, 2, "buckets 5 and 7; 0 and 2 emptied")
		assert.Equal(t, []uint64{rankKey{kindBuild}.loadKey(&load{build: 5}), rankKey{kindBuild}.loadKey(&load{build: 7})},
			[]uint64{r.order[0].key, r.order[1].key})
		require.True(t, pool.SetLoad("b", 0, -1, 0, 0))
		assert.Equal(t, []string{"b"}, pool.Place(Step{}, opts).Order, "a negative count orders as the reference sorts it")
	})
}
