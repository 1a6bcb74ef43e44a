package selection

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }

func run(name string) Candidate {
	return Candidate{Name: name, State: StateRunning, Platform: "linux", Version: "2.5"}
}

func with(c Candidate, f func(*Candidate)) Candidate { f(&c); return c }

func TestParseChain(t *testing.T) {
	chain, err := ParseChain(" fewest-build-containers , limit-active-tasks")
	require.NoError(t, err)
	assert.Equal(t, Chain{FewestBuildContainers, LimitActiveTasks}, chain)

	_, err = ParseChain("random,bogus,volume-locality,volume-locality,")
	require.ErrorIs(t, err, ErrBadChain)
	for _, want := range []string{`unknown strategy "bogus"`, `"volume-locality" given twice`,
		"empty strategy name", "random must be the only strategy"} {
		assert.ErrorContains(t, err, want)
	}
	chain, err = ParseChain("random")
	require.NoError(t, err)
	assert.Equal(t, Chain{Random}, chain)
}

// TestRules covers each filter and its reason, one target per rule.
func TestRules(t *testing.T) {
	step := Step{Type: StepTask, Team: "main", Tags: []string{"gpu", "big"}, Platform: "linux"}
	tagged := func(c *Candidate) { c.Tags = []string{"gpu", "big", "extra"} }
	cands := []Candidate{
		with(run("ok"), tagged),
		with(run("landed"), func(c *Candidate) { tagged(c); c.State = "landed" }),
		with(run("stalled"), func(c *Candidate) { tagged(c); c.State = "stalled" }),
		with(run("other"), func(c *Candidate) { tagged(c); c.Team = "other" }),
		with(run("notags"), func(c *Candidate) {}),
		with(run("halftags"), func(c *Candidate) { c.Tags = []string{"big"} }),
		with(run("win"), func(c *Candidate) { tagged(c); c.Platform = "windows" }),
		with(run("old"), func(c *Candidate) { tagged(c); c.Version = "1.2" }),
		with(run("oldminor"), func(c *Candidate) { tagged(c); c.Version = "2.4" }),
		with(run("newminor"), func(c *Candidate) { tagged(c); c.Version = "2.7" }),
		with(run("busy"), func(c *Candidate) { tagged(c); c.ActiveTasks = 4 }),
	}
	d := Place(step, cands, Options{WorkerVersion: "2.5", Limits: Limits{ActiveTasks: 4},
		Chain: Chain{LimitActiveTasks}, Rand: seeded(1)})
	assert.ElementsMatch(t, []string{"ok", "newminor"}, d.Order)
	assert.Equal(t, map[string]string{
		"landed":   "state landed",
		"stalled":  "state stalled",
		"other":    "team other",
		"notags":   "missing tags gpu, big",
		"halftags": "missing tags gpu",
		"win":      "platform windows",
		"old":      "worker version 1.2",
		"oldminor": "worker version 2.4",
		"busy":     "at limit active-tasks 4/4",
	}, d.Rejected)
	assert.True(t, d.Compatible)
	assert.False(t, d.AllAtLimit)

	d = Place(Step{Type: StepGet}, []Candidate{with(run("t"), tagged)}, Options{})
	assert.Equal(t, map[string]string{"t": "untagged step"}, d.Rejected)
	assert.False(t, d.Compatible)
}

// TestPrivileged: a privileged step goes only to a target whose policy
// allows it, the others named with the policy's key; an unprivileged
// step goes to both, and the pool keeps the two kinds of step apart.
func TestPrivileged(t *testing.T) {
	allows := with(run("allows"), func(c *Candidate) { c.AllowPrivileged = true })
	pool := NewPool([]Candidate{run("refuses"), allows})
	opts := Options{Chain: Chain{FewestBuildContainers}}
	d := pool.Place(Step{Type: StepTask, Privileged: true}, opts)
	assert.Equal(t, []string{"allows"}, d.Order)
	assert.Equal(t, map[string]string{"refuses": ReasonPrivileged}, d.Reasons())
	assert.Contains(t, ReasonPrivileged, "steps.allowPrivileged in its target.yaml")
	assert.ElementsMatch(t, []string{"refuses", "allows"}, pool.Place(Step{Type: StepTask}, opts).Order)

	d = Place(Step{Type: StepTask, Privileged: true}, []Candidate{run("refuses")}, Options{})
	assert.False(t, d.Compatible, "no target can ever take it as they stand: it waits for one")
	assert.Equal(t, map[string]string{"refuses": ReasonPrivileged}, d.Rejected)
	d = Place(Step{Type: StepTask, Privileged: true, Tags: []string{"gpu"}}, []Candidate{run("refuses")}, Options{})
	assert.Equal(t, "missing tags gpu", d.Rejected["refuses"], "a target that fails another rule names that one")
}

