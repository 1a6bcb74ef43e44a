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
// starts and stops cleanly; an empty secret file is a configuration error
// naming its key, before anything starts.
func TestConcourseRESTSettings(t *testing.T) {
	dir := t.TempDir()
	secret, empty := filepath.Join(dir, "secret"), filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(secret, []byte("top-s3cret\n"), 0o600))
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	rest := func(file string) []string {
		return []string{"--concourse-url", "http://127.0.0.1:1", "--concourse-client-id", "jetway",
			"--concourse-client-secret-file", file, "--concourse-worker-address", "127.0.0.1"}
	}

	args := append([]string{"run", "--listen", "127.0.0.1:0", "--targets-dir", t.TempDir(), "--no-auth"}, rest(empty)...)
	out, err := exec.Command(gatewayBin, args...).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output: %s", out)
	assert.Equal(t, 2, exit.ExitCode(), "output: %s", out)
	assert.Contains(t, string(out), "concourse-client-secret-file: "+empty+" is empty")
	assert.NotContains(t, string(out), "serving http", "nothing may start")

	g := startGateway(t, rest(secret)...)
	require.NoError(t, g.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, g.wait(t, 10*time.Second), "a graceful stop exits 0")
}
