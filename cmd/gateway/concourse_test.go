package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcourseRESTSettings: gateway run with the REST API's settings
// starts and stops cleanly; an empty secret file, no web node networks
// (the workers' listeners would take anyone) and an http:// URL without
// concourse-insecure are configuration errors naming their keys, before
// anything starts.
func TestConcourseRESTSettings(t *testing.T) {
	dir := t.TempDir()
	secret, empty := filepath.Join(dir, "secret"), filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(secret, []byte("top-s3cret\n"), 0o600))
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	rest := func(file string, more ...string) []string {
		return append([]string{"--concourse-url", "http://127.0.0.1:1", "--concourse-client-id", "jetway",
			"--concourse-client-secret-file", file, "--concourse-worker-address", "127.0.0.1"}, more...)
	}
	safe := []string{"--concourse-insecure", "--concourse-web-node-networks", "127.0.0.1"}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{rest(empty, safe...), "concourse-client-secret-file: " + empty + " is empty"},
		{rest(secret, "--concourse-insecure"), "concourse-web-node-networks: required with concourse-url"},
		{rest(secret, "--concourse-web-node-networks", "127.0.0.1"), `concourse-url: "http://127.0.0.1:1" is http://`},
	} {
		args := append([]string{"run", "--listen", "127.0.0.1:0", "--targets-dir", t.TempDir(), "--no-auth"}, tt.args...)
		out, err := exec.Command(gatewayBin, args...).CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "output: %s", out)
		assert.Equal(t, 2, exit.ExitCode(), "output: %s", out)
		assert.Contains(t, string(out), tt.want)
		assert.NotContains(t, string(out), "serving http", "nothing may start")
		assert.NotContains(t, string(out), "top-s3cret")
	}

	g := startGateway(t, rest(secret, safe...)...)
	require.NoError(t, g.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, g.wait(t, 10*time.Second), "a graceful stop exits 0")
}
