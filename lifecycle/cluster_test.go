package lifecycle

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/targets"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// realTarget starts a cluster for the test and returns a controller over
// one target on it, with jetway's permissions.
func realTarget(ctx context.Context, t *testing.T, name string) (*Controller, *kube, *cluster.Cluster) {
	t.Helper()
	c := cluster.ForTest(t, 1)[0]
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: name, Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".kubeconfig"), tg.Kubeconfig, 0o600))
	results, _, err := targets.NewSource(targets.SourceOptions{Dir: dir}, nil).Read()
	require.NoError(t, err)
	require.NoError(t, results[name].Err)
	ctl := New(Options{Identity: "test", GCGrace: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	target, err := targets.NewTarget(results[name].Config, "jetway")
	require.NoError(t, err)
	return ctl, newKube(target), c
}

// TestDeletesSpareAReplacedPod lists a step pod, lets it be replaced by a
// foreign pod of the same name, then deletes what it listed, as sync, GC
// and retire do: the foreign pod survives.
func TestDeletesSpareAReplacedPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctl, k, c := realTarget(ctx, t, "uid")
	pods := c.Client.CoreV1().Pods("uid")
	// No node matches: kwok never runs these pods, so nothing but the API
	// server and the code under test acts on them (kwok, finishing the
	// first pod's deletion by name, was seen to delete its successor).
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: "example.invalid/step"}},
		NodeSelector: map[string]string{"jetway.test/node": "none"}}
	_, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "step", Labels: ownership.Labels("uid", "jetway")}, Spec: spec}, metav1.CreateOptions{})
	require.NoError(t, err)
	listed, err := k.ownedPods(ctx)
	require.NoError(t, err)
	require.Len(t, listed, 1)

	zero := int64(0)
	require.NoError(t, pods.Delete(ctx, "step", metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	require.Eventually(t, func() bool { _, err := pods.Get(ctx, "step", metav1.GetOptions{}); return err != nil }, 30*time.Second, 50*time.Millisecond)
	foreign, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "step"}, Spec: spec}, metav1.CreateOptions{})
	require.NoError(t, err)

	deleted, err := ctl.deletePods(ctx, k, listed, "sync", ctl.opts.Logger)
	require.NoError(t, err)
	assert.Empty(t, deleted)
	got, err := pods.Get(ctx, "step", metav1.GetOptions{})
	require.NoError(t, err, "the foreign pod of the same name is left alone")
	assert.Equal(t, foreign.UID, got.UID)
	assert.Nil(t, got.DeletionTimestamp)
}
