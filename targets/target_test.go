package targets

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
)

// emptyWatch stands in for Target.Run in unit tests: the caches list
// nothing, at once, and no network is touched.
func emptyWatch(t *Target, ctx context.Context) {
	_ = t.pods.Replace(nil, "1")
	_ = t.record.Replace(nil, "1")
	<-ctx.Done()
}

// listed makes a target for cfg whose caches hold pods and, unless life is
// zero, a lifecycle record saying life.
func listed(cfg *Config, life Lifecycle, pods ...*corev1.Pod) *Target {
	t, err := NewTarget(cfg, "test")
	if err != nil {
		panic(err)
	}
	items := make([]any, len(pods))
	for i, p := range pods {
		items[i] = p
	}
	_ = t.pods.Replace(items, "1")
	setRecord(t, life)
	return t
}

// setRecord replaces the cached lifecycle record of t.
func setRecord(t *Target, life Lifecycle) {
	var items []any
	if life != (Lifecycle{}) {
		items = append(items, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: t.RecordName, Namespace: t.Namespace(), Labels: t.Labels()},
			Data: life.Data()})
	}
	_ = t.record.Replace(items, "1")
}

func TestAwaitRecordWaitsForTheWatchToShowAWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tg := listed(testConfig(t, "a"), Lifecycle{State: StateLanding})
		record := func(rv string, life Lifecycle) any {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: tg.RecordName, Namespace: "a",
				Labels: tg.Labels(), ResourceVersion: rv}, Data: life.Data()}
		}
		require.NoError(t, tg.record.Replace([]any{record("4", Lifecycle{State: StateLanding})}, "4"))

		done := make(chan error, 1)
		go func() { done <- tg.AwaitRecord(context.Background(), "5") }()
		synctest.Wait()
		require.Empty(t, done, "the cache still shows version 4")
		require.NoError(t, tg.record.Update(record("6", Lifecycle{State: StateLanded})))
		require.NoError(t, <-done, "a newer version than the one written will do")
		life, _ := tg.Lifecycle()
		assert.Equal(t, StateLanded, life.State)

		go func() { done <- tg.AwaitRecord(context.Background(), "") }()
		synctest.Wait()
		require.Empty(t, done, "the record is still there")
		require.NoError(t, tg.record.Delete(record("6", Lifecycle{})))
		require.NoError(t, <-done, "gone, as a forget wants")

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		assert.ErrorIs(t, tg.AwaitRecord(ctx, "9"), context.DeadlineExceeded, "gives up with its context")
	})
}

// TestWhilePodEndsWhenThePodGoes: a call bound to a pod ends, saying
// how, once the watch shows that pod deleted or replaced by another of
// its name; not while it is there, nor for a pod the watch never showed
// (a watch still listing may show an older pod of the name).
func TestWhilePodEndsWhenThePodGoes(t *testing.T) {
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "a", UID: k8stypes.UID(uid)}}
	}
	show := func(tg *Target, pods ...*corev1.Pod) {
		items := make([]any, len(pods))
		for i, p := range pods {
			items[i] = p
		}
		require.NoError(t, tg.pods.Replace(items, "1"))
	}
	for _, c := range []struct {
		name  string
		after []*corev1.Pod
		why   string
	}{
		{"deleted", nil, "pod a/p (uid 1) was deleted"},
		{"replaced", []*corev1.Pod{pod("p", "2")}, "pod a/p (uid 1) was replaced by another of its name (uid 2)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tg := listed(testConfig(t, "a"), Lifecycle{}, pod("p", "1"), pod("q", "9"))
				ctx, stop := tg.WhilePod(context.Background(), "p", "1")
				defer stop()
				show(tg, pod("p", "1")) // another change, the pod still there
				synctest.Wait()
				require.NoError(t, ctx.Err(), "ended while its pod is there")

				show(tg, append(c.after, pod("q", "9"))...)
				synctest.Wait()
				require.Error(t, ctx.Err())
				cause := context.Cause(ctx)
				assert.ErrorIs(t, cause, ErrPodGone)
				assert.EqualError(t, cause, c.why+": the pod is gone")
			})
		})
	}
	t.Run("never shown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Read from the API server before the watch showed it: the
			// watch shows an older pod of the name, then none.
			tg := listed(testConfig(t, "a"), Lifecycle{}, pod("p", "0"))
			ctx, stop := tg.WhilePod(context.Background(), "p", "1")
			show(tg)
			synctest.Wait()
			assert.NoError(t, ctx.Err(), "ended for a pod the watch never showed")
			stop()
			assert.ErrorIs(t, ctx.Err(), context.Canceled)
			assert.NotErrorIs(t, context.Cause(ctx), ErrPodGone)
		})
	})
}
