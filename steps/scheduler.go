package steps

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/targets"
)

// place tries every pending step, in submission order, against the
// targets' counts plus the pods it placed that the watch has not shown
// yet: so steps submitted together never overshoot a limit.
func (m *Manager) place() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.pending) == 0 {
		return
	}
	// Reservations first: a pod the watch shows between the two reads is
	// then counted twice (for one round), never not at all.
	extra := m.reservations()
	candidates := Candidates(m.opts.Registry.Snapshot(), extra)
	var still []*step
	for _, s := range m.pending {
		if s.req.ReuseKey != "" {
			if sb := m.takeSandbox(s, candidates); sb != nil && m.placeIn(s, sb) {
				continue
			}
		}
		name, why := m.decide(s, candidates)
		if name == "" {
			s.wait(why)
			still = append(still, s)
			continue
		}
		t, err := m.opts.Registry.Target(name)
		if err != nil { // gone since the snapshot; the next round tries again
			still = append(still, s)
			continue
		}
		pod := PodName(s.key.team, s.key.handle)
		if s.req.ReuseKey != "" {
			s.sandbox, s.makes = m.newSandbox(s, name), true
			pod = s.sandbox.pod
		}
		now := m.opts.Now().UTC()
		s.update(func(v *View) { v.Phase, v.Target, v.Pod, v.PlacedAt, v.Waiting = Starting, name, pod, now, "" })
		m.reserve(name, pod, s.req.Type)
		for i := range candidates {
			if candidates[i].Name == name {
				count(&candidates[i], s.req.Type)
			}
		}
		m.start(s, t, pod, nil)
	}
	m.pending = still
}

// placeIn runs s in the live sandbox sb, which counts s already; false
// (and sb left) when its target went since the snapshot. Called with
// m.mu held.
func (m *Manager) placeIn(s *step, sb *sandbox) bool {
	t, err := m.opts.Registry.Target(sb.target)
	if err != nil {
		sb.busy--
		return false
	}
	now := m.opts.Now().UTC()
	s.update(func(v *View) { v.Phase, v.Target, v.Pod, v.PlacedAt, v.Waiting = Starting, sb.target, sb.pod, now, "" })
	s.sandbox = sb
	m.start(s, t, sb.pod, nil)
	return true
}

// Reasons of a waiting event: why no target takes the step yet.
const (
	// ReasonNoTargetFits: no target could ever run the step as things
	// are (its team, tags or platform); it waits for one to appear.
	ReasonNoTargetFits = "NoTargetFits"
	// ReasonTargetsAtLimit: compatible targets are all at a limit.
	ReasonTargetsAtLimit = "TargetsAtLimit"
)

// decide places one step; "" and why when no target may take it now.
func (m *Manager) decide(s *step, candidates []selection.Candidate) (string, string) {
	st := selection.Step{Type: s.req.Type, Team: s.req.Team, Tags: s.req.Tags, Platform: s.req.Platform}
	for _, in := range s.req.Inputs {
		if in.From.Upload {
			continue // from outside: no target holds it
		}
		if st.Inputs == nil {
			st.Inputs = map[string]int{}
		}
		st.Inputs[in.From.Target]++
	}
	d := selection.Place(st, candidates, selection.Options{Chain: m.opts.Placement.Chain(s.req.Type, false),
		Limits: m.opts.Placement.Limits, Top: 1})
	if len(d.Order) > 0 {
		return d.Order[0], ""
	}
	if !d.Compatible {
		return "", noTargetPrefix + describe(s.req)
	}
	return "", "every compatible target is at a limit (" + describe(s.req) + "); placed as soon as one has room"
}

// describe names what the step asks of a target.
func describe(req Request) string { return Describe(req.Team, req.Tags, req.Platform) }

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

// wait records why a pending step waits, once per change of reason.
func (s *step) wait(why string) {
	s.mu.Lock()
	same := s.view.Waiting == why
	s.view.Waiting = why
	s.mu.Unlock()
	if !same {
		reason := ReasonTargetsAtLimit
		if strings.HasPrefix(why, noTargetPrefix) {
			reason = ReasonNoTargetFits
		}
		s.emit(Event{Type: EventWaiting, Reason: reason, Message: why})
	}
}

const noTargetPrefix = "no target satisfies "

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

// reservations are the counts of placed pods the watch has not shown yet;
// those it shows are dropped. Called with m.mu held.
func (m *Manager) reservations() map[string]targets.Counts {
	out := map[string]targets.Counts{}
	for name, pods := range m.reserved {
		t, err := m.opts.Registry.Target(name)
		if err != nil {
			delete(m.reserved, name)
			continue
		}
		var c selection.Candidate
		for pod, typ := range pods {
			if t.CachedPod(pod) != nil {
				delete(pods, pod)
				continue
			}
			count(&c, typ)
		}
		if len(pods) == 0 {
			delete(m.reserved, name)
		}
		out[name] = targets.Counts{ActiveContainers: c.ActiveContainers, BuildContainers: c.BuildContainers,
			ActiveTasks: c.ActiveTasks, ActiveVolumes: c.ActiveVolumes}
	}
	return out
}

func (m *Manager) reserve(target, pod, typ string) {
	if m.reserved[target] == nil {
		m.reserved[target] = map[string]string{}
	}
	m.reserved[target][pod] = typ
}

// unreserve drops a reservation whose pod will not be made.
func (m *Manager) unreserve(target, pod string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.reserved[target], pod)
}

// start runs a step's runner. Called with m.mu held.
func (m *Manager) start(s *step, t *targets.Target, pod string, adopted *corev1.Pod) {
	ctx := m.ctx
	m.wg.Go(func() { m.run(ctx, s, t, pod, adopted) })
}

// adopt picks up the step pods of each target the first time its watch
// has listed them: a restarted gateway's steps.
// It reports whether the start's recovery is over: every target's pods
// adopted, or recoverTimeout passed.
func (m *Manager) adopt() bool {
	all := m.opts.Registry.Loaded()
	for _, st := range m.opts.Registry.Snapshot() {
		t, err := m.opts.Registry.Target(st.Name)
		if err != nil {
			continue // no clients: it has no pods to adopt
		}
		if ok, _ := t.Synced(); !ok {
			all = false
			continue
		}
		m.mu.Lock()
		if !m.scanned[t] {
			m.scanned[t] = true
			for _, p := range t.Pods() {
				m.adoptPod(t, p)
			}
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.recovered && (all || m.opts.Now().Sub(m.started) > recoverTimeout) {
		m.recovered = true
		close(m.recoveredCh)
		m.opts.Logger.Info("steps recovered", "steps", len(m.steps), "complete", all)
	}
	return m.recovered
}

// adoptPod makes a step of a pod this gateway does not know. Called with
// m.mu held.
func (m *Manager) adoptPod(t *targets.Target, p *corev1.Pod) {
	if p.Labels[SandboxLabel] != "" {
		m.adoptSandbox(t, p)
		return
	}
	handle := p.Labels[HandleLabel]
	if handle == "" || p.DeletionTimestamp != nil {
		return
	}
	k := key{p.Labels[ownership.TeamLabel], handle}
	if _, ok := m.steps[k]; ok {
		return
	}
	s, err := recovered(k, p, t.Name())
	if err != nil {
		m.opts.Logger.Warn("step pod not adopted", "target", t.Name(), "pod", p.Name, "error", err.Error())
		return
	}
	m.steps[k] = s
	m.opts.Logger.Info("step adopted", "target", t.Name(), "pod", p.Name, "team", k.team, "handle", k.handle)
	m.start(s, t, p.Name, p)
}
