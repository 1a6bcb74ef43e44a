package helm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/deploy/helm"
	"github.com/jetway-ci/jetway/wire"
)

// TestConcourseREST: with concourse.url and the REST API's client instead
// of the TSA, the gateway gets the URL, client ID and web node networks
// as flags, the client's secret as a file of a read-only mount of only
// that key of the existing Secret, and its pod's IP as the worker
// address; the chart makes no Secret and never sees the secret. The
// resource types are the ConfigMap's file, as with the TSA. The notes
// name the networks and the NetworkPolicy.
func TestConcourseREST(t *testing.T) {
	o, r := renderCI(t, "concourse-rest-values.yaml")
	for _, k := range o.keys() {
		if strings.HasPrefix(k, "Secret/") {
			assert.Equal(t, "Secret/"+fullname+"-mesh-ca", k, "the chart makes no Secret of the client's")
		}
	}
	d, c := deployment(t, o, fullname)
	f := flags(t, c.Args)
	assert.Equal(t, "https://ci.example.com", f["concourse-url"])
	assert.Equal(t, "jetway", f["concourse-client-id"])
	assert.Equal(t, "/etc/jetway/concourse/client_secret", f["concourse-client-secret-file"])
	assert.Equal(t, "/etc/jetway/config/resource-types.yaml", f["concourse-resource-types"])
	assert.Equal(t, "10.42.0.0/16,192.168.7.1,fd00:42::7", f["concourse-web-node-networks"])
	for _, k := range []string{"concourse-tsa", "concourse-tsa-public-key", "concourse-worker-key", "concourse-worker-address", "concourse-insecure"} {
		assert.NotContains(t, f, k)
	}

	v := assertConcourseMount(t, d.Spec.Template.Spec, *c, "jetway-concourse-client")
	assert.Equal(t, []corev1.KeyToPath{{Key: "client_secret", Path: "client_secret"}}, v.Items)
	assert.Equal(t, []corev1.EnvVar{workerAddressEnv}, c.Env)
	assert.NotContains(t, d.Spec.Template.Annotations, "checksum/concourse", "the chart does not make the Secret")

	cm := get[corev1.ConfigMap](t, o, "ConfigMap", fullname+"-config")
	file := filepath.Join(t.TempDir(), "resource-types.yaml")
	require.NoError(t, os.WriteFile(file, []byte(cm.Data["resource-types.yaml"]), 0o440))
	types, err := concourse.LoadResourceTypes(file)
	require.NoError(t, err)
	assert.Equal(t, []wire.ResourceType{{Type: "registry-image", Image: "docker.io/concourse/registry-image-resource:1.14.2"}}, types)

	assert.Contains(t, r.Notes, "workers of the Concourse at https://ci.example.com through its REST API, as its client jetway, with the secret in the Secret jetway-concourse-client (key client_secret);")
	assert.Contains(t, r.Notes, "the gateway closes every connection to them from outside 10.42.0.0/16, 192.168.7.1, fd00:42::7 (concourse.webNodeNetworks)")
	assert.Contains(t, r.Notes, "The NetworkPolicy "+fullname+" admits to these pods the API port and the mesh port from anywhere and every other TCP port only from the web node (concourse.webNodeNetworks, concourse.webNodePeers)")
	assert.NotContains(t, r.Notes, "must let the web node in on any TCP port")
	assert.NotContains(t, r.Notes, "WARNING: concourse.insecure")
	assert.NotContains(t, r.Notes, "Concourse whose TSA")
}

// workerAddressEnv is the gateway's concourse-worker-address in REST
// mode: each replica's own pod IP, from the downward API.
var workerAddressEnv = corev1.EnvVar{Name: "JETWAY_CONCOURSE_WORKER_ADDRESS",
	ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}

