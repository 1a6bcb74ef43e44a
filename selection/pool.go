package selection

import (
	"math"
	"slices"
	"sync"
)

// Pool is a prepared candidate set. What a decision compares (state, team,
// platform, tags, worker version, load) is parsed and interned once into a
// compact slot per candidate, so that a decision walks small integers
// instead of the candidates' strings, and the reasons of the targets that
// fall out are worked out only when asked for (Decision.Reasons). A Pool is
// not safe for concurrent use with SetLoad; Place alone may run
// concurrently.
type Pool struct {
	cands     []Candidate
	slots     []slot
	index     map[string]int // candidate name → position
	teams     map[string]int32
	platforms map[string]int32
	tags      map[string]uint64 // tag → its bit
	wide      bool              // more than 64 distinct tags: compare tags as strings

	mu      sync.Mutex
	classes map[classKey]*class
	ranks   map[rankKey]*rank
}

// slot is what a decision reads of one candidate, 48 bytes: 10,000 of
// them fit a core's L2 cache.
type slot struct {
	tags         uint64
	team         int32 // 0: global
	platform     int32
	major, minor int32
	versionOK    bool // the worker version parses
	running      bool
	privileged   bool // the target allows privileged steps
	load         load
}

// load is a candidate's counts, what limits and orders read.
type load struct {
	containers, build, tasks, volumes, maxTasks int32
}

func loadOf(c *Candidate) load {
	return load{clamp(c.ActiveContainers), clamp(c.BuildContainers), clamp(c.ActiveTasks), clamp(c.ActiveVolumes),
		clamp(c.MaxActiveTasks)}
}

// clamp fits a count into an int32; no target runs 2 billion steps.
func clamp(n int) int32 { return int32(min(max(n, math.MinInt32), math.MaxInt32)) }

// NewPool prepares candidates for decisions; it keeps the slice.
func NewPool(candidates []Candidate) *Pool {
	p := &Pool{cands: candidates, slots: make([]slot, len(candidates)), index: make(map[string]int, len(candidates)),
		teams: map[string]int32{}, platforms: map[string]int32{}, tags: map[string]uint64{}, classes: map[classKey]*class{},
		ranks: map[rankKey]*rank{}}
	for i := range candidates {
		c := &candidates[i]
		p.index[c.Name] = i
		major, minor, ok := majorMinor(c.Version)
		s := slot{team: intern(p.teams, c.Team), platform: intern(p.platforms, c.Platform),
			major: int32(major), minor: int32(minor), versionOK: ok, running: c.State == StateRunning, privileged: c.AllowPrivileged,
			load: loadOf(c)}
		for _, t := range c.Tags {
			bit, ok := p.tags[t]
			if !ok && len(p.tags) == 64 {
				p.wide = true
				continue
			}
			if !ok {
				bit = 1 << len(p.tags)
				p.tags[t] = bit
			}
			s.tags |= bit
		}
		p.slots[i] = s
	}
	return p
}

// intern numbers the distinct values of m from 1; "" is 0.
func intern(m map[string]int32, v string) int32 {
	if v == "" {
		return 0
	}
	id, ok := m[v]
	if !ok {
		id = int32(len(m) + 1)
		m[v] = id
	}
	return id
}

