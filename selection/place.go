package selection

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// maxKeys bounds the sort key: a chain holds each of the six strategies at
// most once, and random adds no key.
const maxKeys = 6

// entry is an approved candidate with its composite key: keys in chain order
// (smaller is better), then a random draw standing in for Concourse's
// shuffle. Ordering by (keys, draw) equals shuffling and then applying each
// strategy as a stable sort from last to first.
type entry struct {
	keys [maxKeys]int
	draw uint64
	idx  int
}

func less(a, b *entry) bool {
	for i := range a.keys {
		if a.keys[i] != b.keys[i] {
			return a.keys[i] < b.keys[i]
		}
	}
	return a.draw < b.draw
}

// Place decides where step runs: it filters candidates by Concourse's rules,
// prefers the step's team, refuses candidates at a limit and orders the rest
// by the chain. It never sorts more than it returns: with Options.Top k it
// keeps the best k in a bounded heap.
func Place(step Step, candidates []Candidate, opts Options) Decision {
	chain := opts.Chain
	if chain == nil {
		chain = DefaultChain
	}
	d := Decision{}
	want := parseWant(opts.WorkerVersion)
	compatible := make([]bool, len(candidates))
	teamFound := false
	for i := range candidates {
		c := &candidates[i]
		if reason := incompatibility(step, c, want); reason != "" {
			d.reject(c.Name, reason)
			continue
		}
		compatible[i] = true
		d.Compatible = true
		teamFound = teamFound || (step.Team != "" && c.Team == step.Team)
	}
	draw := opts.Rand.Uint64
	if opts.Rand == nil {
		draw = rand.Uint64
	}
	h := heap{cap: opts.Top}
	for i := range candidates {
		c := &candidates[i]
		if !compatible[i] {
			continue
		}
		if teamFound && c.Team == "" {
			d.reject(c.Name, ReasonGlobalNotPreferred)
			continue
		}
		e := entry{draw: draw(), idx: i}
		if reason := atLimit(step, c, chain, opts.Limits); reason != "" {
			d.reject(c.Name, reason)
			continue
		}
		keys(&e, step, c, chain)
		h.push(e)
	}
	d.AllAtLimit = d.Compatible && len(h.items) == 0
	d.Order = make([]string, 0, len(h.items))
	for _, e := range h.sorted() {
		d.Order = append(d.Order, candidates[e.idx].Name)
	}
	return d
}

func (d *Decision) reject(name, reason string) {
	if d.Rejected == nil {
		d.Rejected = map[string]string{}
	}
	d.Rejected[name] = reason
}

// incompatibility returns why c can never run step, or "" if it can.
func incompatibility(step Step, c *Candidate, want version) string {
	switch {
	case c.State != StateRunning:
		return "state " + c.State
	case c.Team != "" && c.Team != step.Team:
		return "team " + c.Team
	case want.check && !want.accepts(c.Version):
		return "worker version " + c.Version
	case step.Platform != "" && c.Platform != step.Platform:
		return "platform " + c.Platform
	case len(step.Tags) == 0 && len(c.Tags) > 0:
		return "untagged step"
	}
	var missing []string
	for _, t := range step.Tags {
		if !slices.Contains(c.Tags, t) {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return "missing tags " + strings.Join(missing, ", ")
	}
	return ""
}

// version is the required worker version; check is false when none is set.
type version struct {
	check        bool
	major, minor int
}

// parseWant parses the required version once per decision. An unparseable
// requirement rejects every candidate rather than silently skipping the check.
func parseWant(v string) version {
	if v == "" {
		return version{}
	}
	major, minor, ok := majorMinor(v)
	if !ok {
		major = -1
	}
	return version{check: true, major: major, minor: minor}
}

// accepts: same major, minor at least the required one.
func (w version) accepts(have string) bool {
	major, minor, ok := majorMinor(have)
	return ok && major == w.major && minor >= w.minor
}

func majorMinor(v string) (major, minor int, ok bool) {
	majS, rest, _ := strings.Cut(v, ".")
	minS, _, _ := strings.Cut(rest, ".")
	major, err1 := strconv.Atoi(majS)
	if minS == "" {
		minS = "0"
	}
	minor, err2 := strconv.Atoi(minS)
	return major, minor, err1 == nil && err2 == nil
}

// atLimit returns why c refuses step under the chain's limit strategies
// ("at limit active-tasks 4/4"), or "". limit-active-tasks refuses task
// steps only; a target's own MaxActiveTasks beats the global limit.
func atLimit(step Step, c *Candidate, chain Chain, l Limits) string {
	for _, s := range chain {
		have, max, what := 0, 0, ""
		switch s {
		case LimitActiveTasks:
			if step.Type != StepTask {
				continue
			}
			have, max, what = c.ActiveTasks, l.ActiveTasks, "active-tasks"
			if c.MaxActiveTasks > 0 {
				max = c.MaxActiveTasks
			}
		case LimitActiveContainers:
			have, max, what = c.ActiveContainers, l.ActiveContainers, "active-containers"
		case LimitActiveVolumes:
			have, max, what = c.ActiveVolumes, l.ActiveVolumes, "active-volumes"
		default:
			continue
		}
		if max > 0 && have >= max {
			return "at limit " + what + " " + strconv.Itoa(have) + "/" + strconv.Itoa(max)
		}
	}
	return ""
}

// keys fills e's sort key. limit-active-containers and -volumes only move
// at-limit targets last, and those are refused, so they add no key among
// approved targets; limit-active-tasks orders task steps by fewest tasks.
func keys(e *entry, step Step, c *Candidate, chain Chain) {
	for i, s := range chain {
		switch s {
		case VolumeLocality:
			e.keys[i] = -step.Inputs[c.Name]
		case FewestBuildContainers:
			e.keys[i] = c.BuildContainers
		case LimitActiveTasks:
			if step.Type == StepTask {
				e.keys[i] = c.ActiveTasks
			}
		}
	}
}
