package concourse

import (
	"strings"
	"testing"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/wire"
)

func TestRequestCredentialReadsTheSourceAndVersion(t *testing.T) {
	cred, ok := requestCredential([]byte(`{"source":{"repository":"registry.example/team/app","tag":"1","username":"u","password":"p"},` +
		`"version":{"digest":"sha256:abc"},"params":{"skip_download":true}}`))
	assert.True(t, ok)
	assert.Equal(t, pullCredential{Repository: "registry.example/team/app", Digest: "sha256:abc", Username: "u", Password: "p"}, cred)

	for _, stdin := range []string{
		`{"source":{"repository":"busybox"}}`,          // no credentials
		`{"source":{"username":"u","password":"p"}}`,   // no repository
		`{"source":{"repository":"r","password":"p"}}`, // no username
		`not json`, // not a request
		`{"source":{"repository":["r"],"username":"u"}}`, // not a source
	} {
		_, ok := requestCredential([]byte(stdin))
		assert.False(t, ok, stdin)
	}
}

func TestPullSecretNamesTheRegistryAsTheKubeletMatchesIt(t *testing.T) {
	for repo, host := range map[string]string{
		"registry.example/team/app": "registry.example",
		"localhost:5000/app":        "localhost:5000",
		"localhost/app":             "localhost",
		"10.0.0.1:5000/app":         "10.0.0.1:5000",
		"library/busybox":           "https://index.docker.io/v1/",
		"busybox":                   "https://index.docker.io/v1/",
	} {
		assert.Equal(t, host, registryHost(repo), repo)
	}
	got := string(dockerConfigJSON(pullCredential{Repository: "registry.example/app", Username: "u", Password: "p:w"}))
	assert.JSONEq(t, `{"auths":{"registry.example":{"username":"u","password":"p:w","auth":"dTpwOnc="}}}`, got)
}

func TestStdinTapKeepsABoundedPrefix(t *testing.T) {
	var tap stdinTap
	tap.write([]byte(`{"source":`))
	tap.write([]byte(`{}}`))
	assert.Equal(t, `{"source":{}}`, string(tap.bytes()))
	tap.write([]byte(strings.Repeat("x", maxTappedStdin)))
	assert.Nil(t, tap.bytes(), "past its bound it keeps nothing: a cut request is no request")
	tap.write([]byte("y"))
	assert.Nil(t, tap.bytes())
}

func TestCredentialsAreTappedOnlyFromARegistryTypesIn(t *testing.T) {
	c := &Containers{ResourceTypes: []wire.ResourceType{{Type: "registry-image", Image: "reg@sha256:1"}, {Type: "git", Image: "git@sha256:2"}}}
	ct := &Container{Image: "reg@sha256:1"}
	ct.Spec.BindMounts = append(ct.Spec.BindMounts, scratchMount(), getMount())
	tap, vol := c.credentialTap(ct, processSpec{Path: "/opt/resource/in", Args: []string{"/tmp/build/get/"}})
	assert.NotNil(t, tap)
	assert.Equal(t, mountVolume(1), vol, "the mount its first argument names")

	for _, tc := range []struct {
		name  string
		image string
		agent bool
		spec  processSpec
	}{
		{"a check", "reg@sha256:1", false, processSpec{Path: "/opt/resource/check"}},
		{"a put", "reg@sha256:1", false, processSpec{Path: "/opt/resource/out", Args: []string{"/tmp/build/put"}}},
		{"another type", "git@sha256:2", false, processSpec{Path: "/opt/resource/in", Args: []string{"/tmp/build/get"}}},
		{"no such mount", "reg@sha256:1", false, processSpec{Path: "/opt/resource/in", Args: []string{"/elsewhere"}}},
		{"an agent's", "reg@sha256:1", true, processSpec{Path: "/opt/resource/in", Args: []string{"/tmp/build/get"}}},
	} {
		ct := &Container{Image: tc.image, Agent: tc.agent}
		ct.Spec.BindMounts = append(ct.Spec.BindMounts, scratchMount(), getMount())
		tap, _ := c.credentialTap(ct, tc.spec)
		assert.Nil(t, tap, tc.name)
	}
}

func scratchMount() garden.BindMount {
	return garden.BindMount{SrcPath: "/vols/w/scratch", DstPath: "/scratch"}
}

func getMount() garden.BindMount {
	return garden.BindMount{SrcPath: "/vols/w/out", DstPath: "/tmp/build/get"}
}