// SetLoad updates the counts of the named candidate (the watch moved
// them), keeping everything else prepared; false if there is none. It
// must not run concurrently with Place.
func (p *Pool) SetLoad(name string, activeContainers, buildContainers, activeTasks, activeVolumes int) bool {
	i, ok := p.index[name]
	if !ok {
		return false
	}
	c := &p.cands[i]
	c.ActiveContainers, c.BuildContainers, c.ActiveTasks, c.ActiveVolumes = activeContainers, buildContainers, activeTasks, activeVolumes
	p.slots[i].load = loadOf(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.ranks {
		r.move(int32(i), &p.slots[i].load)
	}
	return true
}

// want is a step as a decision over slots reads it.
type want struct {
	team, platform int32 // -1: a value no candidate has
	tags           uint64
	untagged       bool
	impossible     bool // a tag no candidate has
	privileged     bool
	version        version
	major, minor   int32 // of version, when it checks
}

func (p *Pool) want(step Step, opts Options) want {
	w := want{team: lookup(p.teams, step.Team), platform: lookup(p.platforms, step.Platform),
		untagged: len(step.Tags) == 0, privileged: step.Privileged, version: parseVersion(opts.WorkerVersion)}
	w.major, w.minor = int32(w.version.major), int32(w.version.minor)
	for _, t := range step.Tags {
		bit, ok := p.tags[t]
		w.tags |= bit
		w.impossible = w.impossible || !ok
	}
	return w
}

func lookup(m map[string]int32, v string) int32 {
	if v == "" {
		return 0
	}
	if id, ok := m[v]; ok {
		return id
	}
	return -1
}

// compatible is incompatibility(...) == "" over slots. A pool with more
// than 64 distinct tags compares the tags as strings.
func (p *Pool) compatible(i int, w *want, step *Step) bool {
	s := &p.slots[i]
	ok := s.running && (s.team == 0 || s.team == w.team) && (w.platform == 0 || s.platform == w.platform) &&
		(!w.version.check || (s.versionOK && s.major == w.major && s.minor >= w.minor)) && (!w.privileged || s.privileged)
	switch {
	case !ok:
		return false
	case p.wide:
		return incompatibility(*step, &p.cands[i], &version{}) == ""
	case w.untagged:
		return s.tags == 0
	}
	return !w.impossible && s.tags&w.tags == w.tags
}

// class is the candidates compatible with one kind of step (team,
// platform, tags, privileged, worker version), already narrowed to the team's own when
// the step's team has a compatible target: what every decision for such a
// step walks. It depends on nothing SetLoad changes, so a pool keeps it.
type class struct {
	members    []int32
	in         []uint64 // members as a bitset over the pool's positions
	compatible bool     // any candidate passed, team or global
	teamFound  bool     // the step's team has a compatible target
}

// classKey identifies a class; the steps of a CI share a handful.
type classKey struct {
	team, platform       int32
	tags                 uint64
	untagged, impossible bool
	privileged           bool
	version              string
}

// maxClasses bounds the classes a pool keeps; past it they are dropped
// and made again as steps ask.
const maxClasses = 256

func (p *Pool) class(w *want, step *Step, workerVersion string) *class {
	if p.wide {
		return p.newClass(w, step)
	}
	key := classKey{w.team, w.platform, w.tags, w.untagged, w.impossible, w.privileged, workerVersion}
	p.mu.Lock()
	c, ok := p.classes[key]
	p.mu.Unlock()
	if ok {
		return c
	}
	c = p.newClass(w, step)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.classes) >= maxClasses {
		clear(p.classes)
	}
	p.classes[key] = c
	return c
}

func (p *Pool) newClass(w *want, step *Step) *class {
	c := &class{}
	for i := range p.slots {
		if p.compatible(i, w, step) {
			c.compatible = true
			c.teamFound = c.teamFound || p.slots[i].team != 0
			c.members = append(c.members, int32(i))
		}
	}
	if c.teamFound { // global targets compete only when no team target does
		c.members = slices.DeleteFunc(c.members, func(i int32) bool { return p.slots[i].team == 0 })
	}
	c.members = slices.Clip(c.members)
	c.in = make([]uint64, (len(p.slots)+63)/64)
	for _, i := range c.members {
		c.in[i/64] |= 1 << (i % 64)
	}
	return c
}

func (c *class) has(i int32) bool { return c.in[i/64]&(1<<(i%64)) != 0 }

// offer hands the class's members to pl. It is the hot loop of a
// decision; a one-target decision keeps its best keys inline instead of
// calling into the placer.
func (p *Pool) offer(pl *placer, members []int32) {
	for _, m := range members {
		i, l := int(m), &p.slots[m].load
		if !pl.one {
			pl.consider(i, l)
			continue
		}
		if pl.refuses(l) {
			continue
		}
		pl.approved++
		e := entry{idx: i}
		pl.keys(&e, i, l)
		switch c := compareKeys(&e, &pl.best); {
		case len(pl.ties) == 0 || c < 0:
			pl.best, pl.ties = e, append(pl.ties[:0], i)
		case c == 0:
			pl.ties = append(pl.ties, i)
		}
	}
}

