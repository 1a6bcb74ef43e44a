package helm_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/deploy/helm"
	"github.com/jetway-ci/jetway/wire"
)

// TestConcourseOffByDefault: without concourse values the chart joins no
// Concourse: no Secret, volume, mount, flag, environment variable or file
// of it, in any value set that does not ask for one.
func TestConcourseOffByDefault(t *testing.T) {
	for name, vals := range ciValues(t) {
		if vals["concourse"] != nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			o, r := render(t, vals)
			for _, k := range o.keys() {
				assert.NotContains(t, k, "concourse")
			}
			var dep string
			for _, k := range o.keys() {
				if n, ok := strings.CutPrefix(k, "Deployment/"); ok {
					dep = n
				}
			}
			d, c := deployment(t, o, dep)
			for key := range flags(t, c.Args) {
				assert.NotContains(t, key, "concourse")
			}
			assert.NotContains(t, mounts(*c), "/etc/jetway/concourse")
			for _, e := range c.Env {
				assert.NotContains(t, e.Name, "CONCOURSE")
			}
			for _, v := range d.Spec.Template.Spec.Volumes {
				assert.NotEqual(t, "concourse", v.Name)
			}
			assert.NotContains(t, d.Spec.Template.Annotations, "checksum/concourse")
			cm := get[corev1.ConfigMap](t, o, "ConfigMap", volume(t, d.Spec.Template.Spec, "config").ConfigMap.Name)
			assert.Equal(t, []string{"config.yaml"}, keys(cm.Data))
			assert.NotContains(t, r.Notes, "Concourse whose TSA")
			assert.NotContains(t, r.Notes, "through its REST API")
		})
	}
}

// TestConcourseExistingSecret: with concourse.tsa and an existing Secret
// the gateway gets the concourse-* flags, each naming a file of a
// read-only mount of that Secret's two keys; the chart makes no Secret,
// and the resource types reach the config as the file the flag names.
func TestConcourseExistingSecret(t *testing.T) {
	o, r := renderCI(t, "concourse-values.yaml")
	var secrets []string
	for _, k := range o.keys() {
		if strings.HasPrefix(k, "Secret/") {
			secrets = append(secrets, k)
		}
	}
	assert.Equal(t, []string{"Secret/" + fullname + "-mesh-ca"}, secrets, "the chart makes no Secret of the keys")
	d, c := deployment(t, o, fullname)
	pod := d.Spec.Template.Spec
	f := flags(t, c.Args)
	assert.Equal(t, "ci.example.com:2222", f["concourse-tsa"])
	assert.Equal(t, "/etc/jetway/concourse/tsa_host_key.pub", f["concourse-tsa-public-key"])
	assert.Equal(t, "/etc/jetway/concourse/worker_key", f["concourse-worker-key"])
	assert.Equal(t, "/etc/jetway/config/resource-types.yaml", f["concourse-resource-types"])
	assert.Equal(t, "https://ci.example.com", f["concourse-url"], "the web node's worker version is read there")

	v := assertConcourseMount(t, pod, *c, "jetway-concourse")
	assert.Equal(t, []corev1.KeyToPath{
		{Key: "tsa_host_key.pub", Path: "tsa_host_key.pub"},
		{Key: "worker_key", Path: "worker_key"},
	}, v.Items)
	assert.NotContains(t, d.Spec.Template.Annotations, "checksum/concourse", "the chart does not make the Secret")
	assert.Contains(t, r.Notes, "Concourse whose TSA is ci.example.com:2222, with the keys in the Secret jetway-concourse;")
	assert.Contains(t, r.Notes, "worker version at https://ci.example.com/api/v1/info;")

	cm := get[corev1.ConfigMap](t, o, "ConfigMap", fullname+"-config")
	file := filepath.Join(t.TempDir(), "resource-types.yaml")
	require.NoError(t, os.WriteFile(file, []byte(cm.Data["resource-types.yaml"]), 0o440))
	types, err := concourse.LoadResourceTypes(file)
	require.NoError(t, err)
	assert.Equal(t, []wire.ResourceType{
		{Type: "git", Image: "docker.io/concourse/git-resource:1.18.0"},
		{Type: "registry-image", Image: "docker.io/concourse/registry-image-resource:1.14.2"},
		{Type: "time", Image: "docker.io/concourse/time-resource:1.8.0", Version: "1.8.0", UniqueVersionHistory: true},
	}, types)
}

