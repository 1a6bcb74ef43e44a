package steppod

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
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
			p, err := HolderPod(tgt, Options{AgentImage: "reg/step-agent:1", Installation: "prod", Steps: tt.defaults, Key: key}, nil)
			require.NoError(t, err)
			cmd := strings.Join(p.Spec.Containers[0].Command, " ")
			assert.Contains(t, cmd, " --link-copies")
			assert.Contains(t, cmd, " --images-listen :7789", "it serves images on a port of their own")
			assert.Contains(t, p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: HolderImagePort, ContainerPort: 7789})
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
	assert.NotContains(t, strings.Join(step.Spec.Containers[1].Command, " "), "--images-listen", "a step pod serves no image")
}

// TestHolderOnAClaim: a target whose volume holder keeps its volumes on a
// claim (steps.volumeHolder.storage, or the gateway's
// volume-holder-storage-class) gets a ReadWriteOnce claim of that class,
// sized storage.size, else the holder's size, labelled and sealed as the
// holder; the holder pod mounts it instead of an emptyDir, and its
// sidecar's capacity is the claim's size as made (a claim made before a
// change of the setting keeps its own), said to be a claim's. A target
// with storage: {} keeps an emptyDir whatever the gateway's class.
func TestHolderOnAClaim(t *testing.T) {
	key, err := ownership.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	for _, tt := range []struct {
		name      string
		policy    targets.StepPolicy
		gateway   string // the gateway's class
		wantClass string // "": an emptyDir
		wantSize  string
	}{
		{name: "the target's class and size", policy: targets.StepPolicy{VolumeHolder: targets.VolumeHolderPolicy{
			Storage: &targets.HolderStorage{Class: "fast", Size: quantity("5Gi")}}}, wantClass: "fast", wantSize: "5Gi"},
		{name: "the holder's size", policy: targets.StepPolicy{VolumeHolder: targets.VolumeHolderPolicy{Size: quantity("3Gi"),
			Storage: &targets.HolderStorage{Class: "fast"}}}, wantClass: "fast", wantSize: "3Gi"},
		{name: "the gateway's class", gateway: "standard", wantClass: "standard", wantSize: "20Gi"},
		{name: "an emptyDir on this target", gateway: "standard",
			policy: targets.StepPolicy{VolumeHolder: targets.VolumeHolderPolicy{Storage: &targets.HolderStorage{}}}},
		{name: "none"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
				Meta: targets.Metadata{Namespace: "ci", Steps: tt.policy}}, "prod")
			require.NoError(t, err)
			opts := Options{AgentImage: "reg/step-agent:1", Installation: "prod", Key: key,
				Steps: Defaults{HolderSize: resource.MustParse("20Gi"), HolderStorageClass: tt.gateway}}
			claim, err := HolderClaim(tgt, opts)
			require.NoError(t, err)
			if tt.wantClass == "" {
				assert.Nil(t, claim)
				p, err := HolderPod(tgt, opts, nil)
				require.NoError(t, err)
				assert.NotNil(t, p.Spec.Volumes[0].EmptyDir)
				assert.Empty(t, HolderClaimName(p))
				return
			}
			require.NotNil(t, claim)
			assert.Equal(t, HolderName("prod"), claim.Name)
			assert.Equal(t, "ci", claim.Namespace)
			assert.Equal(t, tt.wantClass, *claim.Spec.StorageClassName)
			assert.Equal(t, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, claim.Spec.AccessModes)
			size := ClaimSize(claim)
			assert.Equal(t, tt.wantSize, size.String())
			assert.Equal(t, "concourse", claim.Labels[targets.VolumeHolderLabel])
			assert.Equal(t, "east", claim.Labels[ownership.WorkerLabel])
			assert.True(t, key.Sealed("east", claim), "sealed as the holder")

			p, err := HolderPod(tgt, opts, claim)
			require.NoError(t, err)
			assert.Nil(t, p.Spec.Volumes[0].EmptyDir)
			assert.Equal(t, claim.Name, HolderClaimName(p))
			cmd := strings.Join(p.Spec.Containers[0].Command, " ")
			assert.True(t, strings.HasSuffix(cmd, "--capacity "+strconv.FormatInt(size.Value(), 10)+" --capacity-of claim"), cmd)

			// A claim made before the setting changed: its own size.
			old := claim.DeepCopy()
			old.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("1Gi")
			p, err = HolderPod(tgt, opts, old)
			require.NoError(t, err)
			assert.Contains(t, strings.Join(p.Spec.Containers[0].Command, " "), "--capacity 1073741824 --capacity-of claim")
		})
	}
}

// TestHolderClaimNeedsASize: a claim of a class with no size anywhere is
// refused, naming the keys that set it.
func TestHolderClaimNeedsASize(t *testing.T) {
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci"}}, "prod")
	require.NoError(t, err)
	_, err = HolderClaim(tgt, Options{Installation: "prod", Steps: Defaults{HolderStorageClass: "fast"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "steps.volumeHolder.storage.size")
	assert.Contains(t, err.Error(), "volume-holder-size")
}
