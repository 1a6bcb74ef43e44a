package selection

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// maxKeys bounds the sort key: only volume-locality, fewest-build-containers
// and limit-active-tasks order approved targets, each at most once.
const maxKeys = 3

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
// keeps the best k in a bounded heap. A step without a team cannot prefer
// team targets, so it is decided in one pass; a team step needs a second,
// since global targets compete only when no team target is compatible.
func Place(step Step, candidates []Candidate, opts Options) Decision {
	p := placer{step: step, chain: compile(opts.Chain), limits: opts.Limits,
		heap: heap{cap: opts.Top}, in: newInputs(step), reasons: refusalReasons{},
		draw: rand.Uint64, isTask: step.Type == StepTask}
	if opts.Rand != nil {
		p.draw = opts.Rand.Uint64
	}
	want := parseWant(opts.WorkerVersion)
	var compatible []bool
	if step.Team != "" {
		compatible = make([]bool, len(candidates))
	}
	d, teamFound := Decision{}, false
	for i := range candidates {
		c := &candidates[i]
		if reason := incompatibility(step, c, want); reason != "" {
			p.rejected = append(p.rejected, rejection{i, reason})
			continue
		}
		d.Compatible = true
		if compatible == nil {
			p.consider(i, c)
			continue
		}
		compatible[i] = true
		teamFound = teamFound || c.Team == step.Team
	}
	for i := range compatible {
		switch c := &candidates[i]; {
		case !compatible[i]:
		case teamFound && c.Team == "":
			p.rejected = append(p.rejected, rejection{i, ReasonGlobalNotPreferred})
		default:
			p.consider(i, c)
		}
	}
	return p.decide(d, candidates)
}

// placer carries one decision's state across its passes.
type placer struct {
	step     Step
	chain    []kind
	limits   Limits
	heap     heap
	in       inputs
	reasons  refusalReasons
	rejected []rejection
	draw     func() uint64
	isTask   bool
}

// consider draws c's tie-break (before the limit check, so every candidate
// in the pool draws once, as in Concourse's shuffle), refuses it at a limit
// or offers it to the heap.
func (p *placer) consider(i int, c *Candidate) {
	e := entry{draw: p.draw(), idx: i}
	if r, refused := atLimit(p.step, c, p.chain, p.limits); refused {
		p.rejected = append(p.rejected, rejection{i, p.reasons.of(r)})
		return
	}
	keys(&e, &p.in, p.isTask, c, p.chain)
	if p.heap.wants(&e) {
		p.heap.push(&e)
	}
}

func (p *placer) decide(d Decision, candidates []Candidate) Decision {
	if len(p.rejected) > 0 {
		d.Rejected = make(map[string]string, len(p.rejected))
		for _, r := range p.rejected {
			d.Rejected[candidates[r.idx].Name] = r.reason
		}
	}
	d.AllAtLimit = d.Compatible && len(p.heap.items) == 0
	d.Order = make([]string, 0, len(p.heap.items))
	for _, e := range p.heap.sorted() {
		d.Order = append(d.Order, candidates[e.idx].Name)
	}
	return d
}

type rejection struct {
	idx    int
	reason string
}

// inputs answers "how many of the step's inputs are on this target". A step
// has a handful of inputs, so comparing names beats hashing every
// candidate's name into the map; large maps are still looked up.
type inputs struct {
	names  []string
	counts []int
	m      map[string]int
}

func newInputs(step Step) inputs {
	if len(step.Inputs) > 8 {
		return inputs{m: step.Inputs}
	}
	var in inputs
	for name, n := range step.Inputs {
		in.names = append(in.names, name)
		in.counts = append(in.counts, n)
	}
	return in
}

func (in *inputs) on(target string) int {
	if in.m != nil {
		return in.m[target]
	}
	for i, name := range in.names {
		// Lengths live in the string headers already at hand; comparing
		// them first skips most reads of name bytes (a cache miss each).
		if len(name) == len(target) && name[len(name)-1] == target[len(target)-1] && name == target {
			return in.counts[i]
		}
	}
	return 0
}

