package helm_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/jetway-ci/jetway/deploy/helm"
)

// The release every test renders, unless it says otherwise.
const (
	release   = "jw"
	namespace = "ci"
	fullname  = "jw-jetway"
)

// TestLint runs `helm lint` on the chart with each value set of ci/:
// errors fail, warnings and notes are printed. (Lint without values passes:
// Helm's lint mode logs a template's fail instead of failing;
// TestRejectsBadValues renders them.)
func TestLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(helm.KubeVersion)
	require.NoError(t, err)
	for name, vals := range ciValues(t) {
		t.Run(name, func(t *testing.T) {
			l := lint.AllWithKubeVersion("jetway", vals, namespace, kv)
			for _, m := range l.Messages {
				if m.Severity == support.ErrorSev {
					t.Error(m)
				} else {
					t.Log(m)
				}
			}
		})
	}
}

// TestRejectsBadValues: the schema refuses typos and wrong types, and the
// templates refuse combinations that cannot work, each naming the value.
func TestRejectsBadValues(t *testing.T) {
	tokens := []any{map[string]any{"name": "ops", "token": "0123456789abcdef", "admin": true}}
	withTokens := func(v map[string]any) map[string]any {
		v["auth"] = map[string]any{"tokens": tokens}
		return v
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"unknown value", withTokens(map[string]any{"replicas": 3}), "additional properties 'replicas' not allowed"},
		{"unknown nested value", withTokens(map[string]any{"mesh": map[string]any{"enable": false}}), "additional properties 'enable' not allowed"},
		{"wrong type", withTokens(map[string]any{"replicaCount": "two"}), "/replicaCount"},
		{"unknown config key", withTokens(map[string]any{"config": map[string]any{"log-levle": "debug"}}), "additional properties 'log-levle' not allowed"},
		{"config key the chart sets", withTokens(map[string]any{"config": map[string]any{"listen": ":9090"}}), "additional properties 'listen' not allowed"},
		{"state namespace in config", withTokens(map[string]any{"config": map[string]any{"state-namespace": "elsewhere"}}), "additional properties 'state-namespace' not allowed"},
		{"concourse key in config", withTokens(map[string]any{"config": map[string]any{"concourse-tsa": "ci.example.com:2222"}}), "additional properties 'concourse-tsa' not allowed"},
		{"concourse URL in config", withTokens(map[string]any{"config": map[string]any{"concourse-url": "https://ci.example.com"}}), "additional properties 'concourse-url' not allowed"},
		{"REST client in config", withTokens(map[string]any{"config": map[string]any{"concourse-client-id": "jetway"}}), "additional properties 'concourse-client-id' not allowed"},
		{"REST client's secret in config", withTokens(map[string]any{"config": map[string]any{"concourse-client-secret-file": "/etc/secret"}}), "additional properties 'concourse-client-secret-file' not allowed"},
		{"worker address in config", withTokens(map[string]any{"config": map[string]any{"concourse-worker-address": "10.0.0.7"}}), "additional properties 'concourse-worker-address' not allowed"},
		{"worker address in extraEnv", withTokens(map[string]any{"extraEnv": []any{map[string]any{"name": "JETWAY_CONCOURSE_WORKER_ADDRESS", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.podIP"}}}}}), "extraEnv: JETWAY_CONCOURSE_WORKER_ADDRESS is a setting the chart gives from the concourse values"},
		{"TSA in extraEnv", withTokens(map[string]any{"extraEnv": []any{map[string]any{"name": "JETWAY_CONCOURSE_TSA", "value": "ci.example.com:2222"}}}), "extraEnv: JETWAY_CONCOURSE_TSA is a setting"},
		{"state kubeconfig in config", withTokens(map[string]any{"config": map[string]any{"state-kubeconfig": "/etc/state.kubeconfig"}}), "additional properties 'state-kubeconfig' not allowed"},
		{"state namespace in extraEnv", withTokens(map[string]any{"extraEnv": []any{map[string]any{"name": "JETWAY_STATE_NAMESPACE", "value": "elsewhere"}}}), "extraEnv: JETWAY_STATE_NAMESPACE would move the gateways' step state away from the Role the chart grants; set state.namespace instead"},
		{"state kubeconfig in extraEnv", withTokens(map[string]any{"extraEnv": []any{map[string]any{"name": "JETWAY_STATE_KUBECONFIG", "value": "/x"}}}), "extraEnv: JETWAY_STATE_KUBECONFIG would move"},
		{"state namespace not a DNS label", withTokens(map[string]any{"state": map[string]any{"namespace": "Jetway_State"}}), "/state/namespace"},
		{"unknown state value", withTokens(map[string]any{"state": map[string]any{"rbac": map[string]any{"enabled": false}}}), "additional properties 'enabled' not allowed"},
		{"duration without unit", withTokens(map[string]any{"config": map[string]any{"health-interval": 10}}), "/config/health-interval"},
		{"target name not a DNS label", withTokens(map[string]any{"targets": map[string]any{"kubeconfigs": map[string]any{"Prod_EU": "x"}}}), "Prod_EU"},
		{"bad mesh peer", withTokens(map[string]any{"mesh": map[string]any{"peers": []any{"hub.example"}}}), "/mesh/peers/0"},
		{"short token", map[string]any{"auth": map[string]any{"tokens": []any{map[string]any{"name": "ops", "token": "short", "admin": true}}}}, "/auth/tokens/0/token"},
		{"no auth", map[string]any{}, "auth: the API needs tokens: set auth.tokens"},
		{"tokens and a Secret", map[string]any{"auth": map[string]any{"tokens": tokens, "existingSecret": "x"}}, "give auth.existingSecret or auth.tokens, not both"},
		{"noAuth and tokens", map[string]any{"auth": map[string]any{"tokens": tokens, "noAuth": true}}, "noAuth contradicts"},
		{"token for admin and team", map[string]any{"auth": map[string]any{"tokens": []any{map[string]any{"name": "ops", "token": "0123456789abcdef", "admin": true, "team": "main"}}}}, "auth.tokens[0] (ops): give exactly one of admin: true or team"},
		{"token for no one", map[string]any{"auth": map[string]any{"tokens": []any{map[string]any{"name": "ops", "token": "0123456789abcdef"}}}}, "auth.tokens[0] (ops): give exactly one of admin: true or team"},
		{"member certificate lifetime without unit", withTokens(map[string]any{"mesh": map[string]any{"certManager": map[string]any{"memberDuration": "7"}}}), "/mesh/certManager/memberDuration"},
		{"budget of nothing", withTokens(map[string]any{"podDisruptionBudget": map[string]any{"maxUnavailable": nil}}), "podDisruptionBudget: give maxUnavailable or minAvailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helm.Render(helm.Release{Name: release, Namespace: namespace, Values: tc.values})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// ciValues returns the value sets of the chart's ci folder.
func ciValues(t *testing.T) map[string]map[string]any {
	t.Helper()
	sets, err := helm.CIValues()
	require.NoError(t, err)
	require.NotEmpty(t, sets)
	return sets
}

// objects is a rendering, by kind and name.
type objects map[string]*unstructured.Unstructured

func render(t *testing.T, values map[string]any) (objects, *helm.Rendered) {
	t.Helper()
	r, err := helm.Render(helm.Release{Name: release, Namespace: namespace, Values: values})
	require.NoError(t, err)
	objs := objects{}
	for _, o := range r.Objects {
		key := o.GetKind() + "/" + o.GetName()
		require.NotContains(t, objs, key, "rendered twice")
		objs[key] = o
	}
	return objs, r
}

func renderCI(t *testing.T, set string) (objects, *helm.Rendered) {
	t.Helper()
	vals, ok := ciValues(t)[set]
	require.True(t, ok, "no ci/%s", set)
	return render(t, vals)
}

func (o objects) keys() []string { return slices.Sorted(maps.Keys(o)) }

// get decodes the object kind/name into T, failing on any field T does not
// know: a misspelt field in a template is an error here, not a field the
// API server drops.
func get[T any](t *testing.T, o objects, kind, name string) *T {
	t.Helper()
	u, ok := o[kind+"/"+name]
	require.True(t, ok, "no %s/%s among %v", kind, name, o.keys())
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true))
	return out
}

func deployment(t *testing.T, o objects, name string) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d := get[appsv1.Deployment](t, o, "Deployment", name)
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	return d, &d.Spec.Template.Spec.Containers[0]
}

// flags reads a container's args after the subcommand as --key value
// pairs; a flag without a value (a bool) maps to "true".
func flags(t *testing.T, args []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		key, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			continue
		}
		require.NotContains(t, out, key, "flag given twice")
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			out[key] = args[i+1]
			i++
		} else {
			out[key] = "true"
		}
	}
	return out
}

func volume(t *testing.T, spec corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %s", name)
	return corev1.Volume{}
}

// mounts maps a container's mount paths to their volumes.
func mounts(c corev1.Container) map[string]corev1.VolumeMount {
	out := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		out[m.MountPath] = m
	}
	return out
}
