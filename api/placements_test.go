package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

const (
	adminToken = "admin-token-0123456789"
	mainToken  = "main-token-0123456789"
)

// placementFleet has, for a task of team main tagged gpu on linux, two
// approved targets (tb1 holds more build containers; tb2 its own task
// limit) and one of each reason to fall out.
var placementFleet = fakeTargets{
	{Name: "tb1", State: targets.StateRunning,
		Meta:   targets.Metadata{Team: "main", Tags: []string{"gpu"}, Platform: "linux"},
		Counts: targets.Counts{ActiveContainers: 4, BuildContainers: 3, ActiveTasks: 1}},
	{Name: "tb2", State: targets.StateRunning,
		Meta:   targets.Metadata{Team: "main", Tags: []string{"gpu", "big"}, Platform: "linux", MaxActiveTasks: 2},
		Counts: targets.Counts{ActiveContainers: 2, BuildContainers: 2, ActiveTasks: 2}},
	{Name: "tb3", State: targets.StateRunning, Meta: targets.Metadata{Team: "main", Platform: "linux"}},
	{Name: "tb4", State: targets.StateLanded, Meta: targets.Metadata{Team: "main", Tags: []string{"gpu"}, Platform: "linux"}},
	{Name: "g1", State: targets.StateRunning, Meta: targets.Metadata{Tags: []string{"gpu"}, Platform: "linux"}},
	{Name: "w1", State: targets.StateRunning, Meta: targets.Metadata{Tags: []string{"gpu"}, Platform: "windows"}},
	{Name: "o1", State: targets.StateRunning, Meta: targets.Metadata{Team: "other", Tags: []string{"gpu"}, Platform: "linux"}},
}

// seenByMain is what falls out for team main's gpu step on linux, as a
// main token sees it: never o1, another team's target.
var seenByMain = map[string]string{
	"tb3": "missing tags gpu",
	"tb4": "state landed",
	"g1":  selection.ReasonGlobalNotPreferred,
	"w1":  "platform windows",
}

