package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/targets"
)

// Local is what a member owns and announces: its targets registry.
type Local interface {
	Snapshot() []targets.Status
	Changed() <-chan struct{}
}

// Route is one target as announced on the mesh: its owner and its state.
// A gateway announces the targets it owns and relays those its peers
// announced to it as their own (one hop: enough for a star and a full
// mesh), never back to the peer it learned them from.
type Route struct {
	Owner  string `json:"owner"`
	Target Target `json:"target"`
	// Unreachable, on a relayed route, says the relaying gateway has lost
	// its session with the owner: calls would not get through it.
	Unreachable bool `json:"unreachable,omitempty"`
}

// Target is a target's announced state (docs/mesh.md).
type Target struct {
	Name               string    `json:"name"`
	Server             string    `json:"server"`
	Namespace          string    `json:"namespace"`
	Team               string    `json:"team,omitempty"`
	Tags               []string  `json:"tags,omitempty"`
	Platform           string    `json:"platform"`
	State              string    `json:"state"`
	Error              string    `json:"error,omitempty"`
	MissingPermissions []string  `json:"missing_permissions,omitempty"`
	LatencyMS          float64   `json:"latency_ms"`
	ServerVersion      string    `json:"server_version,omitempty"`
	LastCheck          time.Time `json:"last_check"`
	StartTime          time.Time `json:"start_time"`
	Holding            []string  `json:"holding,omitempty"`
	ActiveContainers   int       `json:"active_containers"`
	BuildContainers    int       `json:"build_containers"`
	ActiveTasks        int       `json:"active_tasks"`
	ActiveVolumes      int       `json:"active_volumes"`
	// AllowPrivileged: the target's target.yaml lets privileged steps run
	// (steps.allowPrivileged). A peer that does not send it (an older
	// version) is taken to refuse them.
	AllowPrivileged bool `json:"allow_privileged,omitempty"`
}

// StateStalled is a remote target's state once its owner has been
// unreachable for longer than Options.StallAfter.
const StateStalled = string(targets.StateStalled)

func announced(st targets.Status) Target {
	return Target{
		Name: st.Name, Server: st.Server, Namespace: st.Meta.Namespace, Team: st.Meta.Team, Tags: st.Meta.Tags,
		Platform: st.Meta.Platform, State: string(st.State), Error: st.Error, MissingPermissions: st.MissingPermissions,
		LatencyMS: float64(st.Latency.Microseconds()) / 1000, ServerVersion: st.ServerVersion,
		LastCheck: st.LastCheck, StartTime: st.StartTime, Holding: st.Holding,
		ActiveContainers: st.Counts.ActiveContainers, BuildContainers: st.Counts.BuildContainers,
		ActiveTasks: st.Counts.ActiveTasks, ActiveVolumes: st.Counts.ActiveVolumes,
		AllowPrivileged: st.Meta.Steps.AllowPrivileged,
	}
}

// Status is the target as the targets package reports its own.
func (t Target) Status() targets.Status {
	return targets.Status{
		Name: t.Name, Server: t.Server, State: targets.State(t.State), StartTime: t.StartTime, Error: t.Error,
		Meta: targets.Metadata{Team: t.Team, Tags: t.Tags, Platform: t.Platform, Namespace: t.Namespace,
			Steps: targets.StepPolicy{AllowPrivileged: t.AllowPrivileged}},
		MissingPermissions: t.MissingPermissions, Latency: time.Duration(t.LatencyMS * float64(time.Millisecond)),
		ServerVersion: t.ServerVersion, LastCheck: t.LastCheck, Holding: t.Holding,
		Counts: targets.Counts{ActiveContainers: t.ActiveContainers, BuildContainers: t.BuildContainers,
			ActiveTasks: t.ActiveTasks, ActiveVolumes: t.ActiveVolumes},
	}
}

