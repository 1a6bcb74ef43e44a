package client

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heavy are the module paths a program that embeds the client must not
// get: Kubernetes' client and its API machinery, Garden, yamux and
// Prometheus, all of which the gateway needs and the client does not.
var heavy = []string{"k8s.io/", "sigs.k8s.io/", "code.cloudfoundry.org/garden", "github.com/hashicorp/yamux", "github.com/prometheus/"}

// The client imports only wire of jetway's API types (and the tar
// extractor), so `go list -deps` of it names none of the gateway's heavy
// dependencies. It runs the go command offline (GOPROXY=off): the
// module's dependencies are in the module cache once it builds.
func TestClientBringsNoKubernetesGardenYamuxOrPrometheus(t *testing.T) {
	deps := goListDeps(t, "github.com/jetway-ci/jetway/client")
	var found []string
	for _, d := range deps {
		for _, h := range heavy {
			if strings.HasPrefix(d, h) {
				found = append(found, d)
			}
		}
	}
	if len(found) > 0 {
		t.Errorf("the client depends on %d such packages, %s among them: keep the API's types in wire",
			len(found), strings.Join(found[:min(len(found), 5)], ", "))
	}
	assert.True(t, slices.Contains(deps, "github.com/jetway-ci/jetway/wire"), "the client takes the API's types from wire")
}

// goListDeps lists the packages pkg depends on, itself included.
func goListDeps(t *testing.T, pkg string) []string {
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command must be on PATH")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, "list", "-deps", pkg)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "go list -deps %s: %s", pkg, stderr)
	return strings.Fields(string(out))
}
