package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// PlacementRequest is the body of POST /api/v1/placements: the step to
// place, as Concourse describes it to its worker pool.
type PlacementRequest struct {
	// Type is task, get, put or check; it picks the configured chain.
	Type string `json:"type"`
	// Team is the pipeline's team; empty places on global targets only.
	// A team token must name its own team.
	Team     string   `json:"team,omitempty"`
	Tags     []string `json:"tags,omitempty"`
	Platform string   `json:"platform,omitempty"` // empty matches any platform
	// Inputs name the target each of the step's inputs lives on
	// (volume-locality prefers the target holding the most).
	Inputs []PlacementInput `json:"inputs,omitempty"`
	// Strategy, if set, is a chain that overrides the configured one.
	Strategy string `json:"strategy,omitempty"`
	// Nested marks a check run inside a build (the image check of a get
	// step) rather than by the resource scanner: Concourse places it with
	// the no-input chain. Only for type check.
	Nested bool `json:"nested,omitempty"`
	// Privileged asks for a target whose policy allows privileged steps
	// (steps.allowPrivileged in its target.yaml).
	Privileged bool `json:"privileged,omitempty"`
}

// PlacementInput is one input of the step.
type PlacementInput struct {
	Target string `json:"target"`
}

// Placement is the answer: on 200 the chosen target and every approved
// one best first; on 422 and 503 an error. Rejected holds, in every
// answer, each target the caller may see that fell out, with its reason.
type Placement struct {
	Target string `json:"target,omitempty"`
	// Owner is the gateway that owns Target, when gateways form a mesh:
	// placement weighs every target of the mesh the caller may see.
	Owner    string            `json:"owner,omitempty"`
	Order    []string          `json:"order,omitempty"`
	Error    string            `json:"error,omitempty"`
	Rejected map[string]string `json:"rejected"`
}

// placementRetryAfter is the Retry-After of a step every compatible target
// refuses at a limit: Concourse retries such a step every 5 s.
const placementRetryAfter = 5 * time.Second

// placementBodyLimit bounds a request body; a step's description is small.
const placementBodyLimit = 1 << 20

// badRequest is a 400 body: the error and the request field it names.
type badRequest struct {
	Error string `json:"error"`
	Field string `json:"field"`
}

// fieldError is a problem with one field of a request body.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// place decides where a step would run now, creating nothing.
func (s *Server) place(w http.ResponseWriter, r *http.Request) {
	req, chain, ferr := s.placementRequest(w, r)
	if ferr != nil {
		writeJSON(w, http.StatusBadRequest, badRequest{Error: ferr.Error(), Field: ferr.field})
		return
	}
	id := requestIdentity(r)
	if !id.admin && req.Team != id.team {
		// The same answer for any other team, existing or not.
		writeJSON(w, http.StatusForbidden, errorBody{Error: "a team token places only its own team's steps"})
		return
	}
	// Every target of the mesh the caller sees; a name two gateways
	// announce for different clusters cannot be placed on by name.
	var visible []targets.Status
	owners := map[string]string{}
	refused := map[string]string{}
	for _, l := range s.everything() {
		switch {
		case !id.sees(l.st.Meta.Team):
		case targets.IsAgent(l.st) && req.Type != selection.StepTask:
			refused[l.st.Name] = "an agent runs tasks only: it has no resource types"
		case l.conflicts != nil:
			refused[l.st.Name] = fmt.Sprintf("gateways %s announce it for different clusters", strings.Join(l.conflicts, ", "))
		default:
			visible = append(visible, l.st)
			owners[l.st.Name] = l.owner
		}
	}
	start := time.Now()
	d := decide(step(req), visible, selection.Options{Chain: chain, Limits: s.opts.Placement.Limits,
		WorkerVersion: s.opts.WorkerVersion})
	elapsed := time.Since(start)
	maps.Copy(d.rejected, refused)

	answer := Placement{Rejected: d.rejected}
	status, result := http.StatusOK, resultPlaced
	switch {
	case len(d.order) > 0:
		answer.Target, answer.Order, answer.Owner = d.order[0], d.order, owners[d.order[0]]
	case !d.compatible:
		status, result = http.StatusUnprocessableEntity, resultNoTarget
		answer.Error = "no target satisfies " + describe(req)
	default:
		status, result = http.StatusServiceUnavailable, resultAtLimit
		answer.Error = fmt.Sprintf("every compatible target is at a limit (%s); retry after %s", describe(req), placementRetryAfter)
		w.Header().Set("Retry-After", strconv.Itoa(int(placementRetryAfter.Seconds())))
	}
	s.opts.PlacementMetrics.observe(result, elapsed)
	writeJSON(w, status, answer)
}

// decision is what the API reads of selection's answer.
type decision struct {
	order      []string
	rejected   map[string]string // never nil
	compatible bool
}

