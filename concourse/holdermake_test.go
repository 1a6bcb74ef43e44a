package concourse

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// A holder pod deleted by name before the gateway that made it bound it
// (kwok deletes the pod before it so, taking the new one of its name;
// a clean clone's run of TestALostHolderIsReplaced) is made again at
// once, not left missing until the next sweep.
func TestAHolderDeletedBeforeItsBindIsMadeAgain(t *testing.T) {
	cs := fake.NewClientset()
	creates := 0
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		creates++
		p := action.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		p.UID = types.UID(fmt.Sprintf("uid-%d", creates))
		return false, nil, nil // the tracker stores it, with this UID
	})
	deleted := false
	cs.PrependReactor("patch", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if deleted {
			return false, nil, nil
		}
		deleted = true
		name := action.(k8stesting.PatchAction).GetName()
		require.NoError(t, cs.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "ci", name))
		return true, nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
	})
	tg := &targets.Target{Config: &targets.Config{Name: "east", Meta: targets.Metadata{Namespace: "ci"}},
		Core: cs.CoreV1(), Installation: "prod"}
	key, err := ownership.NewKey(make([]byte, 32))
	require.NoError(t, err)
	h := &Holder{Pod: func() steppod.Options {
		return steppod.Options{AgentImage: "reg/step-agent:1", Installation: "prod", Key: key}
	}}

	made, err := h.makeHolder(context.Background(), tg)
	require.NoError(t, err)
	assert.True(t, made)
	assert.Equal(t, 2, creates, "made again once the first was deleted")
	p, err := cs.CoreV1().Pods("ci").Get(context.Background(), steppod.HolderName("prod"), metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, key.Bound("east", p), "the one made again is bound")
}
