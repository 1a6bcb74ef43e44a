package watchcache

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNotOlder(t *testing.T) {
	assert.True(t, NotOlder("12", "12"))
	assert.True(t, NotOlder("13", "12"))
	assert.False(t, NotOlder("9", "12"), "compared as numbers, not strings")
	assert.True(t, NotOlder("opaque", "opaque"))
	assert.False(t, NotOlder("opaque-2", "opaque-1"), "opaque versions only match exactly")
}

func cm(name, rv, v string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: rv},
		Data: map[string]string{"v": v}}
}

// A writer's own write shows at once; the watch bringing an older
// version of it later changes nothing, a newer one replaces it.
func TestApplyKeepsTheNewest(t *testing.T) {
	c := New(func(items []any) any {
		out := map[string]string{}
		for _, it := range items {
			o := it.(*corev1.ConfigMap)
			out[o.Name] = o.Data["v"]
		}
		return out
	})
	require.NoError(t, c.Replace([]any{cm("a", "10", "listed")}, "10"))
	changed := c.Changes()
	c.Apply(cm("a", "12", "written"))
	assert.Equal(t, "written", c.View().(map[string]string)["a"])
	select {
	case <-changed:
	default:
		t.Fatal("an applied write is a change")
	}
	c.Apply(cm("a", "11", "older"))
	assert.Equal(t, "written", c.View().(map[string]string)["a"], "an older version is dropped")
	require.NoError(t, c.Update(cm("a", "11", "watched late")))
	assert.Equal(t, "written", c.View().(map[string]string)["a"], "the watch's older event, coming after the write, is dropped")
	require.NoError(t, c.Update(cm("a", "13", "watched")))
	assert.Equal(t, "watched", c.View().(map[string]string)["a"])
	c.Forget(cm("a", "13", ""))
	assert.NotContains(t, c.View().(map[string]string), "a")
}