// TestConcourseExistingSecretKeys: the Secret's own key names are mapped
// to the files the flags name.
func TestConcourseExistingSecretKeys(t *testing.T) {
	o, _ := render(t, map[string]any{
		"auth": map[string]any{"noAuth": true},
		"concourse": map[string]any{"tsa": "[fd00::7]:2222", "existingSecret": "concourse-worker",
			"existingSecretKeys": map[string]any{"tsaPublicKey": "host-key-pub", "workerKey": "worker-key"}},
	})
	d, c := deployment(t, o, fullname)
	v := assertConcourseMount(t, d.Spec.Template.Spec, *c, "concourse-worker")
	assert.Equal(t, []corev1.KeyToPath{
		{Key: "host-key-pub", Path: "tsa_host_key.pub"},
		{Key: "worker-key", Path: "worker_key"},
	}, v.Items)
	f := flags(t, c.Args)
	assert.Equal(t, "[fd00::7]:2222", f["concourse-tsa"])
	assert.NotContains(t, f, "concourse-resource-types")
	assert.NotContains(t, f, "concourse-url", "no URL, no version check")
	cm := get[corev1.ConfigMap](t, o, "ConfigMap", fullname+"-config")
	assert.Equal(t, []string{"config.yaml"}, keys(cm.Data))
}

// TestConcourseInlineKeys: keys given as values go into a Secret the chart
// makes, and the worker key into nothing else: no ConfigMap, annotation,
// flag or note. A new key rolls the pods, which read it as they start.
func TestConcourseInlineKeys(t *testing.T) {
	tsaPub, workerKey := concourseKeys(t)
	values := func(workerKey string) map[string]any {
		return map[string]any{
			"auth":      map[string]any{"noAuth": true},
			"concourse": map[string]any{"tsa": "ci.example.com:2222", "tsaPublicKey": tsaPub, "workerKey": workerKey},
		}
	}
	o, r := render(t, values(workerKey))
	secret := fullname + "-concourse"
	s := get[corev1.Secret](t, o, "Secret", secret)
	assert.Equal(t, corev1.SecretTypeOpaque, s.Type)
	assert.Equal(t, map[string][]byte{"tsa_host_key.pub": []byte(tsaPub), "worker_key": []byte(workerKey)}, s.Data)

	d, c := deployment(t, o, fullname)
	v := assertConcourseMount(t, d.Spec.Template.Spec, *c, secret)
	assert.Equal(t, []corev1.KeyToPath{
		{Key: "tsa_host_key.pub", Path: "tsa_host_key.pub"},
		{Key: "worker_key", Path: "worker_key"},
	}, v.Items)
	assertOnlyIn(t, o, r, workerKey, "Secret/"+secret)

	_, otherKey := concourseKeys(t)
	o2, _ := render(t, values(otherKey))
	d2, _ := deployment(t, o2, fullname)
	assert.NotEqual(t, d.Spec.Template.Annotations["checksum/concourse"], d2.Spec.Template.Annotations["checksum/concourse"])
}

