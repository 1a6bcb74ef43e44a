package selection

import (
	"cmp"
	"math/rand/v2"
	"slices"
)

// reference is a straightforward rendering of Concourse's algorithm, kept to
// check and measure Place against: filter, prefer the team, shuffle, apply
// every strategy's order as a full stable sort from last to first, then drop
// the candidates a limit refuses.
func reference(step Step, candidates []Candidate, opts Options, shuffle func([]*Candidate)) []string {
	chain := opts.Chain
	if chain == nil {
		chain = DefaultChain
	}
	want := parseWant(opts.WorkerVersion)
	var compat []*Candidate
	team := false
	for i := range candidates {
		c := &candidates[i]
		if incompatibility(step, c, want) == "" {
			compat = append(compat, c)
			team = team || (step.Team != "" && c.Team == step.Team)
		}
	}
	var pool []*Candidate
	for _, c := range compat {
		if !team || c.Team != "" {
			pool = append(pool, c)
		}
	}
	shuffle(pool)
	for i := len(chain) - 1; i >= 0; i-- {
		referenceOrder(chain[i], step, pool, opts.Limits)
	}
	var order []string
	for _, c := range pool {
		if _, refused := atLimit(step, loadOf(c), compile(chain), opts.Limits); !refused {
			order = append(order, c.Name)
		}
	}
	return order
}

func referenceOrder(s Strategy, step Step, pool []*Candidate, l Limits) {
	under := func(have, max int) int {
		if max == 0 || have < max {
			return 0
		}
		return 1
	}
	var by func(*Candidate) int
	switch s {
	case VolumeLocality:
		by = func(c *Candidate) int { return -step.Inputs[c.Name] }
	case FewestBuildContainers:
		by = func(c *Candidate) int { return c.BuildContainers }
	case LimitActiveTasks:
		if step.Type != StepTask {
			return
		}
		by = func(c *Candidate) int { return c.ActiveTasks }
	case LimitActiveContainers:
		by = func(c *Candidate) int { return under(c.ActiveContainers, l.ActiveContainers) }
	case LimitActiveVolumes:
		by = func(c *Candidate) int { return under(c.ActiveVolumes, l.ActiveVolumes) }
	default:
		return
	}
	slices.SortStableFunc(pool, func(a, b *Candidate) int { return cmp.Compare(by(a), by(b)) })
}

// shuffleLike shuffles the way Place breaks ties: one draw per candidate in
// input order, then order by draw. With the same seed, reference and Place
// must then agree exactly.
func shuffleLike(r *rand.Rand) func([]*Candidate) {
	return func(pool []*Candidate) {
		draws := make(map[*Candidate]uint64, len(pool))
		for _, c := range pool {
			draws[c] = r.Uint64()
		}
		slices.SortStableFunc(pool, func(a, b *Candidate) int { return cmp.Compare(draws[a], draws[b]) })
	}
}

// shuffleFisherYates is Concourse's own pre-shuffle.
func shuffleFisherYates(r *rand.Rand) func([]*Candidate) {
	return func(pool []*Candidate) {
		r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	}
}