func withOther(m map[string]string) map[string]string {
	out := map[string]string{"o1": "team other"}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func placementServer(opts Options) http.Handler {
	if opts.Targets == nil {
		opts.Targets = placementFleet
	}
	opts.Gatherer = prometheus.NewRegistry()
	opts.Tokens = tokens
	return New(opts).Handler()
}

func postPlacement(t *testing.T, h http.Handler, token, body string) *httptest.ResponseRecorder {
	t.Helper()
	return serve(h, http.MethodPost, "/api/v1/placements", token, body)
}

func TestPlacementAnswers(t *testing.T) {
	const gpuTask = `{"type": "task", "team": "main", "tags": ["gpu"], "platform": "linux", "inputs": [{"target": "tb1"}]`
	tests := []struct {
		name       string
		opts       Options
		token      string
		body       string
		status     int
		want       Placement
		retryAfter string
	}{
		{name: "volume-locality prefers the input's target", token: adminToken, body: gpuTask + `}`,
			status: http.StatusOK, want: Placement{Target: "tb1", Order: []string{"tb1", "tb2"}, Rejected: withOther(seenByMain)}},
		{name: "a team token sees only global and its team's targets", token: mainToken, body: gpuTask + `}`,
			status: http.StatusOK, want: Placement{Target: "tb1", Order: []string{"tb1", "tb2"}, Rejected: seenByMain}},
		{name: "the body's strategy overrides the configured chain", token: mainToken,
			body:   gpuTask + `, "strategy": "fewest-build-containers"}`,
			status: http.StatusOK, want: Placement{Target: "tb2", Order: []string{"tb2", "tb1"}, Rejected: seenByMain}},
		{name: "tasks use placement-strategy",
			opts:  Options{Placement: steps.PlacementOptions{Strategy: selection.Chain{selection.FewestBuildContainers}}},
			token: mainToken, body: gpuTask + `}`,
			status: http.StatusOK, want: Placement{Target: "tb2", Order: []string{"tb2", "tb1"}, Rejected: seenByMain}},
		{name: "get uses no-input-placement-strategy",
			opts: Options{Placement: steps.PlacementOptions{Strategy: selection.Chain{selection.VolumeLocality},
				NoInputStrategy: selection.Chain{selection.FewestBuildContainers}}},
			token: mainToken, body: strings.Replace(gpuTask, "task", "get", 1) + `}`,
			status: http.StatusOK, want: Placement{Target: "tb2", Order: []string{"tb2", "tb1"}, Rejected: seenByMain}},
		{name: "no compatible target: 422 with every visible target's reason", token: mainToken,
			body:   `{"type": "task", "team": "main", "tags": ["tpu"], "platform": "linux"}`,
			status: http.StatusUnprocessableEntity,
			want: Placement{Error: "no target satisfies team 'main', tags 'tpu', platform 'linux'", Rejected: map[string]string{
				"tb1": "missing tags tpu", "tb2": "missing tags tpu", "tb3": "missing tags tpu", "tb4": "state landed",
				"g1": "missing tags tpu", "w1": "platform windows"}}},
		{name: "every compatible target at a limit: 503 and Retry-After",
			opts:  Options{Placement: steps.PlacementOptions{Strategy: selection.Chain{selection.LimitActiveTasks}, Limits: selection.Limits{ActiveTasks: 1}}},
			token: mainToken, body: gpuTask + `}`, status: http.StatusServiceUnavailable, retryAfter: "5",
			want: Placement{Error: "every compatible target is at a limit (team 'main', tags 'gpu', platform 'linux'); retry after 5s",
				Rejected: map[string]string{"tb1": "at limit active-tasks 1/1", "tb2": "at limit active-tasks 2/2",
					"tb3": "missing tags gpu", "tb4": "state landed", "g1": selection.ReasonGlobalNotPreferred, "w1": "platform windows"}}},
		{name: "limit-active-tasks refuses task steps only",
			opts:  Options{Placement: steps.PlacementOptions{Strategy: selection.Chain{selection.LimitActiveTasks}, Limits: selection.Limits{ActiveTasks: 1}}},
			token: mainToken, body: strings.Replace(gpuTask, "task", "put", 1) + `, "strategy": "limit-active-tasks,fewest-build-containers"}`,
			status: http.StatusOK, want: Placement{Target: "tb2", Order: []string{"tb2", "tb1"}, Rejected: seenByMain}},
		{name: "a step without team places on global targets only (--no-auth is admin)", opts: Options{NoAuth: true},
			body:   `{"type": "check", "tags": ["gpu"], "platform": "linux"}`,
			status: http.StatusOK, want: Placement{Target: "g1", Order: []string{"g1"}, Rejected: map[string]string{
				"tb1": "team main", "tb2": "team main", "tb3": "team main", "tb4": "state landed", "w1": "platform windows", "o1": "team other"}}},
		{name: "no targets at all: 422 with nothing rejected", opts: Options{Targets: fakeTargets{}}, token: adminToken,
			body:   `{"type": "get"}`,
			status: http.StatusUnprocessableEntity,
			want:   Placement{Error: "no target satisfies an untagged step without team or platform", Rejected: map[string]string{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := postPlacement(t, placementServer(tt.opts), tt.token, tt.body)
			require.Equal(t, tt.status, rec.Code, rec.Body.String())
			var got Placement
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.retryAfter, rec.Header().Get("Retry-After"))
		})
	}
}

// The JSON keys are the API's contract.
func TestPlacementJSONShapes(t *testing.T) {
	h := placementServer(Options{})
	rec := postPlacement(t, h, mainToken, `{"type": "task", "team": "main", "tags": ["big"], "platform": "linux"}`)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"target": "tb2", "order": ["tb2"], "rejected": {"tb1": "missing tags big", "tb3": "missing tags big",
		"tb4": "state landed", "g1": "missing tags big", "w1": "platform windows"}}`, rec.Body.String())

	rec = postPlacement(t, h, mainToken, `{"type": "task", "team": "main", "tags": ["tpu"], "platform": "arm"}`)
	require.Equal(t, http.StatusUnprocessableEntity, rec.Code)
	var got map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	assert.ElementsMatch(t, []string{"error", "rejected"}, keysOf(got))
}

func keysOf(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestPlacementTeamScoping(t *testing.T) {
	h := placementServer(Options{})
	for _, team := range []string{"other", "no-such-team"} {
		rec := postPlacement(t, h, mainToken, `{"type": "task", "team": "`+team+`"}`)
		assert.Equal(t, http.StatusForbidden, rec.Code, team)
		assert.JSONEq(t, `{"error": "a team token places only its own team's steps"}`, rec.Body.String(),
			"the same answer whether the team exists or not")
	}
	rec := postPlacement(t, h, adminToken, `{"type": "task", "team": "other", "tags": ["gpu"]}`)
	require.Equal(t, http.StatusOK, rec.Code, "an admin places for any team")
	assert.Contains(t, rec.Body.String(), `"target":"o1"`)

	// However the step is refused, a main token never hears of o1.
	for _, body := range []string{
		`{"type": "task", "team": "main", "tags": ["gpu"]}`,
		`{"type": "task", "team": "main", "tags": ["tpu"]}`,
		`{"type": "task", "team": "main", "strategy": "limit-active-containers"}`,
	} {
		rec := postPlacement(t, h, mainToken, body)
		assert.NotContains(t, rec.Body.String(), "o1", body)
		assert.NotContains(t, rec.Body.String(), "other", body)
	}
	assert.Equal(t, http.StatusUnauthorized, postPlacement(t, h, "", `{"type": "task"}`).Code)
	assert.Equal(t, http.StatusUnauthorized, postPlacement(t, h, "wrong-token-0123456789", `{"type": "task"}`).Code)
}

func TestPlacementBadBodies(t *testing.T) {
	h := placementServer(Options{})
	tests := []struct {
		name, token, body, field, msg string
	}{
		{"malformed JSON", adminToken, `{"type": "task",`, "body", "malformed JSON"},
		{"empty body", adminToken, ``, "body", "empty"},
		{"two values", adminToken, `{"type": "task"} {}`, "body", "more than one JSON value"},
		{"unknown field", adminToken, `{"type": "task", "tag": ["gpu"]}`, "tag", "unknown field"},
		{"wrong JSON type", adminToken, `{"type": "task", "tags": "gpu"}`, "tags", "JSON string cannot be a []string"},
		{"missing type", adminToken, `{"team": "main"}`, "type", "required"},
		{"nested task", adminToken, `{"type": "task", "nested": true}`, "nested", "only a check step"},
		{"unknown type", adminToken, `{"type": "deploy"}`, "type", `"deploy" is not one of task, get, put, check`},
		{"team token without team", mainToken, `{"type": "task"}`, "team", "required with a team token"},
		{"empty tag", adminToken, `{"type": "task", "tags": ["gpu", " "]}`, "tags[1]", "empty tag"},
		{"input without target", adminToken, `{"type": "task", "inputs": [{"target": "tb1"}, {}]}`, "inputs[1].target", "required"},
		{"unknown strategy", adminToken, `{"type": "task", "strategy": "fastest"}`, "strategy", `unknown strategy "fastest"`},
		{"random not alone", adminToken, `{"type": "task", "strategy": "random,volume-locality"}`, "strategy", "random must be the only strategy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := postPlacement(t, h, tt.token, tt.body)
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			var got badRequest
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
			assert.Equal(t, tt.field, got.Field)
			assert.True(t, strings.HasPrefix(got.Error, tt.field+": "), got.Error)
			assert.Contains(t, got.Error, tt.msg)
		})
	}
}

func TestPlacementMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewPlacementMetrics(reg)
	h := New(Options{Gatherer: reg, Targets: placementFleet, Tokens: tokens, PlacementMetrics: m,
		Placement: steps.PlacementOptions{Limits: selection.Limits{ActiveTasks: 1}}}).Handler()
	postPlacement(t, h, mainToken, `{"type": "task", "team": "main", "tags": ["gpu"]}`)
	postPlacement(t, h, mainToken, `{"type": "task", "team": "main", "tags": ["gpu"]}`)
	postPlacement(t, h, mainToken, `{"type": "task", "team": "main", "tags": ["tpu"]}`)
	postPlacement(t, h, mainToken, `{"type": "task", "team": "main", "tags": ["gpu"], "strategy": "limit-active-tasks"}`)
	postPlacement(t, h, mainToken, `{"type": "nonsense"}`)

	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			switch f.GetName() {
			case "jetway_placements_total":
				got[metric.GetLabel()[0].GetValue()] = metric.GetCounter().GetValue()
			case "jetway_placement_decision_seconds":
				got["decisions"] = float64(metric.GetHistogram().GetSampleCount())
			}
		}
	}
	assert.Equal(t, map[string]float64{resultPlaced: 2, resultNoTarget: 1, resultAtLimit: 1, "decisions": 4}, got,
		"a bad body is no decision")

	var none *PlacementMetrics
	assert.NotPanics(t, func() { none.observe(resultPlaced, 0) })
}