// Place decides where step runs over the pool: Concourse's rules, the
// team's targets first, then the chain, keeping only the best Options.Top.
// The decision's Rejected is left nil; Reasons works it out.
func (p *Pool) Place(step Step, opts Options) Decision {
	w := p.want(step, opts)
	pl := newPlacer(step, opts.Chain, opts.Limits, opts.Top, p.inputs(step))
	var ties *[]int
	if pl.one {
		ties = tiesPool.Get().(*[]int)
		pl.ties = (*ties)[:0]
	}
	if opts.Rand != nil {
		pl.src = opts.Rand
	}
	d := Decision{pool: p, step: step, opts: opts}
	c := p.class(&w, &step, opts.WorkerVersion)
	d.Compatible, d.teamFound = c.compatible, c.teamFound
	if pl.one {
		if i := p.pickOne(&pl, c); i >= 0 {
			d.Order = []string{p.cands[i].Name}
		}
		d.AllAtLimit = d.Compatible && d.Order == nil
		*ties = pl.ties
		tiesPool.Put(ties)
		return d
	}
	p.offer(&pl, c.members)
	d.AllAtLimit = d.Compatible && pl.approved == 0
	d.Order = make([]string, 0, len(pl.heap.items))
	for _, e := range pl.heap.sorted() {
		d.Order = append(d.Order, p.cands[e.idx].Name)
	}
	return d
}

// pickOne is a one-target decision: through a rank when the class is
// large and the chain allows one, else by walking the class. -1: every
// compatible target is refused (or there is none).
func (p *Pool) pickOne(pl *placer, c *class) int {
	k, locality, ok := rankKeyOf(pl.kinds())
	if ok && !p.wide && len(c.members) >= rankedFrom && 4*len(c.members) >= len(p.slots) &&
		!(locality && slices.ContainsFunc(pl.in.list(), func(a inputsAt) bool { return a.n < 0 })) {
		return p.pickRanked(pl, c, p.rank(k), locality)
	}
	p.offer(pl, c.members)
	if len(pl.ties) == 0 {
		return -1
	}
	// One draw picks among the best; its modulo bias is under len/2^64,
	// far below anything a CI could observe.
	return pl.ties[pl.draw()%uint64(len(pl.ties))]
}

// tiesPool recycles the tie buffers of one-target decisions.
var tiesPool = sync.Pool{New: func() any { return new([]int) }}

// inputs resolves the step's inputs to candidate positions, in order.
func (p *Pool) inputs(step Step) inputs {
	var in inputs
	if len(step.Inputs) > len(in.small) {
		in.more = make([]inputsAt, 0, len(step.Inputs))
	}
	for name, n := range step.Inputs {
		i, ok := p.index[name]
		switch {
		case !ok || n == 0:
		case in.more != nil:
			in.more = append(in.more, inputsAt{i, n})
		default:
			in.small[in.n], in.n = inputsAt{i, n}, in.n+1
		}
	}
	slices.SortFunc(in.list(), func(a, b inputsAt) int { return a.i - b.i })
	return in
}

// Reasons names every candidate that fell out of the decision and why, as
// the pool stands (call it before SetLoad moves the counts); nil if none.
func (d *Decision) Reasons() map[string]string {
	if d.pool == nil {
		return d.Rejected
	}
	p, want := d.pool, parseWant(d.opts.WorkerVersion)
	chain, reasons := compile(d.opts.Chain), refusalReasons{}
	var out map[string]string
	for i := range p.cands {
		c := &p.cands[i]
		reason := incompatibility(d.step, c, want)
		switch {
		case reason != "":
		case d.teamFound && c.Team == "":
			reason = ReasonGlobalNotPreferred
		default:
			if r, refused := atLimit(d.step, loadOf(c), chain, d.opts.Limits); refused {
				reason = reasons.of(r)
			}
		}
		if reason != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[c.Name] = reason
		}
	}
	return out
}