func TestTeamPreference(t *testing.T) {
	global, team := run("global"), with(run("team"), func(c *Candidate) { c.Team = "main" })
	landedTeam := with(team, func(c *Candidate) { c.State = "landed" })
	for _, tc := range []struct {
		name  string
		step  Step
		cands []Candidate
		order []string
		rej   map[string]string
	}{
		{"team first", Step{Team: "main"}, []Candidate{global, team}, []string{"team"},
			map[string]string{"global": ReasonGlobalNotPreferred}},
		{"global when team incompatible", Step{Team: "main"}, []Candidate{global, landedTeam},
			[]string{"global"}, map[string]string{"team": "state landed"}},
		{"teamless step never on team targets", Step{}, []Candidate{global, team},
			[]string{"global"}, map[string]string{"team": "team main"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Place(tc.step, tc.cands, Options{Rand: seeded(2)})
			assert.Equal(t, tc.order, d.Order)
			assert.Equal(t, tc.rej, d.Rejected)
		})
	}
	// A team target at its limit makes the step wait; it does not fall back
	// to the global one (preference is decided before limits).
	busy := with(team, func(c *Candidate) { c.ActiveTasks = 2; c.MaxActiveTasks = 2 })
	d := Place(Step{Type: StepTask, Team: "main"}, []Candidate{global, busy},
		Options{Chain: Chain{LimitActiveTasks}, Rand: seeded(3)})
	assert.Empty(t, d.Order)
	assert.True(t, d.Compatible)
	assert.True(t, d.AllAtLimit)
	assert.Equal(t, "at limit active-tasks 2/2", d.Rejected["team"])
}

// TestStrategies covers each strategy's order and refusals.
func TestStrategies(t *testing.T) {
	c := func(name string, f func(*Candidate)) Candidate { return with(run(name), f) }
	cands := []Candidate{
		c("a", func(c *Candidate) { c.BuildContainers, c.ActiveTasks, c.ActiveContainers, c.ActiveVolumes = 3, 1, 9, 1 }),
		c("b", func(c *Candidate) { c.BuildContainers, c.ActiveTasks, c.ActiveContainers, c.ActiveVolumes = 1, 3, 1, 9 }),
		c("c", func(c *Candidate) { c.BuildContainers, c.ActiveTasks, c.ActiveContainers, c.ActiveVolumes = 2, 2, 2, 2 }),
		c("d", func(c *Candidate) { c.BuildContainers, c.ActiveTasks, c.MaxActiveTasks = 0, 5, 5 }),
	}
	inputs := map[string]int{"c": 2, "a": 1}
	for _, tc := range []struct {
		chain  string
		typ    string
		limits Limits
		order  []string
		rej    map[string]string
	}{
		{"volume-locality", StepTask, Limits{}, []string{"c", "a"}, nil}, // then b, d in random order
		{"fewest-build-containers", StepGet, Limits{}, []string{"d", "b", "c", "a"}, nil},
		{"limit-active-tasks", StepTask, Limits{ActiveTasks: 3}, []string{"a", "c"},
			map[string]string{"b": "at limit active-tasks 3/3", "d": "at limit active-tasks 5/5"}},
		{"limit-active-tasks,fewest-build-containers", StepCheck, Limits{ActiveTasks: 1},
			[]string{"d", "b", "c", "a"}, nil}, // no task: neither order nor limit
		{"limit-active-containers", StepPut, Limits{ActiveContainers: 9}, nil,
			map[string]string{"a": "at limit active-containers 9/9"}},
		{"limit-active-volumes,fewest-build-containers", StepPut, Limits{ActiveVolumes: 2},
			[]string{"d", "a"}, map[string]string{"b": "at limit active-volumes 9/2",
				"c": "at limit active-volumes 2/2"}},
		{"fewest-build-containers,limit-active-tasks", StepTask, Limits{ActiveTasks: 3},
			[]string{"c", "a"}, map[string]string{"b": "at limit active-tasks 3/3",
				"d": "at limit active-tasks 5/5"}},
	} {
		t.Run(tc.chain+"/"+tc.typ, func(t *testing.T) {
			chain, err := ParseChain(tc.chain)
			require.NoError(t, err)
			d := Place(Step{Type: tc.typ, Inputs: inputs}, cands,
				Options{Chain: chain, Limits: tc.limits, Rand: seeded(4)})
			if tc.order != nil {
				require.GreaterOrEqual(t, len(d.Order), len(tc.order))
				assert.Equal(t, tc.order, d.Order[:len(tc.order)])
			}
			assert.Equal(t, tc.rej, d.Rejected)
			assert.Len(t, d.Order, len(cands)-len(tc.rej))
		})
	}
}

// TestRandomTies: equal candidates come out in every order, chosen by the
// injected source, and the same seed gives the same order.
func TestRandomTies(t *testing.T) {
	cands := []Candidate{run("a"), run("b"), run("c")}
	seen := map[string]bool{}
	for seed := range uint64(200) {
		d := Place(Step{}, cands, Options{Chain: Chain{Random}, Rand: seeded(seed)})
		again := Place(Step{}, cands, Options{Chain: Chain{Random}, Rand: seeded(seed)})
		require.Equal(t, d.Order, again.Order)
		seen[fmt.Sprint(d.Order)] = true
	}
	assert.Len(t, seen, 6)
}

