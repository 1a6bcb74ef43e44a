package concourse

import (
	"context"
	"fmt"
	"testing"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/targets"
)

// TestAgentsNotJoined: a worker whose agent has no session with this
// gateway is no agent's here.
func TestAgentsNotJoined(t *testing.T) {
	a := &Agents{Joined: func() []targets.Status { return []targets.Status{{Name: "box"}} }}
	assert.True(t, a.Has("box"))
	assert.False(t, a.Has("other"))
	var none *Agents
	assert.False(t, none.Has("box"))
}

// noTargets is a registry without cluster targets.
type noTargets struct{}

func (noTargets) Target(name string) (*targets.Target, error) {
	return nil, fmt.Errorf("target %s: %w", name, targets.ErrNotFound)
}

// TestContainersOnNeitherTargetNorAgent: a web node's container on a
// worker that is neither a cluster target nor an agent joined to this
// gateway (an agent joined to another one) is refused, naming it; on an
// agent joined here, a privileged one is refused, naming the agent, and a
// hermetic one (no NetOut rule, as the web node makes it) too.
func TestContainersOnNeitherTargetNorAgent(t *testing.T) {
	c := &Containers{Targets: noTargets{}, Agents: &Agents{Joined: func() []targets.Status { return []targets.Status{{Name: "box"}} }}}
	_, err := c.Create(context.Background(), "elsewhere", garden.ContainerSpec{Handle: "h1"})
	assert.EqualError(t, err, "worker elsewhere is neither a cluster target nor an agent joined to this gateway: jetway runs no container for it here")
	_, err = c.Create(context.Background(), "box", garden.ContainerSpec{Handle: "h1", Privileged: true})
	assert.ErrorContains(t, err, "worker box is an agent: it runs processes as its own user, never privileged")
	_, err = c.Create(context.Background(), "box", garden.ContainerSpec{Handle: "h1"})
	assert.ErrorContains(t, err, "worker box is an agent: it cannot cut a process off the network, as a hermetic step wants")
}
