package steps

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// TestBuildPod: a step's pod is named for its team and handle, labelled
// with its handle, type, team and owner, and carries none of what its
// process gets through the exec (environment, stdin).
func TestBuildPod(t *testing.T) {
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci"}}, "prod")
	require.NoError(t, err)
	req := validRequest()
	req.Team, req.Resources, req.Privileged = "main", wire.Resources{CPU: "500m", Memory: "1Gi"}, true
	req.Run.Env = map[string]string{"SECRET": "hunter2"}
	req.Stdin = "also secret"
	require.Nil(t, req.Validate())
	sum := summaryOf(req, false, time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	p := buildPod(&sum, "gw-a", tgt, Placed{Target: "east", Pod: steppod.Name("main", "build-1")}, steppod.Options{AgentImage: "reg/step-agent:1", Installation: "prod"})

	assert.Equal(t, steppod.Name("main", "build-1"), p.Name)
	assert.Equal(t, map[string]string{
		"org.concourse-ci.worker": "east", "jetway-ci.dev/installation": "prod", "jetway-ci.dev/step-type": "task",
		"jetway-ci.dev/team": "main", HandleLabel: "build-1", ownership.OwnerLabel: "gw-a"}, p.Labels)
	step := p.Spec.Containers[0]
	assert.Equal(t, "busybox", step.Image)
	assert.Equal(t, "500m", step.Resources.Limits.Cpu().String())
	assert.True(t, *step.SecurityContext.Privileged)
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "hunter2", "the environment reaches the pod only through exec")
	assert.NotContains(t, string(raw), "also secret")
}

// TestPrivilegeNeedsTheTargetsPolicy: a runner refuses to make the pod of
// a privileged step on a target whose target.yaml does not allow it,
// naming the key.
func TestPrivilegeNeedsTheTargetsPolicy(t *testing.T) {
	for _, tt := range []struct {
		name       string
		allow      bool
		privileged bool
		refused    bool
	}{
		{"privileged, not allowed", false, true, true},
		{"privileged, allowed", true, true, false},
		{"unprivileged, not allowed", false, false, false},
		{"unprivileged, allowed", true, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
				Meta: targets.Metadata{Namespace: "ci", Steps: targets.StepPolicy{AllowPrivileged: tt.allow}}}, "prod")
			require.NoError(t, err)
			err = privilegeRefused(&Summary{Privileged: tt.privileged}, tgt)
			if !tt.refused {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, "target east does not run privileged steps: its policy does not allow them (steps.allowPrivileged in its target.yaml)")
		})
	}
}
