package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Calls from agents. An agent (a member of kind agent: a machine without
// Kubernetes) runs the steps placed on it and needs the bytes of their
// inputs from pods on clusters: it asks a gateway for them (PUT
// /api/v1/mesh/stream-out) for the step's caller, and nothing else. The
// mesh tells an agent's calls by their origin (mesh.PeerKind), also on
// streams a gateway relays. An agent is trusted less than a gateway: the
// caller it names is never an admin, and is of the agent's team if its
// target has one; a global agent acts for any team, as a Concourse global
// worker sees every team's data.

// agentsMayOnly is why any other call from an agent is refused.
const agentsMayOnly = "agents may only ask for volumes (PUT " + meshStreamOutPath + ")"

// fromAgents answers 403 to the calls from agents that agentMay refuses,
// and serves every other call with next.
func (s *Server) fromAgents(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mesh.PeerKind(r.Context()) != mesh.KindAgent {
			next.ServeHTTP(w, r)
			return
		}
		if err := s.agentMay(r); err != nil {
			agent, _ := mesh.Peer(r.Context())
			s.opts.Logger.Warn("call from an agent refused", "agent", agent, "method", r.Method, "path", r.URL.Path, "error", err.Error())
			writeJSON(w, http.StatusForbidden, errorBody{Error: err.Error()})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// agentMay is nil when the agent that made r may make it: a stream-out
// for a caller who is no admin and, if the agent is a team's, of its team.
// A missing or invalid caller passes, for authenticate to answer 401.
func (s *Server) agentMay(r *http.Request) error {
	agent, _ := mesh.Peer(r.Context())
	if r.Method != http.MethodPut || r.URL.Path != meshStreamOutPath {
		return errors.New(agentsMayOnly)
	}
	caller, ok := meshIdentity(r)
	switch {
	case !ok:
		return nil
	case caller.admin:
		return fmt.Errorf("agent %s named an admin as its caller; an agent acts only for a team's caller, never an admin", agent)
	}
	team, found := s.agentTeam(agent)
	switch {
	case !found:
		return fmt.Errorf("agent %s announced no target of its own here yet; its calls are refused until it has", agent)
	case team != "" && caller.team != team:
		return fmt.Errorf("agent %s acts only for callers of its own team", agent)
	}
	return nil
}

// agentTeam is the team of agent's own target, as announced on the mesh
// ("" for a global agent); found is false while it announced none.
func (s *Server) agentTeam(agent string) (team string, found bool) {
	if s.opts.Mesh == nil {
		return "", false
	}
	for _, rt := range s.opts.Mesh.Remotes() {
		if rt.Owner == agent && rt.Target.Name == agent {
			return rt.Target.Team, true
		}
	}
	return "", false
}

// sendForAgent is Streams.Send for an agent's stream-out: a source this
// gateway owns it sends; one another member owns it asks that member for
// over the mesh, as the caller, and copies on, so that an agent joined to
// one gateway gets its inputs from every member. Only for agents: a
// gateway asks the source's owner itself, and a stream-out carried on
// between gateways whose routes disagree could go round.
func (s *Server) sendForAgent(ctx context.Context, id identity, from wire.Endpoint, encoding string, begin func() io.Writer) (int64, error) {
	if _, err := s.opts.Targets.Find(from.Target); err == nil {
		return s.opts.Streams.Send(ctx, streams.Caller{Admin: id.admin, Team: id.team}, from, encoding, begin)
	}
	rt, err := findRemote(s.opts.Targets, s.opts.Mesh, id, from.Target)
	switch {
	case errors.Is(err, targets.ErrNotFound):
		return 0, fmt.Errorf("%w: %s", targets.ErrNotFound, from.Target)
	case err != nil:
		return 0, err
	case !rt.Reachable:
		return 0, &streams.Error{Side: streams.SideSource, Gateway: rt.Owner, Err: errors.New(unreachableOwner(rt))}
	}
	src, err := meshOpen(s.opts.Mesh, rt.Owner, callerHeaderOf(id))(ctx, from, encoding)
	switch {
	case errors.Is(err, streams.ErrNotFound) || errors.Is(err, streams.ErrBusy):
		return 0, err
	case err != nil:
		return 0, &streams.Error{Side: streams.SideSource, Gateway: rt.Owner, Err: err}
	}
	defer src.Close()
	return io.Copy(begin(), src)
}
