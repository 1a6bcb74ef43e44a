package ownership

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

// TestKeyLoaderWaitsForTheStateNamespace: a gateway starting while its
// state namespace's API server does not answer keeps trying, with
// backoff, and its key is ready the moment a read works; until then it
// seals and verifies nothing.
func TestKeyLoaderWaitsForTheStateNamespace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset()
		var calls atomic.Int32
		client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
			if calls.Add(1) <= 3 {
				return true, nil, errors.New("connection refused")
			}
			return false, nil, nil
		})
		l := NewKeyLoader(client.CoreV1(), "state", "jetway", nil)
		k := l.Key()
		assert.True(t, k.IsZero())
		assert.Empty(t, k.Seal("t", "p", ""))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- l.Start(ctx) }()
		synctest.Wait()
		assert.True(t, k.IsZero(), "not read while the API server refuses")
		start := time.Now()
		<-k.Ready()
		assert.Equal(t, 7*time.Second, time.Since(start), "retried after 1, 2 and 4 s")
		assert.False(t, k.IsZero())
		again, err := LoadKey(context.Background(), client.CoreV1(), "state", "jetway")
		require.NoError(t, err)
		assert.Equal(t, again.Seal("t", "p", "main"), k.Seal("t", "p", "main"), "the key made once, read by all")
		cancel()
		require.NoError(t, <-done)
	})
}
