package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/targets"
)

// Lifecycle is what the API asks of the lifecycle controller.
type Lifecycle interface {
	Land(ctx context.Context, name string) error
	Retire(ctx context.Context, name string) error
	// Prune returns how far the prune reaches (lifecycle.PrunedEverywhere
	// or lifecycle.PrunedHere).
	Prune(ctx context.Context, name string) (string, error)
	Resume(ctx context.Context, name string) error
	Sync(ctx context.Context, name string, handles []string) ([]string, error)
}

// PruneScopeHeader tells how far a prune reached: "installation" (recorded
// in the target cluster: every replica, across restarts, until the
// kubeconfig changes or the target is resumed) or "replica" (the cluster
// did not answer: this replica only, until the target answers again).
// fly ignores it; `gateway prune` prints it.
const PruneScopeHeader = "Jetway-Prune-Scope"

// pruneRunningBody is Concourse's answer to pruning a running worker.
type pruneRunningBody struct {
	Stderr string `json:"stderr"`
}

// owned resolves the request's target with find and checks the caller may
// act on it: 404 for an unknown target, 403 for a global or another team's
// target under a team token. It reports whether to go on.
func (s *Server) owned(w http.ResponseWriter, r *http.Request, find func(string) (targets.Status, error)) (string, bool) {
	name := r.PathValue("name")
	st, err := find(name)
	if err != nil {
		writeError(w, err)
		return "", false
	}
	if !requestIdentity(r).owns(st.Meta.Team) {
		writeJSON(w, http.StatusForbidden, errorBody{Error: "this token may not act on worker " + name})
		return "", false
	}
	return name, true
}

// workerAction runs act on the request's target, found with find.
func (s *Server) workerAction(find func(string) (targets.Status, error), act func(ctx context.Context, name string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, ok := s.owned(w, r, find)
		if !ok {
			return
		}
		if err := act(r.Context(), name); err != nil {
			s.opts.Logger.Warn("worker action failed", "target", name, "path", r.URL.Path, "error", err.Error())
			writeError(w, err)
			return
		}
		s.opts.Logger.Info("worker action", "target", name, "path", r.URL.Path, "by", requestIdentity(r).name)
		w.WriteHeader(http.StatusOK)
	}
}

// prune answers 200 with an empty body, as Concourse does, and says in
// PruneScopeHeader how far the prune reached.
func (s *Server) prune(w http.ResponseWriter, r *http.Request) {
	s.workerAction(s.opts.Targets.Get, func(ctx context.Context, name string) error {
		scope, err := s.opts.Lifecycle.Prune(ctx, name)
		if err == nil {
			w.Header().Set(PruneScopeHeader, scope)
		}
		return err
	})(w, r)
}

type syncRequest struct {
	Handles []string `json:"handles"`
}

type syncResponse struct {
	Deleted []string `json:"deleted"`
}

// syncTarget is Concourse's handle sync: the CI names the step pods it
// still wants; jetway deletes its other pods on the target.
func (s *Server) syncTarget(w http.ResponseWriter, r *http.Request) {
	name, ok := s.owned(w, r, s.opts.Targets.Get)
	if !ok {
		return
	}
	var req syncRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Handles == nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: `body must be {"handles": ["<step pod>", ...]}`})
		return
	}
	deleted, err := s.opts.Lifecycle.Sync(r.Context(), name, req.Handles)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, syncResponse{Deleted: deleted})
}

// writeError maps the sentinel errors to Concourse's status codes.
func writeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, targets.ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: "unknown worker"})
	case errors.Is(err, targets.ErrRunning):
		writeJSON(w, http.StatusBadRequest, pruneRunningBody{Stderr: "cannot prune running worker"})
	case errors.Is(err, lifecycle.ErrBusy), errors.Is(err, lifecycle.ErrNotOurs):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error()})
	case errors.Is(err, lifecycle.ErrUnreachable), errors.Is(err, lifecycle.ErrDenied), errors.Is(err, targets.ErrInvalidEntry):
		writeJSON(w, http.StatusBadGateway, errorBody{Error: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
	}
}