func TestTop(t *testing.T) {
	cands := make([]Candidate, 50)
	for i := range cands {
		cands[i] = with(run(fmt.Sprint(i)), func(c *Candidate) { c.BuildContainers = 50 - i })
	}
	d := Place(Step{}, cands, Options{Chain: Chain{FewestBuildContainers}, Top: 3, Rand: seeded(5)})
	assert.Equal(t, []string{"49", "48", "47"}, d.Order)
}

// TestMatchesReference: for many random pools and chains, Place orders
// exactly as the straightforward algorithm given the same random draws.
// With Top k, Place draws only for candidates that can still be kept, so
// the draws differ: its k must be the reference's first k up to ties, the
// same keys in the same places.
func TestMatchesReference(t *testing.T) {
	chains := []string{"volume-locality", "random", "fewest-build-containers,limit-active-tasks",
		"limit-active-containers,limit-active-volumes,volume-locality",
		"limit-active-tasks,volume-locality,fewest-build-containers"}
	gen := seeded(99)
	for i := range 500 {
		chain, err := ParseChain(chains[i%len(chains)])
		require.NoError(t, err)
		step, cands := randomPool(gen, 1+gen.IntN(60))
		opts := Options{Chain: chain, WorkerVersion: "2.5", Limits: Limits{
			ActiveTasks: gen.IntN(4), ActiveContainers: gen.IntN(6), ActiveVolumes: gen.IntN(6)}}
		seed := gen.Uint64()
		opts.Rand = seeded(seed)
		got := Place(step, cands, opts)
		want := reference(step, cands, opts, shuffleLike(seeded(seed)))
		require.Equal(t, fmt.Sprint(want), fmt.Sprint(got.Order), "case %d", i)
		opts.Rand, opts.Top = seeded(seed), 1+gen.IntN(5)
		top := Place(step, cands, opts)
		first := want[:min(opts.Top, len(want))]
		require.Equal(t, signature(step, cands, opts, first), signature(step, cands, opts, top.Order), "case %d top", i)
		for _, name := range top.Order {
			require.Contains(t, want, name, "case %d top", i)
		}
	}
}

func randomPool(r *rand.Rand, n int) (Step, []Candidate) {
	teams := []string{"", "", "main", "other"}
	types := []string{StepTask, StepGet, StepPut, StepCheck}
	step := Step{Type: types[r.IntN(4)], Team: teams[r.IntN(3)], Inputs: map[string]int{}}
	if r.IntN(4) == 0 {
		step.Tags = []string{"gpu"}
	}
	step.Privileged = r.IntN(5) == 0
	cands := make([]Candidate, n)
	for i := range cands {
		c := run(fmt.Sprint("w", i))
		c.Team = teams[r.IntN(4)]
		if r.IntN(10) == 0 {
			c.State = "landing"
		}
		if r.IntN(5) == 0 {
			c.Tags = []string{"gpu"}
		}
		c.AllowPrivileged = r.IntN(2) == 0
		c.BuildContainers, c.ActiveContainers = r.IntN(3), r.IntN(6)
		c.ActiveTasks, c.ActiveVolumes, c.MaxActiveTasks = r.IntN(4), r.IntN(6), r.IntN(3)
		step.Inputs[c.Name] = r.IntN(3)
		cands[i] = c
	}
	return step, cands
}

func TestVersion(t *testing.T) {
	want := parseWant("2.5")
	for have, ok := range map[string]bool{"2.5": true, "2.6": true, "2.10": true, "2.5.1": true,
		"3.5": false, "2.4": false, "1.9": false, "": false, "2": false, "x.5": false, "2.x": false} {
		assert.Equal(t, ok, want.accepts(have), have)
	}
}

// signature is the chain's sort keys of the named candidates, in order.
func signature(step Step, cands []Candidate, opts Options, names []string) []string {
	pool := NewPool(cands)
	pl := newPlacer(step, opts.Chain, opts.Limits, 0, pool.inputs(step))
	out := make([]string, len(names))
	for i, name := range names {
		j := pool.index[name]
		var e entry
		pl.in.next = 0 // asked out of order
		pl.keys(&e, j, &pool.slots[j].load)
		out[i] = fmt.Sprint(e.keys)
	}
	return out
}

// TestTopOneTiesAreRandom: the one target a step gets among equal ones is
// any of them, by the injected source.
func TestTopOneTiesAreRandom(t *testing.T) {
	cands := []Candidate{run("a"), run("b"), run("c"), with(run("d"), func(c *Candidate) { c.BuildContainers = 1 })}
	seen := map[string]int{}
	for seed := range uint64(300) {
		d := Place(Step{}, cands, Options{Chain: Chain{FewestBuildContainers}, Rand: seeded(seed), Top: 1})
		require.Len(t, d.Order, 1)
		seen[d.Order[0]]++
	}
	assert.Len(t, seen, 3, "never the busier d: %v", seen)
	for _, name := range []string{"a", "b", "c"} {
		assert.InDelta(t, 100, seen[name], 35, "each tie about a third of the time: %v", seen)
	}
}
