package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
)

// TestCheckCommand runs `gateway check` on a directory with one good and
// one under-privileged target on a real cluster: the operator's preflight.
func TestCheckCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	good, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "check-good", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	weak, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "check-weak", Rules: targets.RBACRules(targets.Required[:5])})
	require.NoError(t, err)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "good.kubeconfig"), good.Kubeconfig)

	bin := gatewayBinary(t)
	out, err := exec.CommandContext(ctx, bin, "check", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `good\s+check-good\s+`+c.Server+`\s+ok\s+-`, string(out))

	writeFile(t, filepath.Join(dir, "weak.kubeconfig"), weak.Kubeconfig)
	out, err = exec.CommandContext(ctx, bin, "check", dir).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Regexp(t, `weak\s+check-weak\s+\S+\s+UNUSABLE\s+missing permissions: patch pods, get pods/log, create pods/exec, get pods/exec, create pods/portforward, get pods/portforward, get configmaps, `, string(out))
	assert.Contains(t, string(out), "1 of 2 targets unusable")
	assert.NotContains(t, string(out), good.Token)
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// gatewayBinary builds the gateway once per test run, for CLI tests.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jetway-gateway-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "gateway")
		out, err := exec.Command("go", "build", "-o", builtBin, "github.com/jetway-ci/jetway/cmd/gateway").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return builtBin
}