// incompatibility returns why c can never run step, or "" if it can.
func incompatibility(step Step, c *Candidate, want *version) string {
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
// ok remembers the last accepted version string: targets mostly share one, so
// most candidates are accepted by a string compare instead of a parse.
type version struct {
	check        bool
	major, minor int
	ok           string
}

// parseWant parses the required version once per decision. An unparseable
// requirement rejects every candidate rather than silently skipping the check.
func parseWant(v string) *version {
	if v == "" {
		return &version{}
	}
	major, minor, ok := majorMinor(v)
	if !ok {
		major = -1
	}
	return &version{check: true, major: major, minor: minor}
}

// accepts: same major, minor at least the required one.
func (w *version) accepts(have string) bool {
	if have == w.ok && have != "" {
		return true
	}
	major, minor, ok := majorMinor(have)
	if ok && major == w.major && minor >= w.minor {
		w.ok = have
		return true
	}
	return false
}

// majorMinor parses "M", "M.m" or "M.m.anything" into M and m.
func majorMinor(v string) (major, minor int, ok bool) {
	major, rest, ok := leadingInt(v)
	if !ok {
		return 0, 0, false
	}
	if rest == "" {
		return major, 0, true
	}
	if rest[0] != '.' {
		return 0, 0, false
	}
	minor, rest, ok = leadingInt(rest[1:])
	return major, minor, ok && (rest == "" || rest[0] == '.')
}

func leadingInt(s string) (n int, rest string, ok bool) {
	i := 0
	for ; i < len(s) && i < 9 && s[i] >= '0' && s[i] <= '9'; i++ {
		n = n*10 + int(s[i]-'0')
	}
	return n, s[i:], i > 0
}

// refusal is a limit a candidate is at.
type refusal struct {
	what      string
	have, max int
}

// refusalReasons formats each distinct refusal once per decision: thousands
// of targets at one limit share a handful of reason strings.
type refusalReasons map[refusal]string

func (m refusalReasons) of(r refusal) string {
	if s, ok := m[r]; ok {
		return s
	}
	s := "at limit " + r.what + " " + strconv.Itoa(r.have) + "/" + strconv.Itoa(r.max)
	m[r] = s
	return s
}

// atLimit reports the limit of the chain at which c refuses step, if any.
// limit-active-tasks refuses task steps only; a target's own MaxActiveTasks
// beats the global limit.
func atLimit(step Step, c *Candidate, chain []kind, l Limits) (refusal, bool) {
	for _, s := range chain {
		have, max, what := 0, 0, ""
		switch s {
		case kindTasks:
			if step.Type != StepTask {
				continue
			}
			have, max, what = c.ActiveTasks, l.ActiveTasks, "active-tasks"
			if c.MaxActiveTasks > 0 {
				max = c.MaxActiveTasks
			}
		case kindContainers:
			have, max, what = c.ActiveContainers, l.ActiveContainers, "active-containers"
		case kindVolumes:
			have, max, what = c.ActiveVolumes, l.ActiveVolumes, "active-volumes"
		default:
			continue
		}
		if max > 0 && have >= max {
			return refusal{what, have, max}, true
		}
	}
	return refusal{}, false
}

// keys fills e's sort key. limit-active-containers and -volumes only move
// at-limit targets last, and those are refused, so they add no key among
// approved targets; limit-active-tasks orders task steps by fewest tasks.
func keys(e *entry, in *inputs, isTask bool, c *Candidate, chain []kind) {
	i := 0
	for _, s := range chain {
		switch s {
		case kindLocality:
			e.keys[i] = -in.on(c.Name)
		case kindBuild:
			e.keys[i] = c.BuildContainers
		case kindTasks:
			if isTask {
				e.keys[i] = c.ActiveTasks
			}
		default:
			continue
		}
		i++
	}
}

// kind is a strategy resolved once per decision, so the per-candidate loops
// switch on a byte instead of comparing strategy names.
type kind uint8

const (
	kindNone kind = iota
	kindLocality
	kindBuild
	kindTasks
	kindContainers
	kindVolumes
)

func compile(chain Chain) []kind {
	if chain == nil {
		chain = DefaultChain
	}
	kinds := make([]kind, len(chain))
	for i, s := range chain {
		switch s {
		case VolumeLocality:
			kinds[i] = kindLocality
		case FewestBuildContainers:
			kinds[i] = kindBuild
		case LimitActiveTasks:
			kinds[i] = kindTasks
		case LimitActiveContainers:
			kinds[i] = kindContainers
		case LimitActiveVolumes:
			kinds[i] = kindVolumes
		}
	}
	return kinds
}
