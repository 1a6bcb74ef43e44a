package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// TestDemo runs what `make demo` runs, with --once, end to end on clusters
// of its own: it exits 0 after the story, whose facts are in its output
// (both workers running; the step on cluster B printed what the step on
// cluster A wrote, streamed in from A), and no process of its clusters or
// its gateway survives it.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	demo := filepath.Join(t.TempDir(), "jetway-demo")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", demo, "github.com/jetway-ci/jetway/integration/cmd/jetway-demo").CombinedOutput()
	require.NoError(t, err, "build jetway-demo: %s", out)
	agent, cleanup, err := buildStepAgent()
	require.NoError(t, err)
	t.Cleanup(cleanup)
	clustersDir, dir := demoClustersDir(t), t.TempDir()

	cmd := exec.CommandContext(ctx, demo, "--once", "--gateway", gatewayBinary(t), "--step-agent", agent,
		"--dir", dir, "--listen", freeAddr(t))
	cmd.Env = append(os.Environ(), cluster.EnvWorkDir+"="+clustersDir)
	// Past the deadline, Ctrl-C: the demo tears down what it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = time.Minute
	out, err = cmd.CombinedOutput()
	story := string(out)
	require.NoError(t, err, story)

	// Each target was added as an operator adds one, and checked.
	for _, name := range []string{"ci-a", "ci-b"} {
		assert.Regexp(t, `\$ \S+ target add `+name+` --kubeconfig <cluster-. admin> --namespace ci --create-namespace --tag cluster-. --out `, story)
		assert.Regexp(t, `(?m)^\s+`+name+`\s+ci\s+https://127.0.0.1:\d+\s+ok\s+-$`, story, "gateway target add checked it")
	}
	for _, worker := range []string{`ci-a\s+0\s+linux\s+cluster-a`, `ci-b\s+0\s+linux\s+cluster-b`} {
		assert.Regexp(t, `(?m)^\s+`+worker+`\s+none\s+running\s`, story, "the workers table lists it running")
	}
	wrote := regexp.MustCompile(`placed on ci-a \(cluster-a\), pod write-greeting-\S+\n\s+\| (hello from cluster-a, written at \d\d:\d\d:\d\d)\n\s+exited 0\n`).
		FindStringSubmatch(story)
	read := regexp.MustCompile(`placed on ci-b \(cluster-b\), pod read-greeting-\S+\n\s+input greeting: [1-9]\d* bytes \(sha256 [0-9a-f]{12}…\) streamed in from write-greeting's pod on cluster-a, through the gateway\n\s+\| (.*)\n\s+exited 0\n`).
		FindStringSubmatch(story)
	require.Len(t, wrote, 2, "the step on cluster A and what it wrote:\n%s", story)
	require.Len(t, read, 2, "the step on cluster B, its input and what it printed:\n%s", story)
	assert.Equal(t, wrote[1], read[1], "B printed the file A wrote")
	assert.Contains(t, story, "5. Try next")
	assert.Contains(t, story, "Done (--once); tearing down.")

	// Nothing it started is left: the control planes (named by their
	// folder) nor the gateway (by its targets folder). Only its own: a
	// real node's bridge left by a killed run on this machine is the next
	// real node's to clean up, not the demo's.
	for _, d := range []string{clustersDir, dir} {
		check := exec.Command("bash", "leftovers.sh", "--own")
		check.Env = append(os.Environ(), cluster.EnvWorkDir+"="+d)
		out, err := check.CombinedOutput()
		assert.NoError(t, err, "processes of %s left behind: %s", d, out)
	}
}

// demoClustersDir is where the demo's clusters keep their files: a folder
// of its own under the run's clusters folder, if the run has one, so that
// integration/leftovers.sh sees them too.
func demoClustersDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv(cluster.EnvWorkDir)
	if root == "" {
		return t.TempDir()
	}
	require.NoError(t, os.MkdirAll(root, 0o755))
	dir, err := os.MkdirTemp(root, "demo-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// freeAddr is a loopback address no one listened on a moment ago, below
// the ephemeral ports (cluster.FreeAddr): a server restarted on it finds
// it free.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := cluster.FreeAddr()
	require.NoError(t, err)
	return addr
}
