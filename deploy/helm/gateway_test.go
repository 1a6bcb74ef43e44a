package helm_test

import (
	"cmp"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/config"
	"github.com/jetway-ci/jetway/targets"
)

// chartKeys are the settings the chart gives as flags (or, for one, an
// environment variable), never from the config value. mesh-name is one
// though the chart never sets it: the certificate each replica issues
// itself names it; so is state-kubeconfig: the gateway reaches its state
// namespace with its pod's token, which the chart's Role is for. The
// concourse-* keys are files the chart mounts, the TSA or the REST API
// they go with, and the pod's own IP (the concourse values).
var chartKeys = []string{
	"listen", "targets-dir", "shutdown-timeout", "auth-tokens-file", "no-auth",
	"mesh-listen", "mesh-peers", "mesh-ca", "mesh-cert", "mesh-key", "mesh-name", "mesh-leave-on-stop",
	"state-kubeconfig", "state-namespace",
	"concourse-tsa", "concourse-tsa-public-key", "concourse-worker-key", "concourse-resource-types",
	"concourse-url", "concourse-client-id", "concourse-client-secret-file", "concourse-worker-address",
	"concourse-web-node-networks", "concourse-insecure",
}

// TestGatewayLoadsRenderedConfig starts what `gateway run` reads before it
// serves, on what each value set renders: the container's flags, the
// config file, the tokens file and the targets Secret, laid out as the pod
// mounts them (under a temporary root). The gateway's own loaders must
// accept all of it.
func TestGatewayLoadsRenderedConfig(t *testing.T) {
	sets := ciValues(t)
	sets["no-auth"] = map[string]any{"auth": map[string]any{"noAuth": true}}
	tsaPub, workerKey := concourseKeys(t)
	sets["concourse-inline-keys"] = map[string]any{
		"auth":      map[string]any{"noAuth": true},
		"concourse": map[string]any{"tsa": "10.0.0.7:2222", "tsaPublicKey": tsaPub, "workerKey": workerKey},
	}
	for name, vals := range sets {
		t.Run(name, func(t *testing.T) {
			o, _ := render(t, vals)
			var dep string
			for _, k := range o.keys() {
				if n, ok := strings.CutPrefix(k, "Deployment/"); ok {
					dep = n
				}
			}
			d, c := deployment(t, o, dep)
			root := t.TempDir()
			args, targetFiles := layOut(t, o, d.Spec.Template.Spec, c, root)
			setEnv(t, *c)
			cfg := loadConfig(t, args)
			grace := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
			assert.Greater(t, grace, cfg.ShutdownTimeout+5*time.Second)
			assertStateGranted(t, o, cfg)

			if cfg.AuthTokensFile != "" {
				_, tokens, err := api.NewTokenFile(api.TokenFileOptions{Path: cfg.AuthTokensFile, Set: func([]api.Token) {}})
				require.NoError(t, err)
				assert.NotEmpty(t, tokens)
			}
			results, _, err := targets.NewSource(targets.SourceOptions{Dir: cfg.TargetsDir}, nil).Read()
			require.NoError(t, err)
			require.Len(t, results, targetFiles)
			for target, res := range results {
				assert.NoError(t, res.Err, target)
			}
			assertConcourseLoads(t, cfg)
		})
	}
}

// loadConfig loads the gateway's config from args (after "run") and the
// environment as `gateway run` does; it must load.
func loadConfig(t *testing.T, args []string) config.Config {
	t.Helper()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	require.NoError(t, fs.Parse(args))
	cfg, err := config.Load(fs)
	require.NoError(t, err)
	return cfg
}

// assertConcourseLoads reads the Concourse keys, or the REST API client's
// secret, and the resource types as the gateway does before it registers
// (cmd/gateway's newRegistrar and newWeb), if it joins a Concourse.
func assertConcourseLoads(t *testing.T, cfg config.Config) {
	t.Helper()
	switch {
	case cfg.ConcourseTSA != "":
		_, err := concourse.LoadHostKeys(cfg.ConcourseTSAPublicKey)
		assert.NoError(t, err)
		_, err = concourse.LoadWorkerKey(cfg.ConcourseWorkerKey)
		assert.NoError(t, err)
	case cfg.ConcourseURL != "":
		b, err := os.ReadFile(cfg.ConcourseClientSecretFile)
		require.NoError(t, err)
		secret := strings.TrimSpace(string(b))
		require.NotEmpty(t, secret)
		assert.Equal(t, podIP, cfg.ConcourseWorkerAddress)
		nets, err := cfg.WebNodeNetworks()
		require.NoError(t, err)
		web, err := concourse.NewREST(concourse.RESTOptions{URL: cfg.ConcourseURL, ClientID: cfg.ConcourseClientID,
			ClientSecret: concourse.Secret(secret), Insecure: cfg.ConcourseInsecure, WorkerHost: cfg.ConcourseWorkerAddress,
			WebNodeNetworks: nets})
		require.NoError(t, err)
		web.Close()
	default:
		return
	}
	_, err := concourse.LoadResourceTypes(cfg.ConcourseResourceTypes)
	assert.NoError(t, err)
}

// podIP stands in for the pod's IP the downward API gives.
const podIP = "10.244.1.7"

// setEnv sets the container's environment for the rest of the test, as
// the kubelet would: values as they are, the pod's IP from the downward
// API. Any other source fails: the test cannot say what it would be.
func setEnv(t *testing.T, c corev1.Container) {
	t.Helper()
	require.Empty(t, c.EnvFrom)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			t.Setenv(e.Name, e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			t.Setenv(e.Name, podIP)
		default:
			t.Fatalf("env %s: a source the test does not stand in for", e.Name)
		}
	}
}

