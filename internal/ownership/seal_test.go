package ownership

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSealsBindNameAndTeam(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	other, err := NewKey([]byte("fedcba9876543210fedcba9876543210"))
	require.NoError(t, err)
	pod := func(name, team, seal string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{SealAnnotation: seal}}}
		if team != "" {
			p.Labels[TeamLabel] = team
		}
		return p
	}
	sealed := k.Seal("t1", "build-1", "main")
	assert.True(t, k.Sealed("t1", pod("build-1", "main", sealed)))
	for name, p := range map[string]*corev1.Pod{
		"no seal":                     pod("build-1", "main", ""),
		"another team's label":        pod("build-1", "other", sealed),
		"no team: an admin's pod":     pod("build-1", "", sealed),
		"another name":                pod("build-2", "main", sealed),
		"sealed by another key":       pod("build-1", "main", other.Seal("t1", "build-1", "main")),
		"the token passed for a seal": pod("build-1", "main", k.Token("t1", "build-1")),
		"the token's hash for a seal": pod("build-1", "main", TokenHash(k.Token("t1", "build-1"))),
	} {
		assert.False(t, k.Sealed("t1", p), name)
	}
	assert.False(t, k.Sealed("t2", pod("build-1", "main", sealed)), "another target")
	assert.False(t, Key{}.Sealed("t1", pod("build-1", "main", Key{}.Seal("t1", "build-1", "main"))), "the zero key verifies nothing")

	assert.NotEqual(t, k.Token("t1", "build-1"), k.Token("t1", "build-2"), "a token per pod")
	assert.NotEqual(t, k.Token("t1", "build-1"), other.Token("t1", "build-1"))
	_, err = NewKey([]byte("short"))
	assert.ErrorContains(t, err, "at least 32 bytes")
}
