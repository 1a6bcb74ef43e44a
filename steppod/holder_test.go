package steppod

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// TestHolderSidecarKnowsItsCapacity: the volume holder's sidecar
// gets its emptyDir's size limit (the gateway's volume-holder-size, or
// the target's steps.volumeHolder.size), its own setting and not a
// step's, as its capacity, so that it refuses a write past it rather
// than be evicted; without a size limit, none. A step pod's sidecar gets
// none: its step writes the emptyDir too. The holder's sidecar, which
// alone writes its volumes, makes cow volumes of hard links; a step
// pod's does not.
func TestHolderSidecarKnowsItsCapacity(t *testing.T) {
	key, err := ownership.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	defaults := Defaults{VolumeSizeLimit: resource.MustParse("10Gi"), HolderSize: resource.MustParse("20Gi")}
	for _, tt := range []struct {
		name     string
		policy   targets.StepPolicy
		defaults Defaults
		want     string // "": no capacity
	}{
		{name: "the gateway's", defaults: defaults, want: "21474836480"},
		{name: "the target's", defaults: defaults, policy: targets.StepPolicy{VolumeHolder: targets.VolumeHolderPolicy{Size: quantity("16Mi")}},
			want: "16777216"},
		{name: "not a step's", defaults: defaults, policy: targets.StepPolicy{VolumeSizeLimit: quantity("16Mi")}, want: "21474836480"},
		{name: "none", defaults: defaults, policy: targets.StepPolicy{VolumeHolder: targets.VolumeHolderPolicy{Size: quantity("0")}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
				Meta: targets.Metadata{Namespace: "ci", Steps: tt.policy}}, "prod")
			require.NoError(t, err)
			p := HolderPod(tgt, Options{AgentImage: "reg/step-agent:1", Installation: "prod", Steps: tt.defaults, Key: key})
			cmd := strings.Join(p.Spec.Containers[0].Command, " ")
			assert.Contains(t, cmd, " --link-copies")
			if tt.want == "" {
				assert.Nil(t, p.Spec.Volumes[0].EmptyDir.SizeLimit)
				assert.NotContains(t, cmd, "--capacity")
				return
			}
			assert.Equal(t, tt.want, strconv.FormatInt(p.Spec.Volumes[0].EmptyDir.SizeLimit.Value(), 10), "the emptyDir's size limit")
			assert.True(t, strings.HasSuffix(cmd, "--capacity "+tt.want), cmd)
		})
	}
	step := podOn(t, targets.StepPolicy{}, defaults, wire.Resources{}, false)
	assert.NotContains(t, strings.Join(step.Spec.Containers[1].Command, " "), "--capacity")
	assert.NotContains(t, strings.Join(step.Spec.Containers[1].Command, " "), "--link-copies")
}