// Remote is a target another member owns, as this one knows it.
type Remote struct {
	Owner string
	// Via is the peer it was learned from: Owner, or the gateway that
	// relays it.
	Via string
	// Reachable: a live session carries calls to the owner.
	Reachable bool
	Target    Target
}

// Remotes lists the targets other members own. A target whose owner has
// been unreachable for longer than StallAfter is listed stalled, with the
// state it last had in Error.
func (m *Mesh) Remotes() []Remote {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.Now()
	best := map[[2]string]Remote{}
	for via, routes := range m.learned {
		live := m.sessions[via] != nil
		for _, r := range routes {
			t := r.Target
			if lost, ok := m.lost[via]; ok && !live && now.Sub(lost) > m.opts.StallAfter {
				t.Error = "mesh: its owner " + r.Owner + " is unreachable since " + lost.UTC().Format(time.RFC3339)
				t.State = StateStalled
			}
			rt := Remote{Owner: r.Owner, Via: via, Reachable: live && !r.Unreachable, Target: t}
			key := [2]string{r.Owner, t.Name}
			if old, ok := best[key]; !ok || better(rt, old) {
				best[key] = rt
			}
		}
	}
	out := make([]Remote, 0, len(best))
	for _, r := range best {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Remote) int {
		if c := cmpString(a.Target.Name, b.Target.Name); c != 0 {
			return c
		}
		return cmpString(a.Owner, b.Owner)
	})
	return out
}