// TestConcourseRejectsBadValues: values that cannot join a Concourse fail
// the render, naming the value, and never quoting a key.
func TestConcourseRejectsBadValues(t *testing.T) {
	tsaPub, workerKey := concourseKeys(t)
	for _, tc := range []struct {
		name      string
		concourse map[string]any
		want      string
	}{
		{"web node networks with the TSA", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"webNodeNetworks": []any{"10.0.0.0/8"}}, "concourse.webNodeNetworks: only with the REST API"},
		{"a web node network that is none", map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "c"}, "webNodeNetworks": []any{"ci.example.com"}}, "/concourse/webNodeNetworks/0"},
		{"tsa without keys", map[string]any{"tsa": "ci.example.com:2222"},
			"concourse: concourse.tsa needs the TSA's host public key and a worker key: set concourse.existingSecret"},
		{"tsa without a port", map[string]any{"tsa": "ci.example.com", "existingSecret": "jetway-concourse"}, "/concourse/tsa"},
		{"keys without tsa", map[string]any{"existingSecret": "jetway-concourse", "resourceTypes": map[string]any{"git": "concourse/git-resource"}},
			"concourse: concourse.existingSecret, concourse.resourceTypes set, but concourse.tsa is empty"},
		{"a Secret and inline keys", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse", "workerKey": workerKey},
			"give concourse.existingSecret or concourse.tsaPublicKey and concourse.workerKey, not both"},
		{"no worker key", map[string]any{"tsa": "ci.example.com:2222", "tsaPublicKey": tsaPub},
			"concourse.workerKey: required with concourse.tsaPublicKey"},
		{"no TSA key", map[string]any{"tsa": "ci.example.com:2222", "workerKey": workerKey},
			"concourse.tsaPublicKey: required with concourse.workerKey"},
		{"a public worker key", map[string]any{"tsa": "ci.example.com:2222", "tsaPublicKey": tsaPub, "workerKey": tsaPub},
			"concourse.workerKey: not a private key"},
		{"a private TSA key", map[string]any{"tsa": "ci.example.com:2222", "tsaPublicKey": workerKey, "workerKey": workerKey},
			"concourse.tsaPublicKey: holds a private key"},
		{"a resource type without image", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"resourceTypes": map[string]any{"git": " "}}, "/concourse/resourceTypes/git"},
		{"a resource type name with a slash", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"resourceTypes": map[string]any{"concourse/git": "concourse/git-resource"}}, "concourse/git"},
		{"url without a scheme", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"url": "ci.example.com"}, "/concourse/url"},
		{"url of another scheme", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"url": "ftp://ci.example.com"}, "/concourse/url"},
		{"url with credentials", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"url": "https://admin:hunter2@ci.example.com"}, "/concourse/url"},
		{"url with a bad port", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"url": "https://ci.example.com:web"}, "/concourse/url"},
		{"the TSA with a client ID", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse", "clientId": "jetway"},
			"concourse: concourse.tsa, concourse.existingSecret (the TSA's) and concourse.clientId (the REST API's client) are both set"},
		{"the REST API with the TSA's keys", map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "jetway-concourse-client"}, "tsaPublicKey": tsaPub},
			"concourse: concourse.tsaPublicKey (the TSA's) and concourse.clientId, concourse.clientSecret.existingSecret (the REST API's client) are both set"},
		{"url and the TSA's Secret", map[string]any{"url": "https://ci.example.com", "existingSecret": "jetway-concourse"},
			"concourse: concourse.existingSecret set, but concourse.tsa is empty: those are the TSA's keys"},
		{"url without a client", map[string]any{"url": "https://ci.example.com", "clientSecret": map[string]any{"existingSecret": "jetway-concourse-client"}},
			"concourse.clientId: required with concourse.url and without concourse.tsa (the REST API)"},
		{"a client without its secret", map[string]any{"url": "https://ci.example.com", "clientId": "jetway"},
			"concourse.clientSecret.existingSecret: required with concourse.url and without concourse.tsa (the REST API): a Secret holding the client's secret under the key client_secret"},
		{"a client without url or secret, both named", map[string]any{"clientId": "jetway"},
			"concourse.url: required with concourse.clientId and concourse.clientSecret.existingSecret (the REST API): the web node's external URL, https://HOST[:PORT] (its --external-url); concourse.clientSecret.existingSecret: required"},
		{"resource types alone", map[string]any{"resourceTypes": map[string]any{"git": "concourse/git-resource"}},
			"concourse: concourse.resourceTypes set, but the targets join no Concourse"},
		{"a client ID with a colon", map[string]any{"url": "https://ci.example.com", "clientId": "jetway:secret",
			"clientSecret": map[string]any{"existingSecret": "jetway-concourse-client"}}, "/concourse/clientId"},
		{"a client secret key with a slash", map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "jetway-concourse-client", "key": "a/b"}}, "/concourse/clientSecret/key"},
		{"the REST API without web node networks", map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "c"}},
			"concourse.webNodeNetworks: required with the REST API: the CIDRs or IPs the web node calls the workers from, e.g. its pods' CIDR (its nodes', when it runs outside the cluster); the workers' Garden and volume listeners take no credential, so the gateway and the chart's NetworkPolicy admit only these to them (0.0.0.0/0 admits anyone who reaches the pods"},
		{"the REST API over http", map[string]any{"url": "http://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "c"}, "webNodeNetworks": []any{"10.42.0.0/16"}},
			"concourse.url: http:// with the REST API: the client secret, and the tokens it buys, would travel on it unencrypted; give the web node's https:// URL, or set concourse.insecure=true to allow it"},
		{"the REST API over http, nothing else", map[string]any{"url": "http://ci.example.com"},
			"concourse.url: http:// with the REST API: the client secret, and the tokens it buys, would travel on it unencrypted; give the web node's https:// URL, or set concourse.insecure=true to allow it (a network you trust alone); concourse.clientId: required"},
		{"insecure with the TSA", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"url": "http://ci.example.com", "insecure": true}, "concourse.insecure: only with the REST API (concourse.url, concourse.clientId and concourse.clientSecret.existingSecret, without concourse.tsa): nothing secret travels on concourse.url otherwise"},
		{"insecure alone", map[string]any{"insecure": true}, "concourse.insecure: only with the REST API"},
		{"web node peers with the TSA", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"webNodePeers": []any{map[string]any{"podSelector": map[string]any{}}}}, "concourse.webNodePeers: only with the REST API"},
		{"a web node peer that is none", map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "c"}, "webNodeNetworks": []any{"10.42.0.0/16"},
			"webNodePeers": []any{map[string]any{}}}, "/concourse/webNodePeers/0"},
		{"a web node peer with ports", map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
			"clientSecret": map[string]any{"existingSecret": "c"}, "webNodeNetworks": []any{"10.42.0.0/16"},
			"webNodePeers": []any{map[string]any{"ports": []any{}}}}, "additional properties 'ports' not allowed"},
		{"an unknown network policy value", map[string]any{"networkPolicy": map[string]any{"enable": false}},
			"additional properties 'enable' not allowed"},
		{"an unknown Secret key value", map[string]any{"tsa": "ci.example.com:2222", "existingSecret": "jetway-concourse",
			"existingSecretKeys": map[string]any{"hostKey": "x"}}, "additional properties 'hostKey' not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helm.Render(helm.Release{Name: release, Namespace: namespace,
				Values: map[string]any{"auth": map[string]any{"noAuth": true}, "concourse": tc.concourse}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			for _, key := range []string{tsaPub, workerKey} {
				assert.NotContains(t, err.Error(), keyBody(key))
			}
		})
	}
}

