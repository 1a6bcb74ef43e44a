package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/kubecount"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// The web node's Lookups, List calls and the sweeps read the container
// records from a watch, on a real API server, with two replicas: what a
// replica writes it reads at once, the other a moment later; reading
// costs the API server no request however many containers there are;
// the environment stays out of the watch's copy; a record that is not a
// container's is left out.
func TestContainerRecordsAreReadFromTheirWatch(t *testing.T) {
	c := cluster.ForTest(t, 1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const ns = "records"
	state, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: ns, Rules: targets.RBACRules(steps.StatePermissions)})
	require.NoError(t, err)
	rc, err := clientcmd.RESTConfigFromKubeConfig(state.Kubeconfig)
	require.NoError(t, err)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	replica := func() (*concourse.ContainerRecords, *kubecount.Counts) {
		counts := &kubecount.Counts{}
		cfg := rest.CopyConfig(rc)
		cfg.Wrap(counts.Wrap)
		client, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		r := &concourse.ContainerRecords{Secrets: client.CoreV1().Secrets(ns), Installation: "records"}
		wg.Go(func() { assert.NoError(t, r.Start(ctx)) })
		return r, counts
	}
	requests := func(counts *kubecount.Counts, verb string) uint64 {
		var n uint64
		counts.Each(func(r kubecount.Request, c kubecount.Count) {
			if r.Verb == verb && r.Resource == "secrets" {
				n += c.Requests
			}
		})
		return n
	}
	handles := func(r *concourse.ContainerRecords, target string) []string {
		cts, err := r.List(ctx, target)
		require.NoError(t, err)
		out := []string{}
		for _, ct := range cts {
			out = append(out, ct.Handle())
		}
		return out
	}
	a, aCounts := replica()
	b, bCounts := replica()
	for _, r := range []*concourse.ContainerRecords{a, b} {
		require.Eventually(t, func() bool { ok, _ := r.Synced(); return ok }, time.Minute, 10*time.Millisecond)
	}

	ct := &concourse.Container{Target: "east", Pod: "concourse-east-h1", Image: "busybox",
		Spec: garden.ContainerSpec{Handle: "h1", Env: []string{"PASSWORD=s3cret"}}, Created: time.Now().UTC()}
	require.NoError(t, a.Create(ctx, ct))
	assert.Equal(t, []string{"h1"}, handles(a, "east"), "the writer reads its write at once")
	assert.Empty(t, handles(a, "west"), "each target's own")
	got, err := b.Cached(ctx, "east", "h1")
	require.NoError(t, err, "a record the other replica's watch does not show yet is read from the API server")
	assert.Equal(t, "concourse-east-h1", got.Pod)
	require.Eventually(t, func() bool { return len(handles(b, "east")) == 1 }, time.Minute, 10*time.Millisecond,
		"the other replica's watch shows it")

	listed, err := b.List(ctx, "east")
	require.NoError(t, err)
	assert.Empty(t, listed[0].Spec.Env, "the watch's copy keeps no environment")
	whole, err := b.Get(ctx, "east", "h1")
	require.NoError(t, err)
	assert.Equal(t, []string{"PASSWORD=s3cret"}, whole.Spec.Env, "Get reads the whole record")

	// Many containers, many reads: no list, no get.
	for i := range 40 {
		h := "many-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		require.NoError(t, a.Create(ctx, &concourse.Container{Target: "east", Pod: "concourse-east-" + h, Image: "busybox",
			Spec: garden.ContainerSpec{Handle: h}, Created: time.Now().UTC()}))
	}
	require.Eventually(t, func() bool { return len(handles(b, "east")) == 41 }, time.Minute, 10*time.Millisecond)
	lists, gets := requests(bCounts, "list"), requests(bCounts, "get")
	cs := &concourse.Containers{Records: b}
	for range 100 {
		require.Len(t, handles(b, "east"), 41)
		_, err := cs.Lookup(ctx, "east", "h1")
		require.NoError(t, err)
		props, err := cs.List(ctx, "east", garden.Properties{})
		require.NoError(t, err)
		require.Len(t, props, 41)
	}
	assert.Equal(t, lists, requests(bCounts, "list"), "List read the watch")
	assert.Equal(t, gets, requests(bCounts, "get"), "Lookup read the watch")

	// A change and a delete: the writer at once, the other soon.
	require.NoError(t, (&concourse.Containers{Records: a}).SetProperty(ctx, "east", "h1", "concourse:exit-status", "0"))
	found, err := (&concourse.Containers{Records: a}).List(ctx, "east", garden.Properties{"concourse:exit-status": "0"})
	require.NoError(t, err)
	assert.Equal(t, []string{"h1"}, found, "the writer reads its change at once")
	require.Eventually(t, func() bool {
		found, err := cs.List(ctx, "east", garden.Properties{"concourse:exit-status": "0"})
		return err == nil && len(found) == 1
	}, time.Minute, 10*time.Millisecond, "the other replica reads the change")
	require.NoError(t, a.Delete(ctx, "east", "h1"))
	assert.NotContains(t, handles(a, "east"), "h1", "the writer reads its delete at once")
	require.Eventually(t, func() bool { return len(handles(b, "east")) == 40 }, time.Minute, 10*time.Millisecond,
		"the other replica reads the delete")
	_, err = cs.Lookup(ctx, "east", "h1")
	require.ErrorAs(t, err, new(garden.ContainerNotFoundError))

	// A Secret labelled as a record that is not one is left out, and the
	// rest still read.
	admin, err := kubernetes.NewForConfig(c.AdminConfig())
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-a-record",
		Labels: map[string]string{"jetway-ci.dev/concourse-container-of": "records", ownership.WorkerLabel: "east"}},
		Data: map[string][]byte{"spec": []byte("{not json")}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, a.Create(ctx, &concourse.Container{Target: "east", Pod: "concourse-east-last", Image: "busybox",
		Spec: garden.ContainerSpec{Handle: "last"}, Created: time.Now().UTC()}))
	require.Eventually(t, func() bool { return len(handles(b, "east")) == 41 }, time.Minute, 10*time.Millisecond,
		"the records after the planted one are read, the planted one is not")
	assert.LessOrEqual(t, requests(aCounts, "list"), uint64(1), "at most the watch's first list (none where the watch streams it)")
}
