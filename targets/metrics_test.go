package targets

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// registryOfEveryState is a registry whose metrics are on reg, holding a
// target in each state the API lists, one with missing permissions, and
// a pruned one.
func registryOfEveryState(t *testing.T, reg prometheus.Registerer) *Registry {
	t.Helper()
	r := NewRegistry(RegistryOptions{Interval: 1, Timeout: 1, Metrics: NewMetrics(reg)})
	add := func(name, team string, life Lifecycle, h Health) *Config {
		cfg := testConfig(t, name)
		cfg.Meta.Team = team
		rec := &record{name: name, cfg: cfg, target: listed(cfg, life)}
		rec.record(h, 1)
		r.records[name] = rec
		return cfg
	}
	add("east", "main", Lifecycle{}, Health{})
	add("west", "main", Lifecycle{}, Health{Missing: Required[:2], Reason: ReasonPermissions})
	add("shared", "", Lifecycle{State: StateLanded}, Health{})
	add("draining", "ops", Lifecycle{State: StateLanding}, Health{})
	add("leaving", "", Lifecycle{State: StateRetiring}, Health{})
	pruned := add("gone", "main", Lifecycle{}, Health{})
	setRecord(r.records["gone"].target, Lifecycle{PrunedHash: pruned.hash})
	return r
}

func TestTargetsGaugeHasEveryListedState(t *testing.T) {
	reg := prometheus.NewRegistry()
	registryOfEveryState(t, reg)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jetway_targets Targets by Concourse worker state.
# TYPE jetway_targets gauge
jetway_targets{state="landed"} 1
jetway_targets{state="landing"} 1
jetway_targets{state="retiring"} 1
jetway_targets{state="running"} 1
jetway_targets{state="stalled"} 1
`), "jetway_targets"), "every listed state, the pruned target in none")

	empty := prometheus.NewRegistry()
	NewMetrics(empty)
	require.NoError(t, testutil.GatherAndCompare(empty, strings.NewReader(`
# HELP jetway_targets Targets by Concourse worker state.
# TYPE jetway_targets gauge
jetway_targets{state="landed"} 0
jetway_targets{state="landing"} 0
jetway_targets{state="retiring"} 0
jetway_targets{state="running"} 0
jetway_targets{state="stalled"} 0
`), "jetway_targets"), "every listed state before the registry is known")
}

// Alerts on one target (stalled for long, missing permissions) select it
// by name: one series of each per listed target, the pruned one in none.
func TestEachTargetHasItsStateAndMissingPermissions(t *testing.T) {
	reg := prometheus.NewRegistry()
	registryOfEveryState(t, reg)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jetway_target_missing_permissions Required permissions the target's last check found missing (0 when none, or when it could not review them).
# TYPE jetway_target_missing_permissions gauge
jetway_target_missing_permissions{target="draining"} 0
jetway_target_missing_permissions{target="east"} 0
jetway_target_missing_permissions{target="leaving"} 0
jetway_target_missing_permissions{target="shared"} 0
jetway_target_missing_permissions{target="west"} 2
# HELP jetway_target_state 1 for each target, labelled with its Concourse worker state and team (empty: global).
# TYPE jetway_target_state gauge
jetway_target_state{state="landed",target="shared",team=""} 1
jetway_target_state{state="landing",target="draining",team="ops"} 1
jetway_target_state{state="retiring",target="leaving",team=""} 1
jetway_target_state{state="running",target="east",team="main"} 1
jetway_target_state{state="stalled",target="west",team="main"} 1
`), "jetway_target_state", "jetway_target_missing_permissions"))

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, l.GetValue(), secretToken, "%s{%s}", mf.GetName(), l.GetName())
				assert.NotContains(t, l.GetValue(), "127.0.0.1", "%s{%s}: no server address", mf.GetName(), l.GetName())
			}
		}
	}
}

func TestMissingPermissionsFollowTheLastCheck(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := registryOfEveryState(t, reg)
	missing := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "jetway_target_missing_permissions" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "west" {
					return m.GetGauge().GetValue()
				}
			}
		}
		t.Fatal("no jetway_target_missing_permissions{target=\"west\"}")
		return 0
	}
	assert.Equal(t, 2.0, missing())
	r.records["west"].record(Health{Missing: Required[:1], Reason: ReasonPermissions}, 1)
	assert.Equal(t, 1.0, missing(), "one granted since")
	r.records["west"].record(Health{}, 1)
	assert.Equal(t, 0.0, missing(), "every one granted")
}

// What a target costs its API server is counted by target, verb and
// resource: the clients' requests, and those made with the target's
// REST configuration elsewhere (exec, port-forward).
func TestEachTargetsAPIRequestsAreCounted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	r := NewRegistry(RegistryOptions{Interval: 1, Timeout: 1, Metrics: NewMetrics(reg)})
	cfg := testConfig(t, "east")
	cfg.REST = &rest.Config{Host: srv.URL}
	tg, err := NewTarget(cfg, "test")
	require.NoError(t, err)
	r.records["east"] = &record{name: "east", cfg: cfg, target: tg}

	_, err = tg.Pod(t.Context(), "p")
	require.Error(t, err)
	_, err = tg.Pod(t.Context(), "q")
	require.Error(t, err)
	_, err = tg.Core.Pods("east").List(t.Context(), metav1.ListOptions{})
	require.Error(t, err)
	hc, err := rest.HTTPClientFor(tg.RESTConfig())
	require.NoError(t, err)
	resp, err := hc.Post(srv.URL+"/api/v1/namespaces/east/pods/p/portforward", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Nil(t, cfg.REST.WrapTransport, "the registry's configuration is not changed")
	require.Same(t, cfg, tg.Config, "the target's configuration is the registry's")

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jetway_target_api_requests_total Requests the gateway made of each target's API server (from the target's last load: a rotated kubeconfig starts again), by verb and resource as the API server names them.
# TYPE jetway_target_api_requests_total counter
jetway_target_api_requests_total{resource="pods",target="east",verb="get"} 2
jetway_target_api_requests_total{resource="pods",target="east",verb="list"} 1
jetway_target_api_requests_total{resource="pods/portforward",target="east",verb="connect"} 1
`), "jetway_target_api_requests_total"))
	srv.CloseClientConnections()
}
