package concourse

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"code.cloudfoundry.org/garden"
)

// The Garden API of a registered worker, as the web node calls it
// (../shared/CONCOURSE-WORKER.md): containers are made, listed, looked up,
// given properties and destroyed (Containers). Processes are not run yet:
// Attach answers that the process is unknown, so the web node runs it,
// and Run says jetway does not run them yet. Errors are Garden's shape,
// {"Type", "Message", ...}, which the web node's client reads.

// maxContainerSpec bounds a Create's body.
const maxContainerSpec = 1 << 20

// notRunYet is why jetway refuses what it does not serve yet.
const notRunYet = "jetway does not run processes in a Concourse web node's containers yet (docs/concourse.md)"

// gardenAPI serves the Garden API of target's worker: its containers are
// cs's; without cs (no state namespace, so no pod), the list is what
// Holdings hold and every other call is refused, saying why.
func gardenAPI(target string, h Holdings, cs *Containers, m *Metrics) http.Handler {
	g := &gardenServer{target: target, h: h, cs: cs, m: m}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, struct{}{}) })
	mux.HandleFunc("GET /containers", g.list)
	if cs == nil {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			gardenError(w, fmt.Errorf("jetway does not run a Concourse web node's containers without a state namespace (docs/concourse.md): %s %s", r.Method, r.URL.Path))
		})
		return mux
	}
	mux.HandleFunc("POST /containers", g.create)
	mux.HandleFunc("DELETE /containers/{handle}", g.destroy)
	mux.HandleFunc("GET /containers/{handle}/properties", g.properties)
	mux.HandleFunc("GET /containers/{handle}/properties/{key}", g.property)
	mux.HandleFunc("PUT /containers/{handle}/properties/{key}", g.setProperty)
	mux.HandleFunc("DELETE /containers/{handle}/properties/{key}", g.removeProperty)
	mux.HandleFunc("PUT /containers/{handle}/grace_time", g.graceTime)
	mux.HandleFunc("GET /containers/{handle}/processes/{pid}", g.attach)
	mux.HandleFunc("POST /containers/{handle}/processes", g.run)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		gardenError(w, fmt.Errorf("jetway's workers do not serve Garden's %s %s (docs/concourse.md)", r.Method, r.URL.Path))
	})
	return mux
}

// API serves the Garden API of target's worker.
func (c *Containers) API(target string) http.Handler { return gardenAPI(target, nil, c, c.Metrics) }

type gardenServer struct {
	target string
	h      Holdings
	cs     *Containers
	m      *Metrics
}

// list answers the handles of the worker's containers whose properties
// include the query's (a name and a value each).
func (g *gardenServer) list(w http.ResponseWriter, r *http.Request) {
	filter := garden.Properties{}
	for k, vs := range r.URL.Query() {
		if len(vs) > 0 {
			filter[k] = vs[0]
		}
	}
	var handles []string
	var err error
	if g.cs != nil {
		handles, err = g.cs.List(r.Context(), g.target, filter)
	} else if handles, err = g.h.Containers(r.Context(), g.target); len(filter) > 0 {
		handles = nil // no properties are kept without a state namespace
	}
	g.m.gardenCall("list", err)
	if err != nil {
		gardenError(w, garden.NewServiceUnavailableError(err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, struct{ Handles []string }{nonNil(handles)})
}

func (g *gardenServer) create(w http.ResponseWriter, r *http.Request) {
	var spec garden.ContainerSpec
	if !readJSON(w, r, &spec, maxContainerSpec) {
		return
	}
	c, err := g.cs.Create(r.Context(), g.target, spec)
	g.m.gardenCall("create", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{ Handle string }{c.Handle()})
}

func (g *gardenServer) destroy(w http.ResponseWriter, r *http.Request) {
	err := g.cs.Destroy(r.Context(), g.target, r.PathValue("handle"))
	g.m.gardenCall("destroy", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

func (g *gardenServer) properties(w http.ResponseWriter, r *http.Request) {
	c, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	g.m.gardenCall("properties", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c.Properties())
}

func (g *gardenServer) property(w http.ResponseWriter, r *http.Request) {
	c, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	key := r.PathValue("key")
	if err == nil {
		if _, ok := c.properties[key]; !ok {
			err = fmt.Errorf("%w: %s", ErrPropertyNotFound, key)
		}
	}
	g.m.gardenCall("property", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"value": c.properties[key]})
}

func (g *gardenServer) setProperty(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Value string `json:"value"`
	}
	if !readJSON(w, r, &req, maxRecordData) {
		return
	}
	err := g.cs.SetProperty(r.Context(), g.target, r.PathValue("handle"), r.PathValue("key"), req.Value)
	g.m.gardenCall("set-property", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

func (g *gardenServer) removeProperty(w http.ResponseWriter, r *http.Request) {
	err := g.cs.RemoveProperty(r.Context(), g.target, r.PathValue("handle"), r.PathValue("key"))
	g.m.gardenCall("remove-property", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// graceTime is taken and has no effect: jetway never destroys a
// container on its own; the web node destroys what it no longer needs.
func (g *gardenServer) graceTime(w http.ResponseWriter, r *http.Request) {
	_, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	if err != nil {
		gardenError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// attach finds no process: none runs yet. The web node then runs it.
func (g *gardenServer) attach(w http.ResponseWriter, r *http.Request) {
	if _, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle")); err != nil {
		gardenError(w, err)
		return
	}
	gardenError(w, garden.ProcessNotFoundError{ProcessID: r.PathValue("pid")})
}

func (g *gardenServer) run(w http.ResponseWriter, r *http.Request) {
	if _, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle")); err != nil {
		gardenError(w, err)
		return
	}
	g.m.gardenCall("run", errors.New(notRunYet))
	gardenError(w, errors.New(notRunYet))
}

// gardenError answers err as Garden's server does: 404 for an unknown
// container or process, else 500, with its type for the client to rebuild.
func gardenError(w http.ResponseWriter, err error) {
	var notFound garden.ContainerNotFoundError
	if errors.As(err, &notFound) {
		err = notFound
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = garden.NewServiceUnavailableError(err.Error())
	}
	ge := &garden.Error{Err: err}
	writeJSON(w, ge.StatusCode(), ge)
}

// readJSON decodes r's body of at most limit bytes into v, or answers 400
// naming what is wrong.
func readJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		gardenError(w, fmt.Errorf("read the request: %w", err))
	case int64(len(b)) > limit:
		gardenError(w, fmt.Errorf("the request is over %d bytes", limit))
	case json.Unmarshal(b, v) != nil:
		gardenError(w, fmt.Errorf("the request is not the JSON of Garden's %s %s: %w", r.Method, r.URL.Path, json.Unmarshal(b, v)))
	default:
		return true
	}
	return false
}
