package concourse

import (
	"strings"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/steppod"
)

func TestLostWhy(t *testing.T) {
	now := metav1.NewTime(time.Now())
	running := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	pending := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
	evicting := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"}}}}
	deleting := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	evicted := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted",
		Message: "The node was low on resource: memory. " + strings.Repeat("x", 1000)}}
	for _, tc := range []struct {
		name    string
		verdict string
		pod     *corev1.Pod
		want    string
	}{
		{"running", "", running, ""},
		{"pending: its image pulled, say", "", pending, ""},
		{"gone", "", nil, "was deleted"},
		{"planted under its name", "unsealed", running, "was replaced by a pod jetway did not make (unsealed)"},
		{"a drain's eviction", "", evicting, "is being deleted (EvictionByEvictionAPI: Eviction API: evicting)"},
		{"deleted", "", deleting, "is being deleted"},
		{"ended", "", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, "has ended (Succeeded)"},
	} {
		assert.Equal(t, tc.want, lostWhy(tc.verdict, tc.pod), tc.name)
	}
	why := lostWhy("", evicted)
	assert.True(t, strings.HasPrefix(why, "has ended (Failed: Evicted: The node was low on resource: memory. xxx"), why)
	assert.Less(t, len(why), 400, "the pod's message is bounded")
}

func TestALostContainersCallsNameWhy(t *testing.T) {
	ct := &Container{Pod: "main-concourse-h1", Spec: garden.ContainerSpec{Handle: "h1"}}
	assert.NoError(t, ct.lostError())
	ct.state.Lost, ct.state.LostWhy = time.Now(), "was deleted"
	err := ct.lostError()
	assert.ErrorIs(t, err, steppod.ErrPodGone, "a process following it ends at once")
	assert.EqualError(t, err, "container h1 is lost: its pod main-concourse-h1 was deleted")
}
