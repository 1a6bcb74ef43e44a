package main

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/mesh"
)

// TestMeshIssue runs `gateway mesh issue` as the chart's init container
// does, with the CA Secret's files, and loads what it wrote as `gateway
// run --mesh-ca --mesh-cert --mesh-key` does.
func TestMeshIssue(t *testing.T) {
	caDir := t.TempDir()
	caCert, caKey := meshtest.NewCA(t, "jetway-mesh-ca").Write(t, caDir) // valid for an hour
	otherCert, _ := meshtest.NewCA(t, "other-ca").Write(t, t.TempDir())
	keyPEM, err := os.ReadFile(caKey)
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "mesh")
	issue := func(args ...string) []string {
		return append([]string{"mesh", "issue", "--ca-cert", caCert, "--ca-key", caKey, "--out", out}, args...)
	}

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string // a prefix
		stderr string
	}{
		{name: "issued, cut at the CA's end", code: 0,
			args:   issue("--name", "jetway-0", "--dns", "jetway-0", "--dns", "jetway-mesh.ci.svc"),
			stdout: `issued gateway certificate "jetway-0" (serial `,
			stderr: "gateway: mesh issue: the certificate is valid until "},
		{name: "an agent's", code: 0, args: issue("--name", "mac-mini-1", "--agent", "--team", "ios", "--tag", "mac", "--valid-for", "30m"),
			stdout: `issued agent (team ios, tags mac) certificate "mac-mini-1" (serial `},
		{name: "a global agent's", code: 0, args: issue("--name", "mac-mini-2", "--agent", "--global", "--valid-for", "30m"),
			stdout: `issued agent (every team (global), no tags) certificate "mac-mini-2" (serial `},
		{name: "an agent's of no team", code: 2, args: issue("--name", "mac-mini-3", "--agent"),
			stderr: "gateway: mesh: invalid certificate request: team: an agent's certificate names the one team whose steps it runs (--team TEAM), or --global for an agent of every team\n"},
		{name: "a gateway's with a team", code: 2, args: issue("--name", "jetway-2", "--team", "main"),
			stderr: "gateway: mesh: invalid certificate request: agent: --team, --global and --tag are an agent's: add --agent\n"},
		{name: "issued for a shorter time", code: 0, args: issue("--name", "jetway-1", "--valid-for", "30m"),
			stdout: `issued gateway certificate "jetway-1" (serial `},
		{name: "nothing given", code: 2, args: []string{"mesh", "issue"},
			stderr: "gateway: mesh: invalid certificate request: ca-cert: required; ca-key: required; out: required; name: required\n"},
		{name: "a bad name", code: 2, args: issue("--name", "Jetway_0"),
			stderr: `gateway: mesh: invalid certificate request: name: "Jetway_0": a lowercase RFC 1123 subdomain`},
		{name: "another CA's key", code: 1, args: []string{"mesh", "issue", "--ca-cert", otherCert, "--ca-key", caKey, "--out", out, "--name", "x"},
			stderr: "gateway: mesh: CA key " + caKey + " does not match CA certificate " + otherCert + "\n"},
		{name: "the key as certificate", code: 1, args: []string{"mesh", "issue", "--ca-cert", caKey, "--ca-key", caKey, "--out", out, "--name", "x"},
			stderr: "gateway: mesh: CA certificate " + caKey + " holds no PEM certificate\n"},
		{name: "a stray argument", code: 2, args: issue("--name", "x", "extra"),
			stderr: `gateway: unknown command "extra" for "gateway mesh issue"` + "\n"},
		{name: "an unknown mesh command", code: 2, args: []string{"mesh", "isue"},
			stderr: `gateway: unknown command "isue"; see gateway mesh --help` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			require.Equal(t, tt.code, execute(tt.args, &stdout, &stderr), "stderr: %s", stderr.String())
			assert.True(t, bytes.HasPrefix(stdout.Bytes(), []byte(tt.stdout)), "stdout %q, want it to start %q", stdout.String(), tt.stdout)
			if tt.stderr == "" {
				assert.Empty(t, stderr.String())
			} else {
				assert.True(t, bytes.HasPrefix(stderr.Bytes(), []byte(tt.stderr)), "stderr %q, want it to start %q", stderr.String(), tt.stderr)
			}
			assert.NotContains(t, stdout.String()+stderr.String(), string(keyPEM[40:80]), "no key material")
		})
	}

	// The last certificate issued into out is the one gateway run loads.
	id, err := mesh.LoadIdentity(filepath.Join(out, "ca.crt"), filepath.Join(out, "tls.crt"), filepath.Join(out, "tls.key"))
	require.NoError(t, err)
	assert.Equal(t, "jetway-1", id.Name())
	assert.Equal(t, mesh.KindGateway, id.Kind(), "issued without --agent after an agent's")
	id.Observe(func(leaf *x509.Certificate, _ error) {
		assert.WithinDuration(t, time.Now().Add(30*time.Minute), leaf.NotAfter, time.Minute)
	})
}

// An agent's --team and --tag, if given, must say what its certificate
// does: gateways take it for what the certificate says.
func TestAgentFlagsMustMatchItsCertificate(t *testing.T) {
	team := mesh.AgentScope{Team: "main", Tags: []string{"ios", "mac"}}
	global := mesh.AgentScope{Global: true}
	for name, tt := range map[string]struct {
		f     agentFlags
		scope mesh.AgentScope
		err   string
	}{
		"no flags":                    {agentFlags{}, team, ""},
		"the same, tags in any order": {agentFlags{team: "main", teamGiven: true, tags: []string{"mac", "ios"}, tagsGiven: true}, team, ""},
		"every team, global":          {agentFlags{teamGiven: true}, global, ""},
		"every team, a team's":        {agentFlags{teamGiven: true, cert: "a.crt"}, team, `team: "" (every team) but the certificate a.crt makes this agent one of team main, tags ios,mac: drop --team, or issue the certificate again`},
		"another team":                {agentFlags{team: "other", teamGiven: true, cert: "a.crt"}, team, `team: "other" but the certificate a.crt makes this agent one of team main`},
		"a team, global":              {agentFlags{team: "main", teamGiven: true, cert: "a.crt"}, global, `team: "main" but the certificate a.crt makes this agent one of every team (global)`},
		"other tags":                  {agentFlags{tags: []string{"linux"}, tagsGiven: true, cert: "a.crt"}, team, "tag: linux but the certificate a.crt makes this agent one of team main, tags ios,mac"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tt.f.matches(tt.scope)
			if tt.err == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.err)
		})
	}
}
