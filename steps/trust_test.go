package steps

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// The engine's execs go only to a pod jetway made under the name they
// name: one bound to its UID. A pod with a copied seal and binding (made
// after jetway's, so another UID), one with no seal, and one not there get
// no command, and the error says why.
func TestExecsGoOnlyToPodsJetwayMade(t *testing.T) {
	key, err := ownership.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	made := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "build-1", Namespace: "ci", UID: "uid-made",
		Annotations: map[string]string{ownership.SealAnnotation: key.Seal("east", "build-1", ""), ownership.NonceAnnotation: "n"}}}
	planted := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "planted", Namespace: "ci", UID: "uid-planted"}}
	client := fake.NewClientset([]runtime.Object{made, planted}...)
	pods := client.CoreV1().Pods("ci")
	bound, err := ownership.Bind(context.Background(), pods, key, "east", made)
	require.NoError(t, err)
	tgt := &targets.Target{Config: &targets.Config{Name: "east", Meta: targets.Metadata{Namespace: "ci"}}, Core: client.CoreV1()}

	var ran []string
	exec := steppod.TrustedExec(key, func(_ context.Context, _ *targets.Target, pod, _ string, _ []string, _ []byte, _ io.Writer) error {
		ran = append(ran, pod)
		return nil
	})
	run := func(pod string) error {
		return exec(context.Background(), tgt, pod, steppod.StepContainer, []string{"bin/step-agent", "run"}, []byte("the spec"), io.Discard)
	}
	require.NoError(t, run("build-1"))
	assert.EqualError(t, run("planted"), "pod planted is not the pod jetway made under its name: it gets no command (unsealed)")
	assert.EqualError(t, run("missing"), `pod missing: pods "missing" not found`)

	// jetway's pod deleted, and a pod made under its name with everything
	// of it copied: another UID.
	require.NoError(t, pods.Delete(context.Background(), "build-1", metav1.DeleteOptions{}))
	later := bound.DeepCopy()
	later.UID, later.ResourceVersion = "uid-later", ""
	_, err = pods.Create(context.Background(), later, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.EqualError(t, run("build-1"), "pod build-1 is not the pod jetway made under its name: it gets no command (unbound)")
	assert.Equal(t, []string{"build-1"}, ran, "the command went to jetway's pod alone")
}
