package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestMonitoring: the ServiceMonitor scrapes the API Service's /metrics and
// no other Service; the PrometheusRule has the four alerts over
// this installation's series, each saying what to do.
func TestMonitoring(t *testing.T) {
	o, _ := renderCI(t, "monitoring-values.yaml")
	sm := o["ServiceMonitor/"+fullname]
	require.NotNil(t, sm)
	assert.Equal(t, "monitoring.coreos.com/v1", sm.GetAPIVersion())
	assert.Equal(t, "prometheus", sm.GetLabels()["release"])
	selector, _, err := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	require.NoError(t, err)
	api := get[corev1.Service](t, o, "Service", fullname)
	mesh := get[corev1.Service](t, o, "Service", fullname+"-mesh")
	assert.Equal(t, selector, subset(api.Labels, selector), "selects the API Service")
	assert.NotEqual(t, selector, subset(mesh.Labels, selector), "selects the mesh Service")
	endpoints, _, err := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	require.NoError(t, err)
	require.Len(t, endpoints, 1)
	assert.Equal(t, "http", endpoints[0].(map[string]any)["port"])
	assert.Equal(t, "/metrics", endpoints[0].(map[string]any)["path"])
	assert.Equal(t, []any{namespace}, field(t, sm, "spec", "namespaceSelector", "matchNames"))

	rules := alertRules(t, o)
	pr := o["PrometheusRule/"+fullname]
	assert.Equal(t, "prometheus", pr.GetLabels()["release"])
	want := map[string]struct{ metric, forDuration, severity string }{
		"JetwayTargetStalled":            {`jetway_target_state{job="jw-jetway",namespace="ci",state="stalled"}`, "5m", "warning"},
		"JetwayTargetMissingPermissions": {`jetway_target_missing_permissions{job="jw-jetway",namespace="ci"}`, "3m", "warning"},
		"JetwayNoRunningTarget":          {`jetway_target_state{job="jw-jetway",namespace="ci",state="running"}`, "5m", "critical"},
		"JetwayMeshPeerLost":             {`jetway_mesh_peers{job="jw-jetway",namespace="ci",state="lost"}`, "5m", "warning"},
		"JetwayPodRefused":               {`jetway_steps_rejected_total{job="jw-jetway",namespace="ci"}`, "", "warning"},
	}
	require.Len(t, rules, len(want))
	for _, r := range rules {
		w, ok := want[r.Alert]
		require.True(t, ok, "unexpected alert %s", r.Alert)
		assert.Contains(t, r.Expr, w.metric, r.Alert)
		assert.Equal(t, w.forDuration, r.For, r.Alert)
		assert.Equal(t, w.severity, r.Labels["severity"], r.Alert)
		for _, a := range []string{"summary", "description", "runbook_url"} {
			assert.NotEmpty(t, r.Annotations[a], "%s: %s", r.Alert, a)
		}
		assert.Contains(t, r.Annotations["runbook_url"], "docs/operations.md")
	}

	// A chosen selector replaces the default one.
	o, _ = render(t, map[string]any{"auth": map[string]any{"noAuth": true},
		"metrics": map[string]any{"prometheusRule": map[string]any{"enabled": true, "metricSelector": `cluster="eu"`}}})
	for _, r := range alertRules(t, o) {
		assert.NotContains(t, r.Expr, `job="jw-jetway"`, r.Alert)
		assert.Contains(t, r.Expr, `{cluster="eu"`, r.Alert)
	}
}

// TestAlertRules evaluates the alerts with promtool on series of two
// replicas (testdata/alerts_test.yaml): one alert per problem however many
// replicas report it, a global target running keeps every team served, and
// the for durations. It runs the promtool `make tools` builds into the bin
// dir (JETWAY_BIN_DIR), else one on PATH.
func TestAlertRules(t *testing.T) {
	promtool := filepath.Join(os.Getenv("JETWAY_BIN_DIR"), "promtool")
	if _, err := os.Stat(promtool); os.Getenv("JETWAY_BIN_DIR") == "" || err != nil {
		var err error
		promtool, err = exec.LookPath("promtool")
		require.NoError(t, err, "promtool is in neither $JETWAY_BIN_DIR nor PATH: make tools builds it (tools/promtool)")
	}
	o, _ := renderCI(t, "monitoring-values.yaml")
	spec, err := yaml.Marshal(o["PrometheusRule/"+fullname].Object["spec"])
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o644))
	tests, err := os.ReadFile("testdata/alerts_test.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644))
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "SUCCESS")
}

// alertRule is what the tests read of a Prometheus alerting rule.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func alertRules(t *testing.T, o objects) []alertRule {
	t.Helper()
	pr := o["PrometheusRule/"+fullname]
	require.NotNil(t, pr)
	var spec struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	b, err := yaml.Marshal(pr.Object["spec"])
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(b, &spec))
	require.Len(t, spec.Groups, 1)
	for _, r := range spec.Groups[0].Rules {
		assert.NotContains(t, r.Expr, "{{", "%s: a template left in the expression", r.Alert)
		assert.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), r.Alert)
	}
	return spec.Groups[0].Rules
}