// better prefers a reachable route, then one learned from its owner.
func better(a, b Remote) bool {
	if a.Reachable != b.Reachable {
		return a.Reachable
	}
	return a.Via == a.Owner && b.Via != b.Owner
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ErrNotLearned: Forget found no route to the target from its owner.
var ErrNotLearned = errors.New("mesh: no member announced that target")

// AnnouncedError: Forget refused, a live session still announces the
// target; Via, the peer that announces it, is the one to ask.
type AnnouncedError struct {
	Owner, Target, Via string
}

func (e *AnnouncedError) Error() string {
	return fmt.Sprintf("mesh: %s announces target %s of %s over a live session", e.Via, e.Target, e.Owner)
}

// Forget drops target, owned by owner, from what this member learned of
// the peers it has lost: how a stalled worker is pruned. Peers it
// announced the target to forget it at the next announcement. It refuses
// while a live session announces the target (AnnouncedError): that peer
// would announce it again. Should the owner join again, it announces the
// target again, as a pruned Concourse worker registers again.
func (m *Mesh) Forget(owner, target string) error {
	m.mu.Lock()
	match := func(r Route) bool { return r.Owner == owner && r.Target.Name == target }
	found := false
	for via, routes := range m.learned {
		if slices.ContainsFunc(routes, match) {
			if m.sessions[via] != nil {
				m.mu.Unlock()
				return &AnnouncedError{Owner: owner, Target: target, Via: via}
			}
			found = true
		}
	}
	if !found {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s of %s", ErrNotLearned, target, owner)
	}
	for via, routes := range m.learned {
		kept := slices.DeleteFunc(slices.Clone(routes), match)
		switch {
		case len(kept) == len(routes):
		case len(kept) == 0:
			delete(m.learned, via)
			delete(m.lost, via)
		default:
			m.learned[via] = kept
		}
	}
	m.notify()
	m.mu.Unlock()
	m.opts.Logger.Info("mesh: forgot a lost member's target", "owner", owner, "target", target)
	m.opts.Metrics.sessionsChanged(m)
	return nil
}

// Refusal reasons of announced routes.
const (
	refusedOurs    = "claims-this-member"
	refusedAgent   = "agent-not-itself"
	refusedInvalid = "invalid"
)

// learn takes the peer's announcement, refusing the routes it may not
// make: a target this member owns, an agent announcing anything but
// itself, a route without owner or name. An agent's own route says the
// team and tags of its certificate, whatever it claims (claimed).
func (m *Mesh) learn(s *session, routes []Route) {
	kept := make([]Route, 0, len(routes))
	refused := map[string]int{}
	var claims []string
	for _, r := range routes {
		switch {
		case r.Owner == "" || r.Target.Name == "":
			refused[refusedInvalid]++
		case r.Owner == m.name:
			refused[refusedOurs]++
		case s.kind == KindAgent && (r.Owner != s.peer || r.Target.Name != s.peer):
			refused[refusedAgent]++
		case s.kind == KindAgent:
			r.Target, claims = s.scope.bind(r.Target)
			kept = append(kept, r)
		default:
			kept = append(kept, r)
		}
	}
	m.claimed(s, claims)
	for reason, n := range refused {
		m.opts.Logger.Warn("mesh peer announced routes it may not; refused", "peer", s.peer, "reason", reason, "routes", n)
		m.opts.Metrics.routesRefused(reason, n)
	}
	m.mu.Lock()
	if m.sessions[s.peer] == s {
		m.learned[s.peer] = kept
		m.notify()
	}
	m.mu.Unlock()
}

// claimed logs and counts the claims an agent's announcement made beyond
// its certificate, once per change of them: a forged or misconfigured
// agent announces them again at each change of its counts.
func (m *Mesh) claimed(s *session, claims []string) {
	key := strings.Join(claims, ",")
	if key == s.claimed {
		return
	}
	s.claimed = key
	if len(claims) == 0 {
		return
	}
	m.opts.Logger.Warn("mesh agent announced more than its certificate gives; it is taken for what its certificate says",
		"peer", s.peer, "claims", key, "certificate", s.scope.String())
	for _, c := range claims {
		m.opts.Metrics.claimRefused(c)
	}
}

// offer is what this member announces to peer: the targets it owns, and,
// a gateway, those its other peers own and announced to it. An agent is
// offered nothing: it needs no route (it asks its gateway for its inputs'
// bytes), and what the installation holds, other teams' targets among it,
// is no business of a machine under a desk.
func (m *Mesh) offer(peer *session) []Route {
	if peer.kind == KindAgent {
		return nil
	}
	var routes []Route
	if m.opts.Local != nil {
		for _, st := range m.opts.Local.Snapshot() {
			routes = append(routes, Route{Owner: m.name, Target: announced(st)})
		}
	}
	if m.opts.Kind != KindGateway {
		return routes
	}
	for _, r := range m.Remotes() {
		if r.Via == r.Owner && r.Owner != peer.peer {
			routes = append(routes, Route{Owner: r.Owner, Target: r.Target, Unreachable: !r.Reachable})
		}
	}
	return routes
}

// announceEvery bounds how often routes are announced: changes within it
// go out together.
const announceEvery = time.Second

// announceLoop sends each peer what it is offered whenever that changed:
// on a change of the local targets or of what peers announced, and as a
// lost peer's targets go stalled.
func (m *Mesh) announceLoop(ctx context.Context) {
	tick := time.NewTicker(announceEvery)
	defer tick.Stop()
	var local <-chan struct{}
	for {
		if m.opts.Local != nil {
			local = m.opts.Local.Changed()
		}
		changed := m.Changed()
		m.mu.Lock()
		live := make([]*session, 0, len(m.sessions))
		for _, s := range m.sessions {
			live = append(live, s)
		}
		m.mu.Unlock()
		for _, s := range live {
			routes := m.offer(s)
			if key := routesKey(routes); key != s.sent {
				s.sent = key
				s.announce(routes)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-local:
		case <-changed:
		case <-tick.C:
		}
		if backoff.Sleep(ctx, announceEvery/5) != nil { // let a burst of changes settle
			return
		}
	}
}

// routesKey tells whether an announcement changed, ignoring what changes
// at every health check (latency, last check).
func routesKey(routes []Route) string {
	stable := make([]Route, len(routes))
	for i, r := range routes {
		r.Target.LatencyMS, r.Target.LastCheck = 0, time.Time{}
		stable[i] = r
	}
	b, _ := json.Marshal(stable)
	return string(b)
}
