package targets

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
