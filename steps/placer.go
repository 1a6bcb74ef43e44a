package steps

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// The placer is the queue: while this gateway holds the placer Lease it
// places every waiting step of the installation, first come (by
// submission) first served, over a selection.Pool of the targets that the
// targets' watches keep current, and it keeps the check sandboxes. One
// placer at a time decides, so a limit holds however many gateways take
// steps: a target's count is its unfinished step pods as its watch shows
// them plus the steps placed on it whose pods it does not show yet, read
// from the records (a new placer reads them fresh before it places).
type placer struct {
	*gateway
	sessions *sessions // a sandbox deleted closes its session
	kick     chan struct{}

	// The leader's, made anew for each leadership.
	leadCtx   context.Context
	pool      *selection.Pool
	poolKey   uint64
	cands     map[string]selection.Candidate // as in the pool, by name
	sandboxes *sandboxes
	// whys are the round's waiting messages, by kind of step: many
	// waiting steps share a few.
	whys map[string]string

	mu       sync.Mutex
	inflight map[string]Placed // placements being written, by record
	writing  map[string]bool   // waiting events being written, by record
	wg       sync.WaitGroup    // the writes
}

func newPlacer(g *gateway, sessions *sessions) *placer {
	return &placer{gateway: g, sessions: sessions, kick: make(chan struct{}, 1)}
}