// assertStateGranted: the gateway keeps its steps where the chart's
// RoleBinding lets its ServiceAccount: in the cluster it runs in (no state
// kubeconfig), in the state namespace it was given or else its pod's own.
func assertStateGranted(t *testing.T, o objects, cfg config.Config) {
	t.Helper()
	assert.Empty(t, cfg.StateKubeconfig)
	var bindings []string
	for _, k := range o.keys() {
		if name, ok := strings.CutPrefix(k, "RoleBinding/"); ok {
			bindings = append(bindings, name)
		}
	}
	require.Len(t, bindings, 1)
	rb := get[rbacv1.RoleBinding](t, o, "RoleBinding", bindings[0])
	assert.Equal(t, cmp.Or(cfg.StateNamespace, namespace), rb.Namespace)
}

// layOut writes what the pod mounts under root: the config files, the
// targets Secret's keys (if the chart makes it), the tokens file and the
// Concourse keys (the chart's, or ones standing in for an existing
// Secret). It returns the container's args after "run", their /etc/jetway
// paths moved under root, and the number of target files.
func layOut(t *testing.T, o objects, pod corev1.PodSpec, c *corev1.Container, root string) ([]string, int) {
	t.Helper()
	at := func(path string) string { return filepath.Join(root, path) }
	cm := get[corev1.ConfigMap](t, o, "ConfigMap", volume(t, pod, "config").ConfigMap.Name)
	configFiles := map[string][]byte{}
	for name, data := range cm.Data {
		configFiles[name] = []byte(data)
	}
	mount(t, at("/etc/jetway/config"), configFiles)
	var targetFiles map[string][]byte
	if name := volume(t, pod, "targets").Secret.SecretName; o["Secret/"+name] != nil {
		targetFiles = get[corev1.Secret](t, o, "Secret", name).Data
	}
	mount(t, at("/etc/jetway/targets"), targetFiles)
	if !slices.Contains(c.Args, "--no-auth") {
		tokens := []byte("tokens: [{name: ops, token: an-existing-secret-token, admin: true}]")
		if name := volume(t, pod, "auth").Secret.SecretName; o["Secret/"+name] != nil {
			tokens = get[corev1.Secret](t, o, "Secret", name).Data["tokens.yaml"]
		}
		mount(t, at("/etc/jetway/auth"), map[string][]byte{"tokens.yaml": tokens})
	}
	if m, ok := mounts(*c)["/etc/jetway/concourse"]; ok {
		mount(t, at(m.MountPath), concourseFiles(t, o, volume(t, pod, m.Name).Secret))
	}
	require.Equal(t, "run", c.Args[0])
	args := slices.Clone(c.Args[1:])
	for i, a := range args {
		if strings.HasPrefix(a, "/etc/jetway/") {
			args[i] = at(a)
		}
	}
	return args, len(targetFiles)
}

// mount writes files into dir as a Secret or ConfigMap volume shows them.
func mount(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o440))
	}
}

// TestSchemaKnowsEveryConfigKey keeps values.schema.json's config keys
// those of `gateway run` less the ones the chart sets: a key added to the
// gateway is a key operators can set through the chart.
func TestSchemaKnowsEveryConfigKey(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	var want []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != config.FileFlag && !slices.Contains(chartKeys, f.Name) {
			want = append(want, f.Name)
		}
	})
	for _, k := range chartKeys {
		assert.NotNil(t, fs.Lookup(k), "chartKeys names %s, which gateway run does not know", k)
	}
	s := schema(t)
	cfg := s.Properties["config"]
	assert.Equal(t, false, cfg.AdditionalProperties, "config keys are checked")
	assert.ElementsMatch(t, want, slices.Collect(maps.Keys(cfg.Properties)))
}

// TestValuesDocumented: every value is in values.yaml, in the schema, and
// in a row of the README's table.
func TestValuesDocumented(t *testing.T) {
	readme, err := os.ReadFile("jetway/README.md")
	require.NoError(t, err)
	defaults, err := os.ReadFile("jetway/values.yaml")
	require.NoError(t, err)
	var vals map[string]any
	require.NoError(t, yaml.Unmarshal(defaults, &vals))
	s := schema(t)
	for _, path := range leaves(s, vals, "") {
		assert.Contains(t, string(readme), "| `"+path+"` |", "README.md has no row for %s", path)
	}
	for key := range s.Properties {
		if key != "global" {
			assert.Contains(t, vals, key, "values.yaml has no default for %s", key)
		}
	}
}

// leaves lists the value paths a README row documents: a value the schema
// describes field by field is walked into, any other is one row.
func leaves(s *schemaNode, vals map[string]any, prefix string) []string {
	var out []string
	for _, key := range slices.Sorted(maps.Keys(vals)) {
		sub, ok := s.Properties[key]
		m, isMap := vals[key].(map[string]any)
		if ok && isMap && len(m) > 0 && len(sub.Properties) > 0 && key != "config" {
			out = append(out, leaves(sub, m, prefix+key+".")...)
			continue
		}
		out = append(out, prefix+key)
	}
	return out
}

// schemaNode is what the tests read of a JSON schema.
type schemaNode struct {
	Properties map[string]*schemaNode `json:"properties"`
	// AdditionalProperties is false, a schema, or nil.
	AdditionalProperties any `json:"additionalProperties"`
}

func schema(t *testing.T) *schemaNode {
	t.Helper()
	data, err := os.ReadFile("jetway/values.schema.json")
	require.NoError(t, err)
	var s schemaNode
	require.NoError(t, json.Unmarshal(data, &s))
	return &s
}