// assertConcourseMount checks the gateway's read-only mount of the
// Concourse keys (or the REST API client's secret) from secret: its files
// are those the flags name, and no other container mounts them; it
// returns the volume.
func assertConcourseMount(t *testing.T, pod corev1.PodSpec, gw corev1.Container, secret string) *corev1.SecretVolumeSource {
	t.Helper()
	m, ok := mounts(gw)["/etc/jetway/concourse"]
	require.True(t, ok, "no mount of the Concourse keys")
	assert.Equal(t, "concourse", m.Name)
	assert.True(t, m.ReadOnly)
	v := volume(t, pod, m.Name).Secret
	require.NotNil(t, v, "the keys come from a Secret")
	assert.Equal(t, secret, v.SecretName)
	assert.EqualValues(t, 0o440, *v.DefaultMode)
	assert.Nil(t, v.Optional, "no keys, nothing to register with: the pod waits for them")
	paths := map[string]bool{}
	for _, it := range v.Items {
		paths[path.Join(m.MountPath, it.Path)] = true
	}
	named := map[string]bool{}
	for flag, file := range flags(t, gw.Args) {
		if strings.HasPrefix(file, m.MountPath+"/") {
			assert.True(t, paths[file], "--%s %s is not a file of the mount", flag, file)
			named[file] = true
		}
	}
	assert.Equal(t, paths, named, "a file of the mount that no flag names")
	for _, ic := range pod.InitContainers {
		for _, im := range ic.VolumeMounts {
			assert.NotEqual(t, m.Name, im.Name, "init container %s mounts the Concourse keys", ic.Name)
		}
	}
	return v
}