func (p *placer) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run places steps whenever this gateway leads, until ctx ends.
func (p *placer) run(ctx context.Context) {
	if p.opts.Leader == nil {
		return
	}
	for {
		changed := p.opts.Leader.Changed()
		if lead, ok := p.opts.Leader.Leading(); ok {
			lctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(lead, cancel)
			p.lead(lctx)
			stop()
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// placerSweep is how often the placer looks at what time alone changes:
// idle sandboxes, records to forget.
const placerSweep = time.Second

// lead places steps until the leadership (ctx) ends.
func (p *placer) lead(ctx context.Context) {
	defer p.wg.Wait()
	p.leadCtx = ctx
	p.pool, p.poolKey, p.inflight, p.writing = nil, 0, map[string]Placed{}, map[string]bool{}
	p.sandboxes = newSandboxes(p)
	for ctx.Err() == nil {
		if err := p.opts.Records.Refresh(ctx); err == nil {
			break
		} else if ctx.Err() == nil {
			p.opts.Logger.Warn("placer: step records not read", "error", err.Error())
			_ = backoff.Sleep(ctx, time.Second)
		}
	}
	sweep := time.NewTicker(placerSweep)
	defer sweep.Stop()
	for {
		records, registry := p.opts.Records.Changed(), p.opts.Registry.Changed()
		p.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-records:
		case <-registry:
		case <-p.kick:
		case <-sweep.C:
			p.forget(ctx)
		}
	}
}

// round places every waiting step that a target has room for, in order,
// and says why each other one waits.
func (p *placer) round(ctx context.Context) {
	recs := p.opts.Records.List()
	p.mu.Lock()
	inflight := make(map[string]Placed, len(p.inflight))
	for k, v := range p.inflight {
		inflight[k] = v
	}
	p.mu.Unlock()
	// Reservations first: a pod the watch shows between the two reads is
	// then counted twice (for one round), never not at all.
	reserved := p.reservations(recs, inflight)
	snap := p.opts.Registry.Snapshot()
	p.refresh(snap, reserved)
	p.sandboxes.tend(ctx, snap, recs, inflight)
	var pending []*Record
	for _, r := range recs {
		if _, ok := inflight[r.Name]; !ok && r.pending() && !r.Status.Release {
			pending = append(pending, r)
		}
	}
	sort.Slice(pending, func(i, j int) bool {
		a, b := pending[i], pending[j]
		if !a.Summary.Submitted.Equal(b.Summary.Submitted) {
			return a.Summary.Submitted.Before(b.Summary.Submitted)
		}
		return a.Name < b.Name
	})
	p.whys = map[string]string{}
	for _, r := range pending {
		p.placeOne(ctx, r)
	}
}

// placeOne places r now, in a sandbox or on the best target with room,
// or says why it waits.
func (p *placer) placeOne(ctx context.Context, r *Record) {
	sum := r.Summary
	if sum.ReuseKey != "" {
		if sb := p.sandboxes.take(sum, p.cands); sb != nil {
			p.place(ctx, r, Placed{Target: sb.target, Pod: sb.pod, Run: runName(sum.Handle)})
			return
		}
	}
	st := stepOf(sum)
	d := p.pool.Place(st, selection.Options{Chain: p.opts.Placement.Chain(sum.Type, false),
		Limits: p.opts.Placement.Limits, Top: 1})
	if len(d.Order) == 0 {
		reason, why := wire.ReasonTargetsAtLimit, "every compatible target is at a limit ("+describe(sum)+"); placed as soon as one has room"
		if !d.Compatible {
			reason, why = wire.ReasonNoTargetFits, noTargetPrefix+describe(sum)
		}
		kind := reason + "\x00" + sum.Type + "\x00" + sum.Team + "\x00" + sum.Platform + "\x00" + strings.Join(sum.Tags, ",") +
			"\x00" + strconv.FormatBool(sum.Privileged)
		msg, ok := p.whys[kind]
		if !ok {
			msg = why + p.refusals(d, sum)
			p.whys[kind] = msg
		}
		p.wait(ctx, r, reason, msg)
		return
	}
	target := d.Order[0]
	placed := Placed{Target: target, Pod: steppod.Name(sum.Team, sum.Handle)}
	if sum.ReuseKey != "" {
		sb := p.sandboxes.make(sum, target)
		placed.Pod, placed.Run = sb.pod, runName(sum.Handle)
	}
	p.place(ctx, r, placed)
	p.count(target, sum.Type)
}

// stepOf is a step as selection reads it.
func stepOf(sum Summary) selection.Step {
	st := selection.Step{Type: sum.Type, Team: sum.Team, Tags: sum.Tags, Platform: sum.Platform, Privileged: sum.Privileged}
	for _, in := range sum.Inputs {
		if in.From.Upload || in.From.Target == "" {
			continue // from outside: no target holds it
		}
		if st.Inputs == nil {
			st.Inputs = map[string]int{}
		}
		st.Inputs[in.From.Target]++
	}
	return st
}

// place writes r's placement; until the write is done it counts as a
// reservation of its target.
func (p *placer) place(ctx context.Context, r *Record, placed Placed) {
	placed.At = p.opts.Now().UTC()
	placed.KillGrace = stepagent.Duration(p.opts.KillGrace)
	p.mu.Lock()
	p.inflight[r.Name] = placed
	p.mu.Unlock()
	p.wg.Go(func() {
		defer p.wake()
		_, err := p.opts.Records.Update(ctx, r.Name, func(cur *Record) error {
			if !cur.pending() || cur.Status.Release {
				return errUnchanged // aborted meanwhile
			}
			cur.Status.Placed, cur.Status.WaitingNow = &placed, ""
			return nil
		})
		p.mu.Lock()
		delete(p.inflight, r.Name)
		p.mu.Unlock()
		switch {
		case err == nil:
			p.opts.Metrics.placed(placed.At.Sub(r.Summary.Submitted))
		case !errors.Is(err, errRecordGone) && ctx.Err() == nil:
			p.opts.Logger.Warn("step placement not recorded", "handle", r.Summary.Handle, "target", placed.Target, "error", err.Error())
		}
	})
}

// wait records why r waits, once per change of reason: a waiting event
// (at most maxWaiting per step) and its view's waiting.
func (p *placer) wait(ctx context.Context, r *Record, reason, why string) {
	if len(why) > maxWaitingMessage {
		why = why[:maxWaitingMessage-3] + "..."
	}
	p.mu.Lock()
	busy := p.writing[r.Name]
	if r.Status.WaitingNow == why || busy {
		p.mu.Unlock()
		return
	}
	p.writing[r.Name] = true
	p.mu.Unlock()
	now := p.opts.Now().UTC()
	p.wg.Go(func() {
		defer func() {
			p.mu.Lock()
			delete(p.writing, r.Name)
			p.mu.Unlock()
		}()
		_, err := p.opts.Records.Update(ctx, r.Name, func(cur *Record) error {
			st := &cur.Status
			if !cur.pending() || st.WaitingNow == why {
				return errUnchanged
			}
			st.WaitingNow = why
			if len(st.Waiting) < maxWaiting {
				st.Waiting = append(st.Waiting, Waiting{At: now, Reason: reason, Message: why})
			}
			return nil
		})
		if err != nil && !errors.Is(err, errRecordGone) && ctx.Err() == nil {
			p.opts.Logger.Warn("step's wait not recorded", "handle", r.Summary.Handle, "error", err.Error())
		}
	})
}

// reservations are, per target, the counts of the steps placed on it
// whose pods its watch does not show yet (a pod per step; a new sandbox
// once, whatever number of checks it takes).
func (p *placer) reservations(recs []*Record, inflight map[string]Placed) map[string]targets.Counts {
	out := map[string]targets.Counts{}
	seen := map[string]bool{}
	add := func(pl Placed, typ string) {
		if seen[pl.Target+"/"+pl.Pod] {
			return
		}
		seen[pl.Target+"/"+pl.Pod] = true
		t, err := p.opts.Registry.Target(pl.Target)
		if err != nil || t.CachedPod(pl.Pod) != nil {
			return
		}
		c := out[pl.Target]
		var cand selection.Candidate
		count(&cand, typ)
		c.ActiveContainers += cand.ActiveContainers
		c.BuildContainers += cand.BuildContainers
		c.ActiveTasks += cand.ActiveTasks
		c.ActiveVolumes += cand.ActiveVolumes
		out[pl.Target] = c
	}
	for _, r := range recs {
		if pl := r.Status.Placed; pl != nil && r.Status.End == nil {
			add(*pl, r.Summary.Type)
		}
	}
	for name, pl := range inflight {
		if r, ok := p.opts.Records.Get(name); ok {
			add(pl, r.Summary.Type)
		}
	}
	return out
}

// count adds one step of typ to a candidate's counts.
func count(c *selection.Candidate, typ string) {
	c.ActiveContainers++
	switch typ {
	case selection.StepTask:
		c.ActiveTasks++
		c.BuildContainers++
	case selection.StepGet, selection.StepPut:
		c.BuildContainers++
	}
	c.ActiveVolumes++
}

// refresh keeps the pool current: made anew when the targets, their
// states or their metadata changed, else only its counts moved.
func (p *placer) refresh(snap []targets.Status, extra map[string]targets.Counts) {
	h := fnv.New64a()
	for _, st := range snap {
		fmt.Fprintf(h, "%s|%s|%s|%s|%s|%d|%t\x00", st.Name, st.State, st.Meta.Team, strings.Join(st.Meta.Tags, ","),
			st.Meta.Platform, st.Meta.MaxActiveTasks, st.Meta.Steps.AllowPrivileged)
	}
	cands := Candidates(snap, extra)
	if key := h.Sum64(); p.pool == nil || key != p.poolKey {
		p.pool, p.poolKey = selection.NewPool(slices.Clone(cands)), key
		p.cands = make(map[string]selection.Candidate, len(cands))
		for _, c := range cands {
			p.cands[c.Name] = c
		}
		return
	}
	for _, c := range cands {
		if old := p.cands[c.Name]; old.ActiveContainers != c.ActiveContainers || old.BuildContainers != c.BuildContainers ||
			old.ActiveTasks != c.ActiveTasks || old.ActiveVolumes != c.ActiveVolumes {
			p.pool.SetLoad(c.Name, c.ActiveContainers, c.BuildContainers, c.ActiveTasks, c.ActiveVolumes)
			p.cands[c.Name] = c
		}
	}
}

// count adds a step placed on target to the pool's counts, so the next
// decision of the round sees it.
func (p *placer) count(target, typ string) {
	c, ok := p.cands[target]
	if !ok {
		return
	}
	count(&c, typ)
	p.cands[target] = c
	p.pool.SetLoad(target, c.ActiveContainers, c.BuildContainers, c.ActiveTasks, c.ActiveVolumes)
}

// forget deletes the records of steps released longer than Retain ago.
func (p *placer) forget(ctx context.Context) {
	cutoff := p.opts.Now().Add(-p.opts.Retain)
	for _, r := range p.opts.Records.List() {
		if rel := r.Status.Released; !rel.IsZero() && rel.Before(cutoff) {
			if err := p.opts.Records.Delete(ctx, r); err != nil && ctx.Err() == nil {
				p.opts.Logger.Warn("step record not forgotten", "record", r.Name, "error", err.Error())
			}
		}
	}
}

const noTargetPrefix = "no target satisfies "

// describe names what the step asks of a target.
func describe(sum Summary) string {
	d := Describe(sum.Team, sum.Tags, sum.Platform)
	if sum.Privileged {
		d += ", privileged"
	}
	return d
}

// Describe names what a step of team, tags and platform asks of a target,
// for messages.
func Describe(team string, tags []string, platform string) string {
	var parts []string
	if team != "" {
		parts = append(parts, "team '"+team+"'")
	}
	if len(tags) > 0 {
		parts = append(parts, "tags '"+strings.Join(tags, ", ")+"'")
	}
	if platform != "" {
		parts = append(parts, "platform '"+platform+"'")
	}
	if len(parts) == 0 {
		return "an untagged step without team or platform"
	}
	return strings.Join(parts, ", ")
}

// refusals names why each target of the mesh the step's team may see
// refuses it, as `gateway place` does, grouped by reason: ": a, b:
// untagged step; c: at limit active-tasks 2/2". Other teams' targets stay
// unnamed; an agent refuses all but tasks.
func (p *placer) refusals(d selection.Decision, sum Summary) string {
	reasons := d.Reasons()
	if reasons == nil {
		reasons = map[string]string{}
	}
	teams := map[string]string{}
	for name, c := range p.cands {
		teams[name] = c.Team
	}
	if p.opts.Elsewhere != nil {
		var others []targets.Status
		for _, st := range p.opts.Elsewhere() {
			if _, mine := p.cands[st.Name]; mine {
				continue
			}
			teams[st.Name] = st.Meta.Team
			if targets.IsAgent(st) && sum.Type != selection.StepTask {
				reasons[st.Name] = "an agent runs tasks only: it has no resource types"
				continue
			}
			others = append(others, st)
		}
		od := selection.Place(stepOf(sum), Candidates(others, nil), selection.Options{
			Chain: p.opts.Placement.Chain(sum.Type, false), Limits: p.opts.Placement.Limits})
		for name, why := range od.Rejected {
			reasons[name] = why
		}
	}
	return groupRefusals(reasons, teams, sum.Team)
}

// groupRefusals writes reasons (by target; teams says each one's team)
// as a step of team may read them.
func groupRefusals(reasons, teams map[string]string, team string) string {
	byReason := map[string][]string{}
	for name, why := range reasons {
		if tt := teams[name]; tt != "" && team != "" && tt != team {
			continue
		}
		byReason[why] = append(byReason[why], name)
	}
	if len(byReason) == 0 {
		if len(teams) == 0 {
			return ": there are no targets"
		}
		return ""
	}
	whys := make([]string, 0, len(byReason))
	for why, names := range byReason {
		slices.Sort(names)
		whys = append(whys, why)
	}
	// In the order of the targets' names, as gateway place lists them.
	slices.SortFunc(whys, func(a, b string) int { return strings.Compare(byReason[a][0], byReason[b][0]) })
	parts := make([]string, 0, len(whys))
	for _, why := range whys {
		names := byReason[why]
		if len(names) > maxNamed {
			names = append(names[:maxNamed:maxNamed], "and "+strconv.Itoa(len(byReason[why])-maxNamed)+" more")
		}
		parts = append(parts, strings.Join(names, ", ")+": "+why)
	}
	return ": " + strings.Join(parts, "; ")
}

// maxNamed bounds the targets a waiting message names per reason.
const maxNamed = 5