// TestConcourseRESTSecretKey: the Secret's own key name is mapped to the
// file the flag names; extraEnv comes after the worker address; without
// resource types there is no file of them. An http:// URL with
// concourse.insecure gives --concourse-insecure, and the notes warn.
func TestConcourseRESTSecretKey(t *testing.T) {
	proxy := corev1.EnvVar{Name: "HTTPS_PROXY", Value: "http://proxy.example:3128"}
	o, r := render(t, map[string]any{
		"auth":     map[string]any{"noAuth": true},
		"extraEnv": []any{map[string]any{"name": proxy.Name, "value": proxy.Value}},
		"concourse": map[string]any{"url": "http://10.0.0.7:8080", "insecure": true, "clientId": "jetway",
			"clientSecret":    map[string]any{"existingSecret": "concourse-clients", "key": "jetway.secret"},
			"webNodeNetworks": []any{"10.0.0.7"}},
	})
	d, c := deployment(t, o, fullname)
	v := assertConcourseMount(t, d.Spec.Template.Spec, *c, "concourse-clients")
	assert.Equal(t, []corev1.KeyToPath{{Key: "jetway.secret", Path: "client_secret"}}, v.Items)
	assert.Equal(t, []corev1.EnvVar{workerAddressEnv, proxy}, c.Env)
	f := flags(t, c.Args)
	assert.Equal(t, "http://10.0.0.7:8080", f["concourse-url"])
	assert.Equal(t, "true", f["concourse-insecure"])
	assert.Equal(t, "10.0.0.7", f["concourse-web-node-networks"])
	assert.NotContains(t, f, "concourse-resource-types")
	assert.Contains(t, r.Notes, "WARNING: concourse.insecure: the client secret, and the tokens it buys, travel unencrypted to http://10.0.0.7:8080.")
	cm := get[corev1.ConfigMap](t, o, "ConfigMap", fullname+"-config")
	assert.Equal(t, []string{"config.yaml"}, keys(cm.Data))
}

// TestConcourseURLs: every URL form the schema takes, with the TSA (the
// version check) or alone (the REST API; an http:// one with
// concourse.insecure), is one the gateway's own loader accepts from the
// rendered flags and environment.
func TestConcourseURLs(t *testing.T) {
	tsa := map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse"}
	rest := map[string]any{"clientId": "jetway", "clientSecret": map[string]any{"existingSecret": "jetway-concourse-client"},
		"webNodeNetworks": []any{"10.42.0.0/16"}}
	for _, url := range []string{"https://ci.example.com", "http://10.0.0.7:8080", "https://[fd00::7]:8443/", "https://example.com/concourse"} {
		for mode, cc := range map[string]map[string]any{"tsa": tsa, "rest": rest} {
			t.Run(mode+" "+url, func(t *testing.T) {
				cc := withURL(cc, url)
				if mode == "rest" && strings.HasPrefix(url, "http:") {
					cc["insecure"] = true
				}
				vals := map[string]any{"auth": map[string]any{"noAuth": true}, "concourse": cc}
				o, _ := render(t, vals)
				d, c := deployment(t, o, fullname)
				args, _ := layOut(t, o, d.Spec.Template.Spec, c, t.TempDir())
				setEnv(t, *c)
				cfg := loadConfig(t, args)
				assert.Equal(t, url, cfg.ConcourseURL)
				assertConcourseLoads(t, cfg)
			})
		}
	}
}

func withURL(cc map[string]any, url string) map[string]any {
	out := map[string]any{"url": url}
	for k, v := range cc {
		out[k] = v
	}
	return out
}

// TestConcourseNeverTakesTheClientSecret: the chart has no value for the
// client's secret itself; one given anyway fails the render without the
// error repeating it.
func TestConcourseNeverTakesTheClientSecret(t *testing.T) {
	const secret = "a-client-secret-0123456789"
	for name, cs := range map[string]any{
		"as the value":      secret,
		"as a nested value": map[string]any{"existingSecret": "jetway-concourse-client", "value": secret},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := helm.Render(helm.Release{Name: release, Namespace: namespace, Values: map[string]any{
				"auth":      map[string]any{"noAuth": true},
				"concourse": map[string]any{"url": "https://ci.example.com", "clientId": "jetway", "clientSecret": cs},
			}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "/concourse/clientSecret")
			assert.NotContains(t, err.Error(), secret)
		})
	}
}
