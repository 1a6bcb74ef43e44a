package mesh

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// An agent is what its certificate says, not what it announces: the
// operator who issues an agent's certificate (gateway mesh issue --agent)
// writes the one team whose steps it runs, or that it runs every team's,
// and its tags, as URI SANs. A gateway takes an agent's route with the
// team and tags of its certificate whatever the agent announces, and
// counts an announcement that claims otherwise (claimsRefused). A step
// running on an agent can read the agent's key and join as it: with
// the scope in the certificate, it joins as no more than the agent was.
//
// The URIs are outside the role URIs' prefix (urn:jetway:mesh:), which a
// gateway of an earlier version refuses any unknown URI under: such a
// gateway still takes a scoped agent certificate, as its agent's.
const (
	scopePrefix = "urn:jetway:agent:"
	scopeTeam   = scopePrefix + "team:"
	scopeGlobal = scopePrefix + "global"
	scopeTag    = scopePrefix + "tag:"
)

// AgentScope is what an agent's certificate lets it be: the team whose
// steps it runs (Global: every team's) and its tags. An agent runs no
// privileged step: a process on a machine without Kubernetes has no
// privilege to give.
type AgentScope struct {
	Team   string
	Global bool
	Tags   []string
}

// errNoScope is an agent certificate that names neither a team nor
// global: one issued before agents' scopes were bound to certificates.
var errNoScope = errors.New("no team")

// URIs are the scope's URI SANs.
func (s AgentScope) URIs() ([]*url.URL, error) {
	raw := []string{scopeGlobal}
	if !s.Global {
		raw = []string{scopeTeam + url.PathEscape(s.Team)}
	}
	for _, t := range s.Tags {
		raw = append(raw, scopeTag+url.PathEscape(t))
	}
	out := make([]*url.URL, 0, len(raw))
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("mesh: scope URI %q: %w", r, err)
		}
		out = append(out, u)
	}
	return out, nil
}

// String is the scope as messages and logs say it.
func (s AgentScope) String() string {
	who := "team " + s.Team
	if s.Global {
		who = "every team (global)"
	}
	if len(s.Tags) == 0 {
		return who + ", no tags"
	}
	return who + ", tags " + strings.Join(s.Tags, ",")
}

// certScope is the scope an agent's certificate gives: exactly one team
// URI or the global URI, and any tag URIs (sorted, without repeats).
func certScope(c *x509.Certificate) (AgentScope, error) {
	var s AgentScope
	var scopes []string
	for _, u := range c.URIs {
		raw := u.String()
		if !strings.HasPrefix(raw, scopePrefix) {
			continue
		}
		switch {
		case raw == scopeGlobal:
			s.Global = true
			scopes = append(scopes, "global")
		case strings.HasPrefix(raw, scopeTeam):
			team, err := url.PathUnescape(strings.TrimPrefix(raw, scopeTeam))
			if err != nil || team == "" {
				return AgentScope{}, fmt.Errorf("certificate of %q has a team URI %q that names no team", certName(c), raw)
			}
			s.Team = team
			scopes = append(scopes, "team "+team)
		case strings.HasPrefix(raw, scopeTag):
			tag, err := url.PathUnescape(strings.TrimPrefix(raw, scopeTag))
			if err != nil || tag == "" {
				return AgentScope{}, fmt.Errorf("certificate of %q has a tag URI %q that names no tag", certName(c), raw)
			}
			s.Tags = append(s.Tags, tag)
		default:
			return AgentScope{}, fmt.Errorf("certificate of %q has URI %q, which this version does not know (%steam:T, %s or %stag:T)",
				certName(c), raw, scopePrefix, scopeGlobal, scopePrefix)
		}
	}
	switch {
	case len(scopes) == 0:
		return AgentScope{}, fmt.Errorf("agent certificate of %q has %w: issue it again with gateway mesh issue --agent --team TEAM (or --global for an agent of every team), "+
			"so that the agent is what its certificate says, not what it announces", certName(c), errNoScope)
	case len(scopes) > 1:
		return AgentScope{}, fmt.Errorf("agent certificate of %q names more than one scope (%s); it names one team, or global",
			certName(c), strings.Join(scopes, ", "))
	}
	slices.Sort(s.Tags)
	s.Tags = slices.Compact(s.Tags)
	return s, nil
}

// Claims an agent's announcement may make only as its certificate says
// (jetway_mesh_agent_claims_refused_total's claim label).
const (
	claimTeam       = "team"
	claimTags       = "tags"
	claimPrivileged = "privileged"
)

// bind makes an agent's own route say what its certificate does: its
// team and tags, and no privilege. It returns the route and the claims
// the announcement made beyond that, which are ignored.
func (s AgentScope) bind(t Target) (Target, []string) {
	var refused []string
	team := s.Team
	if s.Global {
		team = ""
	}
	if t.Team != team {
		refused = append(refused, claimTeam)
	}
	tags := slices.Clone(t.Tags)
	slices.Sort(tags)
	if !slices.Equal(slices.Compact(tags), s.Tags) {
		refused = append(refused, claimTags)
	}
	if t.AllowPrivileged {
		refused = append(refused, claimPrivileged)
	}
	t.Team, t.Tags, t.AllowPrivileged = team, slices.Clone(s.Tags), false
	return t, refused
}

func (s AgentScope) equal(o AgentScope) bool {
	return s.Team == o.Team && s.Global == o.Global && slices.Equal(s.Tags, o.Tags)
}