// assertOnlyIn checks that key, as text, in base64 or by the first line
// of its PEM body, is in no rendered object but the one named only, nor
// in the notes.
func assertOnlyIn(t *testing.T, o objects, r *helm.Rendered, key, only string) {
	t.Helper()
	needles := []string{key, base64.StdEncoding.EncodeToString([]byte(key)), keyBody(key)}
	for _, k := range o.keys() {
		if k == only {
			continue
		}
		b, err := json.Marshal(o[k].Object)
		require.NoError(t, err)
		for _, n := range needles {
			assert.NotContains(t, string(b), n, "%s holds the key", k)
		}
	}
	for _, n := range needles {
		assert.NotContains(t, r.Notes, n, "the notes hold the key")
	}
}

// keyBody is the first line of a PEM key's base64 body, or the key type
// and start of an authorized_keys line: text only the key itself has.
func keyBody(key string) string {
	lines := strings.Split(key, "\n")
	if len(lines) > 1 && strings.HasPrefix(lines[0], "-----BEGIN") {
		return lines[1]
	}
	return lines[0]
}

// concourseKeys makes a TSA host public key and a worker key as `concourse
// generate-key -t ssh` writes them: authorized_keys form, and PKCS #1 RSA
// in a "PRIVATE KEY" block.
func concourseKeys(t *testing.T) (tsaPub, workerKey string) {
	t.Helper()
	_, host, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pub, err := ssh.NewPublicKey(host.Public())
	require.NoError(t, err)
	worker, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return string(ssh.MarshalAuthorizedKey(pub)),
		string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(worker)}))
}

// concourseFiles are the files of the gateway's Concourse mount v: the
// chart's Secret, or an existing one standing in as the chart's README
// makes it (kubectl create secret generic --from-file=tsa_host_key.pub
// --from-file=worker_key, or --from-file=client_secret=FILE for the
// REST API's client). A key the Secret lacks fails, as the kubelet fails
// the mount.
func concourseFiles(t *testing.T, o objects, v *corev1.SecretVolumeSource) map[string][]byte {
	t.Helper()
	require.NotNil(t, v)
	var data map[string][]byte
	if o["Secret/"+v.SecretName] != nil {
		data = get[corev1.Secret](t, o, "Secret", v.SecretName).Data
	} else {
		tsaPub, workerKey := concourseKeys(t)
		data = map[string][]byte{"tsa_host_key.pub": []byte(tsaPub), "worker_key": []byte(workerKey),
			"client_secret": []byte(rand.Text() + "\n")}
	}
	files := map[string][]byte{}
	for _, it := range v.Items {
		b, ok := data[it.Key]
		require.True(t, ok, "Secret %s has no key %s", v.SecretName, it.Key)
		files[it.Path] = b
	}
	return files
}

func keys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
