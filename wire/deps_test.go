package wire

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wire is a leaf: it imports the standard library alone, so whatever
// imports it (the Go client above all) gets nothing of the gateway's
// dependencies. It runs the go command offline (GOPROXY=off).
func TestWireImportsOnlyTheStandardLibrary(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command must be on PATH")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const self = "github.com/jetway-ci/jetway/wire"
	cmd := exec.CommandContext(ctx, goCmd, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", self)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "go list -deps %s: %s", self, stderr)
	assert.Equal(t, []string{self}, strings.Fields(string(out)), "wire imports these beyond the standard library")
}
