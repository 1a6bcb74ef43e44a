package targets

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const secretToken = "s3cr3t-token-value-do-not-leak"

// kubeconfig renders a kubeconfig; user and cluster are YAML bodies.
func kubeconfig(cluster, user, extension string) string {
	if cluster == "" {
		cluster = "    server: https://127.0.0.1:6443\n"
	}
	if user == "" {
		user = "    token: " + secretToken + "\n"
	}
	ctx := "    cluster: c\n    user: u\n    namespace: ci\n"
	if extension != "" {
		ctx += "    extensions:\n    - name: jetway\n      extension:\n" + extension
	}
	return "apiVersion: v1\nkind: Config\ncurrent-context: x\n" +
		"clusters:\n- name: c\n  cluster:\n" + cluster +
		"users:\n- name: u\n  user:\n" + user +
		"contexts:\n- name: x\n  context:\n" + ctx
}

func TestParse(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "ca.crt"), []byte("ca"), 0o600))
	outside := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(outside, []byte("ca"), 0o600))

	tests := []struct {
		name     string
		entry    string // target name
		config   string
		yaml     string // target.yaml
		policy   Policy
		wantErr  []string
		sentinel error
		check    func(t *testing.T, c *Config)
	}{
		{name: "token", config: kubeconfig("", "", ""), check: func(t *testing.T, c *Config) {
			assert.Equal(t, "https://127.0.0.1:6443", c.Server)
			assert.Equal(t, "ci", c.Meta.Namespace, "namespace from the context")
			assert.Equal(t, "linux", c.Meta.Platform)
			assert.Equal(t, secretToken, c.REST.BearerToken)
		}},
		{name: "bad name", entry: "Bad_Name", config: kubeconfig("", "", ""),
			wantErr: []string{`name "Bad_Name" is not a DNS-1123 label`}, sentinel: ErrInvalidEntry},
		{name: "malformed yaml", config: "clusters: [\n  - {", wantErr: []string{"kubeconfig does not parse"}},
		{name: "missing context", config: strings.Replace(kubeconfig("", "", ""), "current-context: x", "current-context: nope", 1),
			wantErr: []string{`current-context "nope" does not exist`}},
		{name: "missing cluster", config: strings.Replace(kubeconfig("", "", ""), "    cluster: c\n    user", "    cluster: gone\n    user", 1),
			wantErr: []string{`names cluster "gone", which does not exist`}},
		{name: "exec refused", config: kubeconfig("", "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws-iam-authenticator\n", ""),
			wantErr: []string{`exec plugin "aws-iam-authenticator"`, "--allow-exec-plugins"}, sentinel: ErrRefused},
		{name: "exec allowed", config: kubeconfig("", "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws-iam-authenticator\n      interactiveMode: Never\n", ""),
			policy: Policy{AllowExecPlugins: true}},
		{name: "auth provider refused", config: kubeconfig("", "    auth-provider:\n      name: oidc\n", ""),
			wantErr: []string{`auth-provider "oidc"`, "--allow-auth-providers"}, sentinel: ErrRefused},
		{name: "insecure refused", config: kubeconfig("    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n", "", ""),
			wantErr: []string{"insecure-skip-tls-verify", "--allow-insecure-tls"}, sentinel: ErrRefused},
		{name: "insecure allowed", config: kubeconfig("    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n", "", ""),
			policy: Policy{AllowInsecureTLS: true}},
		{name: "file inside", config: kubeconfig("    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\n", "", ""),
			check: func(t *testing.T, c *Config) {
				real, _ := filepath.EvalSymlinks(filepath.Join(root, "ca.crt"))
				assert.Equal(t, real, c.REST.TLSClientConfig.CAFile, "relative paths resolve in the targets dir")
			}},
		{name: "file outside refused", config: kubeconfig("    server: https://127.0.0.1:6443\n    certificate-authority: "+outside+"\n", "", ""),
			wantErr: []string{"certificate-authority", "outside the targets directory", "--allow-external-files"}, sentinel: ErrRefused},
		{name: "escape by dotdot refused", config: kubeconfig("", "    tokenFile: ../../../etc/passwd\n", ""),
			wantErr: []string{"tokenFile", "outside the targets directory"}},
		{name: "file outside allowed", config: kubeconfig("    server: https://127.0.0.1:6443\n    certificate-authority: "+outside+"\n", "", ""),
			policy: Policy{AllowExternalFiles: true}},
		{name: "missing file", config: kubeconfig("", "    tokenFile: absent-token\n", ""),
			wantErr: []string{"tokenFile", "no such file"}},
		{name: "every refusal at once", config: kubeconfig("    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n",
			"    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: x\n", ""),
			wantErr: []string{"--allow-exec-plugins", "--allow-insecure-tls"}},
		{name: "target.yaml", config: kubeconfig("", "", ""),
			yaml: "team: main\ntags: [gpu, big]\nplatform: windows\nnamespace: builds\nnodeSelector: {pool: ci}\n" +
				"tolerations: [{key: ci, operator: Exists, effect: NoSchedule}]\nmaxActiveTasks: 4\n",
			check: func(t *testing.T, c *Config) {
				assert.Equal(t, Metadata{Team: "main", Tags: []string{"gpu", "big"}, Platform: "windows", Namespace: "builds",
					NodeSelector: map[string]string{"pool": "ci"}, MaxActiveTasks: 4,
					Tolerations: c.Meta.Tolerations}, c.Meta)
				require.Len(t, c.Meta.Tolerations, 1)
				assert.Equal(t, "ci", c.Meta.Tolerations[0].Key)
			}},
		{name: "extension", config: kubeconfig("", "", "        team: main\n        tags: [linux-big]\n"),
			check: func(t *testing.T, c *Config) {
				assert.Equal(t, "main", c.Meta.Team)
				assert.Equal(t, []string{"linux-big"}, c.Meta.Tags)
				assert.Equal(t, "ci", c.Meta.Namespace)
			}},
		{name: "target.yaml unknown key", config: kubeconfig("", "", ""), yaml: "teem: main\n",
			wantErr: []string{"target.yaml", `unknown field "teem"`}},
		{name: "extension unknown key", config: kubeconfig("", "", "        teams: main\n"),
			wantErr: []string{`context extension "jetway"`, `unknown field "teams"`}},
		{name: "bad metadata", config: kubeconfig("", "", ""), yaml: "namespace: Not_A_Label\ntags: [a, a, '']\nmaxActiveTasks: -1\n",
			wantErr: []string{`namespace "Not_A_Label"`, `tags[1] "a" is repeated`, "tags[2] is empty", "maxActiveTasks must not be negative"}},
		{name: "steps policy", config: kubeconfig("", "", ""),
			yaml: "steps:\n  allowPrivileged: true\n  volumeSizeLimit: 20Gi\n  ephemeralStorageRequest: 0\n" +
				"  defaultCPURequest: 250m\n  defaultMemoryRequest: 536870912\n  volumeHolder: {size: 50Gi}\n",
			check: func(t *testing.T, c *Config) {
				p := c.Meta.Steps
				assert.True(t, p.AllowPrivileged)
				assert.Equal(t, "50Gi", p.VolumeHolder.Size.String())
				assert.Equal(t, "20Gi", p.VolumeSizeLimit.String())
				require.NotNil(t, p.EphemeralStorageRequest, "0 is given: none on this target, not the gateway's")
				assert.True(t, p.EphemeralStorageRequest.IsZero())
				assert.Equal(t, "250m", p.DefaultCPURequest.String())
				assert.Equal(t, int64(512<<20), p.DefaultMemoryRequest.Value())
			}},
		{name: "concourse worker", config: kubeconfig("", "", ""),
			yaml: "concourse:\n  ephemeral: true\n  httpProxy: http://user:pw@proxy.corp:3128\n  httpsProxy: https://proxy.corp:3129\n" +
				"  noProxy: localhost,10.0.0.0/8,.svc\n  certs: ci-ca\n",
			check: func(t *testing.T, c *Config) {
				assert.Equal(t, ConcourseWorker{Ephemeral: true, HTTPProxy: "http://user:pw@proxy.corp:3128", HTTPSProxy: "https://proxy.corp:3129",
					NoProxy: "localhost,10.0.0.0/8,.svc", Certs: "ci-ca"}, c.Meta.Concourse)
			}},
		{name: "bad concourse worker", config: kubeconfig("", "", ""),
			yaml: "concourse:\n  httpProxy: socks5://user:s3cret@proxy.corp\n  httpsProxy: \"http://user:s3cret@[::1\"\n  noProxy: a, b\n  certs: CI_CA\n",
			wantErr: []string{`concourse.httpProxy "socks5://user:xxxxx@proxy.corp" is not an http:// or https:// URL with a host`,
				"concourse.httpsProxy is not a URL", "concourse.noProxy is a comma-separated list", `concourse.certs "CI_CA" is not a ConfigMap name`}},
		{name: "steps policy left out", config: kubeconfig("", "", ""), yaml: "team: main\n",
			check: func(t *testing.T, c *Config) {
				assert.Equal(t, StepPolicy{}, c.Meta.Steps, "the gateway's defaults, nothing privileged")
			}},
		{name: "bad steps policy", config: kubeconfig("", "", ""),
			yaml: "steps:\n  volumeSizeLimit: -1Gi\n  defaultCPURequest: -1\n  volumeHolder: {size: -1}\n",
			wantErr: []string{"steps.volumeSizeLimit must not be negative, got -1Gi", "steps.defaultCPURequest must not be negative",
				"steps.volumeHolder.size must not be negative"}},
		{name: "holder storage", config: kubeconfig("", "", ""), yaml: "steps:\n  volumeHolder: {storage: {class: fast-ssd, size: 50Gi}}\n",
			check: func(t *testing.T, c *Config) {
				h := c.Meta.Steps.VolumeHolder
				assert.Equal(t, "fast-ssd", h.StorageClass("standard"), "the target's class wins")
				assert.Equal(t, "50Gi", h.Storage.Size.String())
			}},
		{name: "holder storage: an emptyDir here", config: kubeconfig("", "", ""), yaml: "steps:\n  volumeHolder: {storage: {}}\n",
			check: func(t *testing.T, c *Config) {
				assert.Empty(t, c.Meta.Steps.VolumeHolder.StorageClass("standard"), "storage: {} is an emptyDir, whatever the gateway's")
			}},
		{name: "bad holder storage", config: kubeconfig("", "", ""), yaml: "steps:\n  volumeHolder: {storage: {class: Fast_SSD, size: 0}}\n",
			wantErr: []string{`steps.volumeHolder.storage.class "Fast_SSD" is not a StorageClass name`,
				"steps.volumeHolder.storage.size must be more than 0"}},
		{name: "holder images", config: kubeconfig("", "", ""), yaml: "steps:\n  volumeHolder: {images: NodePort}\n",
			check: func(t *testing.T, c *Config) { assert.Equal(t, ImagesNodePort, c.Meta.Steps.VolumeHolder.Images) }},
		{name: "bad holder images", config: kubeconfig("", "", ""), yaml: "steps:\n  volumeHolder: {images: LoadBalancer}\n",
			wantErr: []string{`steps.volumeHolder.images is "LoadBalancer": it is "NodePort"`}},
		{name: "steps policy unknown key", config: kubeconfig("", "", ""), yaml: "steps:\n  privileged: true\n",
			wantErr: []string{"target.yaml", `unknown field "privileged"`}},
		{name: "steps policy not a quantity", config: kubeconfig("", "", ""), yaml: "steps:\n  volumeSizeLimit: lots\n",
			wantErr: []string{"target.yaml", "quantities must match"}},
		{name: "default namespace", config: strings.Replace(kubeconfig("", "", ""), "    namespace: ci\n", "", 1),
			check: func(t *testing.T, c *Config) { assert.Equal(t, "default", c.Meta.Namespace) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := entry{name: "target-1", dir: root, kubeconfig: []byte(tt.config)}
			if tt.entry != "" {
				e.name = tt.entry
			}
			if tt.yaml != "" {
				e.targetYAML = []byte(tt.yaml)
			}
			c, err := parse(e, root, tt.policy)
			if len(tt.wantErr) > 0 {
				require.Error(t, err)
				for _, w := range tt.wantErr {
					assert.Contains(t, err.Error(), w)
				}
				assert.NotContains(t, err.Error(), secretToken, "errors never quote credentials")
				assert.NotContains(t, err.Error(), "s3cret", "errors never quote a proxy's credentials")
				assert.True(t, errors.Is(err, ErrInvalidEntry) || errors.Is(err, ErrRefused), "sentinel: %v", err)
				if tt.sentinel != nil {
					assert.ErrorIs(t, err, tt.sentinel)
				}
				return
			}
			require.NoError(t, err)
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestParseHashTellsChanges(t *testing.T) {
	root := t.TempDir()
	parseOK := func(cfg, yaml string) *Config {
		e := entry{name: "a", dir: root, kubeconfig: []byte(cfg)}
		if yaml != "" {
			e.targetYAML = []byte(yaml)
		}
		c, err := parse(e, root, Policy{})
		require.NoError(t, err)
		return c
	}
	base := parseOK(kubeconfig("", "", ""), "")
	assert.Equal(t, base.hash, parseOK(kubeconfig("", "", ""), "").hash)
	assert.NotEqual(t, base.hash, parseOK(kubeconfig("", "    token: rotated\n", ""), "").hash)
	assert.NotEqual(t, base.hash, parseOK(kubeconfig("", "", ""), "team: main\n").hash)
}

// TestParseKubeconfig reads a self-contained kubeconfig, metadata from its
// extension, as the entry NAME.kubeconfig; one naming a file is refused,
// as there is no directory for it.
func TestParseKubeconfig(t *testing.T) {
	cfg, err := ParseKubeconfig("prod", []byte(kubeconfig("", "", "        team: main\n        tags: [gpu]\n")), Policy{})
	require.NoError(t, err)
	assert.Equal(t, "prod", cfg.Name)
	assert.Equal(t, Metadata{Team: "main", Tags: []string{"gpu"}, Platform: DefaultPlatform, Namespace: "ci"}, cfg.Meta)

	_, err = ParseKubeconfig("prod", []byte(kubeconfig("    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\n", "", "")), Policy{})
	assert.ErrorIs(t, err, ErrRefused)
	_, err = ParseKubeconfig("Prod_1", []byte(kubeconfig("", "", "")), Policy{})
	assert.ErrorContains(t, err, `name "Prod_1" is not a DNS-1123 label`)
}
