package api

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Targets is what the API reads of the targets registry.
type Targets interface {
	Snapshot() []targets.Status
	Get(name string) (targets.Status, error)
	// Find is Get that also finds pruned targets, which resume acts on.
	Find(name string) (targets.Status, error)
}

// Target is jetway's detailed view of one target.
type Target struct {
	Name               string     `json:"name"`
	Team               string     `json:"team"`
	Tags               []string   `json:"tags"`
	Platform           string     `json:"platform"`
	Namespace          string     `json:"namespace"`
	Server             string     `json:"server"`
	State              string     `json:"state"`
	Error              string     `json:"error,omitempty"`
	MissingPermissions []string   `json:"missing_permissions"`
	LatencyMS          float64    `json:"latency_ms"`
	ServerVersion      string     `json:"server_version"`
	LastCheck          *time.Time `json:"last_check"`
	StartTime          time.Time  `json:"start_time"`
	// Holding names the unfinished step pods a landing or retiring target
	// waits for.
	Holding []string `json:"holding,omitempty"`
	// The live counts from the target's watch of its step pods.
	ActiveContainers int `json:"active_containers"`
	BuildContainers  int `json:"build_containers"`
	ActiveTasks      int `json:"active_tasks"`
	ActiveVolumes    int `json:"active_volumes"`
	// Owner is the gateway that owns the target, with a mesh.
	Owner string `json:"owner,omitempty"`
	// ConflictingOwners, when set, are the gateways that announce this
	// name for different clusters or namespaces.
	ConflictingOwners []string `json:"conflicting_owners,omitempty"`
	// Concourse is the target's registration with the Concourse web node,
	// when this gateway registers it (docs/concourse.md).
	Concourse *concourse.Registration `json:"concourse,omitempty"`
}

func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, visible(r, s.everything(), func(l listed) wire.Worker { return worker(l.st) }))
}

func (s *Server) listTargets(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, visible(r, s.everything(), func(l listed) Target {
		t := s.target(l.st)
		t.Owner, t.ConflictingOwners = l.owner, l.conflicts
		return t
	}))
}

// visible renders, with view, the targets the request's identity may see.
func visible[T any](r *http.Request, all []listed, view func(listed) T) []T {
	id := requestIdentity(r)
	out := []T{}
	for _, l := range all {
		if id.sees(l.st.Meta.Team) {
			out = append(out, view(l))
		}
	}
	return out
}

func (s *Server) getTarget(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, err := s.opts.Targets.Get(name)
	if errors.Is(err, targets.ErrNotFound) || (err == nil && !requestIdentity(r).sees(st.Meta.Team)) {
		writeJSON(w, http.StatusNotFound, errorBody{Error: "unknown target " + name})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.target(st))
}

// target is a target's view, with its Concourse registration.
func (s *Server) target(st targets.Status) Target {
	t := target(st)
	if s.opts.Concourse != nil {
		if reg, ok := s.opts.Concourse.Registration(st.Name); ok {
			t.Concourse = &reg
		}
	}
	return t
}

// worker is a target as GET /api/v1/workers lists it for fly. It offers
// no resource types here (fly shows them, nothing places by them); the
// types the web node places by are in the registration (concourse).
func worker(st targets.Status) wire.Worker {
	var start int64
	if !st.StartTime.IsZero() {
		start = st.StartTime.Unix()
	}
	return wire.Worker{
		GardenAddr:       workerAddr(st),
		ActiveContainers: st.Counts.ActiveContainers,
		ActiveVolumes:    st.Counts.ActiveVolumes,
		ActiveTasks:      st.Counts.ActiveTasks,
		ResourceTypes:    []wire.ResourceType{},
		Platform:         st.Meta.Platform,
		Tags:             nonNil(st.Meta.Tags),
		Team:             st.Meta.Team,
		Name:             st.Name,
		Version:          wire.WorkerVersion,
		StartTime:        start,
		State:            string(st.State),
	}
}

// workerAddr is a stable address naming the target's API server and
// namespace, k8s://host:port/namespace; fly requires it non-empty.
func workerAddr(st targets.Status) string {
	if targets.IsAgent(st) {
		return st.Server
	}
	host := "invalid"
	if u, err := url.Parse(st.Server); err == nil && u.Host != "" {
		host = u.Host
	}
	ns := st.Meta.Namespace
	if ns == "" {
		ns = "-"
	}
	return "k8s://" + host + "/" + ns
}

func target(st targets.Status) Target {
	t := Target{
		Name:               st.Name,
		Team:               st.Meta.Team,
		Tags:               nonNil(st.Meta.Tags),
		Platform:           st.Meta.Platform,
		Namespace:          st.Meta.Namespace,
		Server:             st.Server,
		State:              string(st.State),
		Error:              st.Error,
		MissingPermissions: nonNil(st.MissingPermissions),
		LatencyMS:          float64(st.Latency.Microseconds()) / 1000,
		ServerVersion:      st.ServerVersion,
		StartTime:          st.StartTime.UTC(),
		Holding:            st.Holding,
		ActiveContainers:   st.Counts.ActiveContainers,
		BuildContainers:    st.Counts.BuildContainers,
		ActiveTasks:        st.Counts.ActiveTasks,
		ActiveVolumes:      st.Counts.ActiveVolumes,
	}
	if !st.LastCheck.IsZero() {
		at := st.LastCheck.UTC()
		t.LastCheck = &at
	}
	return t
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
