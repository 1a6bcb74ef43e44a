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
