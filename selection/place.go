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
	if c := compareKeys(a, b); c != 0 {
		return c < 0
	}
	return a.draw < b.draw
}

// compareKeys orders entries by their keys alone.
func compareKeys(a, b *entry) int {
	for i := range a.keys {
		if a.keys[i] != b.keys[i] {
			if a.keys[i] < b.keys[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// Place decides where step runs: it filters candidates by Concourse's rules,
// prefers the step's team, refuses candidates at a limit and orders the rest
// by the chain, and names every candidate that fell out in Rejected. It is
// NewPool(candidates).Place plus Reasons; a caller deciding again over the
// same targets keeps the Pool and asks for reasons only when it shows them.
func Place(step Step, candidates []Candidate, opts Options) Decision {
	d := NewPool(candidates).Place(step, opts)
	d.Rejected = d.Reasons()
	return d
}

// placer carries one decision's state across its passes. The chain is
// compiled into what the per-candidate loop needs: the limits that refuse
// (-1: none) and the kinds of its sort keys.
type placer struct {
	heap     heap
	in       inputs
	src      *rand.Rand // nil: math/rand/v2's shared source
	keyKinds [maxKeys]kind
	nKeys    int
	maxTasks int32 // global max-active-tasks for task steps; -1: not limited
	maxConts int32 // -1: not limited
	maxVols  int32 // -1: not limited
	approved int
	bounded  bool
	// one: Top 1 needs no heap: the best keys seen and the candidates tied
	// at them, of which one draw picks the step's target.
	one  bool
	best entry
	ties []int
}

func newPlacer(step Step, chain Chain, l Limits, top int, in inputs) placer {
	p := placer{heap: heap{cap: top}, in: in, maxTasks: -1, maxConts: -1, maxVols: -1,
		bounded: top > 0, one: top == 1}
	if chain == nil {
		chain = DefaultChain
	}
	for _, s := range chain {
		switch k := kindOf(s); k {
		case kindTasks:
			if step.Type == StepTask {
				p.maxTasks = clamp(l.ActiveTasks) // a target's own limit may still apply
				p.keyKinds[p.nKeys], p.nKeys = k, p.nKeys+1
			}
		case kindContainers:
			p.maxConts = positive(l.ActiveContainers)
		case kindVolumes:
			p.maxVols = positive(l.ActiveVolumes)
		case kindLocality, kindBuild:
			p.keyKinds[p.nKeys], p.nKeys = k, p.nKeys+1
		}
	}
	return p
}

// kinds is the chain's sort keys, in chain order.
func (p *placer) kinds() []kind { return p.keyKinds[:p.nKeys] }

// draw is the next random number of the decision's source.
func (p *placer) draw() uint64 {
	if p.src != nil {
		return p.src.Uint64()
	}
	return rand.Uint64()
}

func positive(n int) int32 {
	if n > 0 {
		return clamp(n)
	}
	return -1
}

// refuses is atLimit's verdict, with the chain compiled.
func (p *placer) refuses(l *load) bool {
	if p.maxTasks >= 0 {
		max := p.maxTasks
		if l.maxTasks > 0 {
			max = l.maxTasks
		}
		if max > 0 && l.tasks >= max {
			return true
		}
	}
	return (p.maxConts > 0 && l.containers >= p.maxConts) || (p.maxVols > 0 && l.volumes >= p.maxVols)
}

// consider drops candidate i at a limit, or offers it to the heap. With
// no Top every candidate draws its tie-break first, as in Concourse's
// shuffle. With Top k the draw is made only when it can matter: a candidate
// at a limit, or whose keys are worse than the worst kept one, loses
// whatever it draws. The draws are independent, so skipping those leaves
// every tie as likely as the shuffle makes it, and a bounded decision
// draws for few targets.
func (p *placer) consider(i int, l *load) {
	e := entry{idx: i}
	if !p.bounded {
		e.draw = p.draw()
	}
	if p.refuses(l) {
		return
	}
	p.approved++
	p.keys(&e, i, l)
	switch {
	case p.heap.full():
		c := compareKeys(&e, &p.heap.items[0])
		if c > 0 {
			return
		}
		e.draw = p.draw()
		if c == 0 && e.draw >= p.heap.items[0].draw {
			return
		}
	case p.bounded:
		e.draw = p.draw()
	}
	p.heap.push(&e)
}

// keys fills e's sort keys for candidate i.
func (p *placer) keys(e *entry, i int, l *load) {
	for k, kd := range p.kinds() {
		switch kd {
		case kindLocality:
			e.keys[k] = -p.in.on(i)
		case kindBuild:
			e.keys[k] = int(l.build)
		default:
			e.keys[k] = int(l.tasks)
		}
	}
}

// inputs answers "how many of the step's inputs are on candidate i" for
// candidates asked in increasing order, as a scan asks: the few positions
// holding inputs are sorted, and a cursor follows the scan, so a
// candidate costs one comparison.
// The first few live in the struct itself, so that a decision's placer,
// inputs included, stays on the stack.
type inputs struct {
	small [8]inputsAt
	more  []inputsAt // all of them, when more than fit small
	n     int
	next  int
}

// inputsAt is n of the step's inputs on the candidate at position i.
type inputsAt struct{ i, n int }

// list is the inputs sorted by position.
func (in *inputs) list() []inputsAt {
	if in.more != nil {
		return in.more
	}
	return in.small[:in.n]
}

func (in *inputs) on(i int) int {
	at := in.list()
	for in.next < len(at) && at[in.next].i < i {
		in.next++
	}
	if in.next < len(at) && at[in.next].i == i {
		return at[in.next].n
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
	if step.Privileged && !c.AllowPrivileged {
		return ReasonPrivileged
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
	w := parseVersion(v)
	return &w
}

func parseVersion(v string) version {
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
func atLimit(step Step, c load, chain []kind, l Limits) (refusal, bool) {
	for _, s := range chain {
		have, max, what := 0, 0, ""
		switch s {
		case kindTasks:
			if step.Type != StepTask {
				continue
			}
			have, max, what = int(c.tasks), l.ActiveTasks, "active-tasks"
			if c.maxTasks > 0 {
				max = int(c.maxTasks)
			}
		case kindContainers:
			have, max, what = int(c.containers), l.ActiveContainers, "active-containers"
		case kindVolumes:
			have, max, what = int(c.volumes), l.ActiveVolumes, "active-volumes"
		default:
			continue
		}
		if max > 0 && have >= max {
			return refusal{what, have, max}, true
		}
	}
	return refusal{}, false
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
		kinds[i] = kindOf(s)
	}
	return kinds
}

func kindOf(s Strategy) kind {
	switch s {
	case VolumeLocality:
		return kindLocality
	case FewestBuildContainers:
		return kindBuild
	case LimitActiveTasks:
		return kindTasks
	case LimitActiveContainers:
		return kindContainers
	case LimitActiveVolumes:
		return kindVolumes
	}
	return kindNone
}
