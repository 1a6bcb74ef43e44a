package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

func TestBadTokensFileExitsTwo(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	require.NoError(t, os.WriteFile(tokens, []byte("tokens:\n- {name: ops, token: tiny-secret, admin: true}\n"), 0o600))
	out, err := exec.Command(gatewayBin, "run", "--targets-dir", dir, "--auth-tokens-file", tokens, "--listen", "127.0.0.1:0").CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 2, exit.ExitCode())
	assert.Contains(t, string(out), "auth-tokens-file:")
	assert.Contains(t, string(out), "token must have at least 16 characters")
	assert.NotContains(t, string(out), "tiny-secret")
}

func TestPrintWorkers(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var b bytes.Buffer
	printWorkers(&b, []wire.Worker{
		{Name: "a", Platform: "linux", State: "running", Version: "2.5", StartTime: now.Add(-90 * time.Minute).Unix()},
		{Name: "b", Platform: "linux", State: "stalled", Version: "2.5", Team: "main", Tags: []string{"gpu", "big"}},
	}, now)
	assert.Equal(t, `name  containers  platform  tags  team  state    version  age
a     0           linux     none  none  running  2.5      1h30m

the following workers have not checked in recently:

name  containers  platform  tags      team  state    version  age
b     0           linux     gpu, big  main  stalled  2.5      n/a
`, b.String())
}

func TestCheckReportsEveryEntry(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.kubeconfig"), []byte("clusters: [\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "exec"), []byte(`apiVersion: v1
kind: Config
current-context: x
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: get-token}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
`), 0o600))
	out, err := exec.Command(gatewayBin, "check", dir).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Regexp(t, `broken\s+-\s+-\s+UNUSABLE\s+invalid target: kubeconfig does not parse`, string(out))
	assert.Regexp(t, `exec\s+-\s+-\s+UNUSABLE\s+refused by credential policy: user "u" uses exec plugin "get-token" \(allow with --allow-exec-plugins\)`, string(out))
	assert.Contains(t, string(out), "2 of 2 targets unusable")
}

func TestWorkersAgainstRunningGateway(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	require.NoError(t, os.WriteFile(tokens, []byte("tokens:\n- {name: ops, token: ops-token-0123456789, admin: true}\n"), 0o600))
	targetsDir := filepath.Join(dir, "targets")
	require.NoError(t, os.Mkdir(targetsDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(targetsDir, "broken"), []byte("not: [a kubeconfig"), 0o600))
	cmd := exec.Command(gatewayBin, "run", "--listen", "127.0.0.1:0", "--targets-dir", targetsDir, "--auth-tokens-file", tokens)
	g := attach(t, cmd)

	out, err := exec.Command(gatewayBin, "workers", "--url", g.base, "--token", "ops-token-0123456789").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "the following workers have not checked in recently:")
	// An entry that never parsed has no platform to report.
	assert.Regexp(t, `broken\s+0\s+none\s+none\s+stalled\s+2\.5`, string(out))

	env := exec.Command(gatewayBin, "workers", "--json")
	env.Env = append(os.Environ(), "JETWAY_URL="+g.base, "JETWAY_TOKEN=ops-token-0123456789")
	out, err = env.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var ws []wire.Worker
	require.NoError(t, json.Unmarshal(out, &ws))
	require.Len(t, ws, 1)
	assert.Equal(t, "broken", ws[0].Name)

	out, err = exec.Command(gatewayBin, "workers", "--url", g.base, "--token", "wrong-token-0123456789").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "401 Unauthorized")

	out, err = exec.Command(gatewayBin, "land", "nope", "--url", g.base, "--token", "ops-token-0123456789").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "PUT /api/v1/workers/nope/land: 404 Not Found")

	// A stalled (here: invalid) worker can be pruned; it is then forgotten.
	out, err = exec.Command(gatewayBin, "prune", "broken", "--url", g.base, "--token", "ops-token-0123456789").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "pruned 'broken' (its cluster did not answer: only this gateway replica forgets it, until it answers again)\n",
		string(out), "an invalid entry has no cluster to record the prune in")
	out, err = exec.Command(gatewayBin, "workers", "--json", "--url", g.base, "--token", "ops-token-0123456789").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.JSONEq(t, "[]", string(out))

	out, err = exec.Command(gatewayBin, "land").CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 2, exit.ExitCode(), "%s", out)

	// The tokens rotate without a restart: the old one stops working
	// within 2 s of the file's change, the new one works.
	require.NoError(t, os.WriteFile(tokens, []byte("tokens:\n- {name: ops, token: new-ops-token-0123456789, admin: true}\n"), 0o600))
	changed := time.Now()
	status := func(token string) int {
		req, err := http.NewRequest(http.MethodGet, g.base+"/api/v1/workers", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return status("ops-token-0123456789") == http.StatusUnauthorized }, 3*time.Second, 20*time.Millisecond)
	assert.Less(t, time.Since(changed), 2*time.Second+200*time.Millisecond, "the old token stopped working within 2 s")
	assert.Equal(t, http.StatusOK, status("new-ops-token-0123456789"))
}

// TestAgentRefusesBadExtractLimits: the agent's extract limits are checked
// with its other flags, each problem named.
func TestAgentRefusesBadExtractLimits(t *testing.T) {
	out, err := exec.Command(gatewayBin, "agent", "--extract-max-bytes", "lots", "--extract-max-entries", "0").CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 2, exit.ExitCode())
	assert.Contains(t, string(out), `extract-max-bytes: "lots": want a positive size like 32Gi or 1073741824`)
	assert.Contains(t, string(out), "extract-max-entries: must be positive, got 0")
}
