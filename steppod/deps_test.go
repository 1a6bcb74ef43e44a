package steppod

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/internal/golist"
)

// The step pod is shared by the step engine, the Concourse containers and
// the agent through this package: none of them, nor this package, reaches
// into the engine (package steps) for it.
func TestThePodsUsersDoNotImportTheEngine(t *testing.T) {
	const engine = "github.com/jetway-ci/jetway/steps"
	for _, pkg := range []string{"steppod", "concourse", "agent"} {
		deps := golist.Deps(t, "github.com/jetway-ci/jetway/"+pkg, true)
		assert.False(t, slices.Contains(deps, engine), "%s depends on the step engine", pkg)
	}
}