// decide is the API's one call into selection, kept alone so that a
// change of selection's API touches only this function.
func decide(step selection.Step, visible []targets.Status, opts selection.Options) decision {
	d := selection.Place(step, steps.Candidates(visible, nil), opts)
	out := decision{order: d.Order, rejected: d.Rejected, compatible: d.Compatible}
	if out.rejected == nil {
		out.rejected = map[string]string{}
	}
	return out
}

// step is the request as selection reads it.
func step(req PlacementRequest) selection.Step {
	st := selection.Step{Type: req.Type, Team: req.Team, Tags: req.Tags, Platform: req.Platform, Privileged: req.Privileged}
	if len(req.Inputs) > 0 {
		st.Inputs = make(map[string]int, len(req.Inputs))
		for _, in := range req.Inputs {
			st.Inputs[in.Target]++
		}
	}
	return st
}

// describe names what the step asks of a target, for error messages.
func describe(req PlacementRequest) string { return steps.Describe(req.Team, req.Tags, req.Platform) }

// placementRequest reads and checks the body, and picks the step's chain:
// the body's strategy if given, else the configured one of its type.
func (s *Server) placementRequest(w http.ResponseWriter, r *http.Request) (PlacementRequest, selection.Chain, *fieldError) {
	var req PlacementRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, placementBodyLimit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, nil, decodeError(err)
	}
	if dec.More() {
		return req, nil, &fieldError{"body", "more than one JSON value"}
	}
	switch req.Type {
	case selection.StepTask, selection.StepGet, selection.StepPut, selection.StepCheck:
	case "":
		return req, nil, &fieldError{"type", "required: task, get, put or check"}
	default:
		return req, nil, &fieldError{"type", fmt.Sprintf("%q is not one of task, get, put, check", req.Type)}
	}
	if req.Nested && req.Type != selection.StepCheck {
		return req, nil, &fieldError{"nested", "only a check step can be nested"}
	}
	if req.Team == "" && !requestIdentity(r).admin {
		return req, nil, &fieldError{"team", "required with a team token"}
	}
	for i, tag := range req.Tags {
		if strings.TrimSpace(tag) == "" {
			return req, nil, &fieldError{fmt.Sprintf("tags[%d]", i), "empty tag"}
		}
	}
	for i, in := range req.Inputs {
		if in.Target == "" {
			return req, nil, &fieldError{fmt.Sprintf("inputs[%d].target", i), "required: the target the input lives on"}
		}
	}
	if req.Strategy == "" {
		return req, s.opts.Placement.Chain(req.Type, req.Nested), nil
	}
	chain, err := selection.ParseChain(req.Strategy)
	if err != nil {
		return req, nil, &fieldError{"strategy", err.Error()}
	}
	return req, chain, nil
}

// decodeError names the field a JSON decoding error is about.
func decodeError(err error) *fieldError {
	var (
		syntax  *json.SyntaxError
		typ     *json.UnmarshalTypeError
		tooLong *http.MaxBytesError
	)
	switch {
	case errors.Is(err, io.EOF):
		return &fieldError{"body", `empty; want {"type", "team", "tags", "platform", "inputs", "strategy"}`}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &fieldError{"body", "malformed JSON: it ends early"}
	case errors.As(err, &syntax):
		return &fieldError{"body", fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err)}
	case errors.As(err, &typ) && typ.Field != "":
		return &fieldError{typ.Field, fmt.Sprintf("JSON %s cannot be a %s", typ.Value, typ.Type)}
	case errors.As(err, &tooLong):
		return &fieldError{"body", fmt.Sprintf("larger than %d bytes", tooLong.Limit)}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return &fieldError{strings.Trim(name, `"`), "unknown field"}
	}
	return &fieldError{"body", err.Error()}
}

// Results of a placement: the label values of jetway_placements_total.
const (
	resultPlaced   = "placed"
	resultNoTarget = "no_target"
	resultAtLimit  = "at_limit"
)

// PlacementMetrics are the placement API's metrics; a nil one records nothing.
type PlacementMetrics struct {
	placements *prometheus.CounterVec
	duration   prometheus.Histogram
}

// NewPlacementMetrics registers the placement metrics on reg.
func NewPlacementMetrics(reg prometheus.Registerer) *PlacementMetrics {
	m := &PlacementMetrics{
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_placements_total",
			Help: "Placement decisions, by result (placed, no_target: none compatible, at_limit: every compatible target at a limit).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jetway_placement_decision_seconds",
			Help: "Time one placement decision took, candidates included, request decoding not.",
			// 10us to about 160ms: the selection benchmark's goal is 250us
			// at 10,000 candidates.
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 8),
		}),
	}
	for _, r := range []string{resultPlaced, resultNoTarget, resultAtLimit} {
		m.placements.WithLabelValues(r)
	}
	reg.MustRegister(m.placements, m.duration)
	return m
}

func (m *PlacementMetrics) observe(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.placements.WithLabelValues(result).Inc()
	m.duration.Observe(d.Seconds())
}
