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
		"the token passed for a seal": pod("build-1", "main", k.Token("t1", "build-1", "n")),
		"the token's hash for a seal": pod("build-1", "main", TokenHash(k.Token("t1", "build-1", "n"))),
	} {
		assert.False(t, k.Sealed("t1", p), name)
	}
	assert.False(t, k.Sealed("t2", pod("build-1", "main", sealed)), "another target")
	assert.False(t, Key{}.Sealed("t1", pod("build-1", "main", Key{}.Seal("t1", "build-1", "main"))), "the zero key verifies nothing")

	assert.NotEqual(t, k.Token("t1", "build-1", "n"), k.Token("t1", "build-2", "n"), "a token per pod")
	assert.NotEqual(t, k.Token("t1", "build-1", "n"), k.Token("t1", "build-1", "m"), "a token per nonce: a later pod of the name has another")
	assert.NotEqual(t, k.Token("t1", "build-1", "n"), other.Token("t1", "build-1", "n"))
	assert.NotEqual(t, NewNonce(), NewNonce())
	assert.Len(t, NewNonce(), 32)
	_, err = NewKey([]byte("short"))
	assert.ErrorContains(t, err, "at least 32 bytes")
}

// A pod is bound to the UID jetway's create returned: a pod of the same
// name, team and nonce, with the seal and the binding copied, but another
// UID, is sealed (jetway may delete it) and not bound (it gets nothing).
func TestBindingsBindTheUID(t *testing.T) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	made := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "build-1", Namespace: "ci", UID: "uid-1",
		Labels:      map[string]string{TeamLabel: "main"},
		Annotations: map[string]string{SealAnnotation: k.Seal("t1", "build-1", "main"), NonceAnnotation: NewNonce()}}}
	client := fake.NewClientset(made)
	assert.False(t, k.Bound("t1", made), "not bound before Bind")
	assert.Equal(t, Unbound, k.Verdict("t1", made))

	bound, err := Bind(context.Background(), client.CoreV1().Pods("ci"), k, "t1", made)
	require.NoError(t, err)
	assert.True(t, k.Bound("t1", bound))
	assert.Empty(t, k.Verdict("t1", bound))
	got, err := client.CoreV1().Pods("ci").Get(context.Background(), "build-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, k.Bound("t1", got), "the binding is on the pod")

	copied := got.DeepCopy()
	copied.UID = "uid-2"
	assert.True(t, k.Sealed("t1", copied))
	assert.False(t, k.Bound("t1", copied), "another UID")
	assert.Equal(t, Unbound, k.Verdict("t1", copied))
	relabelled := got.DeepCopy()
	relabelled.Labels[TeamLabel] = "other"
	assert.Equal(t, Unsealed, k.Verdict("t1", relabelled))
	renonced := got.DeepCopy()
	renonced.Annotations[NonceAnnotation] = NewNonce()
	assert.False(t, k.Bound("t1", renonced), "another nonce")
	assert.False(t, k.Bound("t2", got), "another target")

	// (That the patch tests the UID, so that it never lands on another pod
	// of the name, is tested on a real API server: integration's
	// TestPlantedPodsGetNothing.)
	require.NoError(t, client.CoreV1().Pods("ci").Delete(context.Background(), "build-1", metav1.DeleteOptions{}))
	_, err = Bind(context.Background(), client.CoreV1().Pods("ci"), k, "t1", made)
	assert.ErrorIs(t, err, ErrNotBound, "gone")
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
