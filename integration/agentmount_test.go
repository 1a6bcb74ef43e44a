package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/agentmount"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// TestAgentMountAuto: against a real API server, step-agent-mount auto
// gives the init container to a target whose service account may not
// list nodes (its required permissions are namespaced), the image volume
// to one that may and whose nodeSelector's nodes report containerd 2.2.9
// and kubelet 1.36, and the init container to one whose node reports
// containerd 1.7; the step pods Build makes follow.
func TestAgentMountAuto(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	pool := "jetway-test/agent-mount"
	// Tainted: no other test's pod lands on these nodes.
	newNode := agentMountNode(ctx, t, "am-new-"+id, id+"-new", "containerd://2.2.9", "v1.36.0")
	oldNode := agentMountNode(ctx, t, "am-old-"+id, id+"-old", "containerd://1.7.0", "v1.36.0")
	t.Logf("nodes report %s and %s", newNode.Status.NodeInfo.ContainerRuntimeVersion, oldNode.Status.NodeInfo.ContainerRuntimeVersion)

	dir := t.TempDir()
	denied, allowed, old := "am-denied-"+id, "am-allowed-"+id, "am-old-"+id
	placeTarget(ctx, t, c, dir, denied, "nodeSelector: {"+pool+": "+id+"-new}\n", "")
	placeTarget(ctx, t, c, dir, allowed, "nodeSelector: {"+pool+": "+id+"-new}\n", "")
	placeTarget(ctx, t, c, dir, old, "nodeSelector: {"+pool+": "+id+"-old}\n", "")
	for _, ns := range []string{denied, allowed, old} {
		t.Cleanup(func() {
			_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		})
	}
	grantListNodes(ctx, t, c, "jetway-test-list-nodes-"+id, allowed, old)

	registry := targets.NewRegistry(targets.RegistryOptions{Interval: time.Second, Timeout: 2 * time.Second, Installation: "jetway"})
	source := targets.NewSource(targets.SourceOptions{Dir: dir, Resync: time.Minute}, registry.Apply)
	chooser := agentmount.New(agentmount.Options{Targets: registry, Timeout: 5 * time.Second,
		Metrics: agentmount.NewMetrics(prometheus.NewRegistry())})
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, start := range []func(context.Context) error{registry.Start, source.Start, chooser.Start} {
		wg.Go(func() { _ = start(runCtx) })
	}
	defer wg.Wait()
	defer stop()

	target := func(name string) *targets.Target {
		var tg *targets.Target
		require.Eventually(t, func() bool {
			var err error
			tg, err = registry.Target(name)
			return err == nil
		}, 20*time.Second, 50*time.Millisecond, name)
		return tg
	}
	require.Eventually(t, func() bool { return chooser.AgentMount(target(allowed)) == steppod.AgentImageVolume },
		20*time.Second, 50*time.Millisecond, "a target that may list nodes, all reporting containerd 2.2.9")
	assert.Equal(t, steppod.AgentInitContainer, chooser.AgentMount(target(denied)), "a target that may not list nodes")
	assert.Equal(t, steppod.AgentInitContainer, chooser.AgentMount(target(old)), "a target whose node runs containerd 1.7")

	opts := steppod.Options{AgentImage: "reg/step-agent:1", AgentMount: steppod.AgentAuto, Chooser: chooser, Installation: "jetway"}
	spec := steppod.Spec{Name: "am-1", Type: "task", Team: "main", Image: "busybox"}
	assert.Empty(t, steppod.Build(target(allowed), spec, opts).Spec.InitContainers, "the agent's image volume")
	assert.Len(t, steppod.Build(target(denied), spec, opts).Spec.InitContainers, 1, "the init container")
}

// agentMountNode creates a tainted node labelled jetway-test/agent-mount:
// pool that reports runtime and kubelet, deleted after the test.
func agentMountNode(ctx context.Context, t *testing.T, name, pool, runtime, kubelet string) *corev1.Node {
	t.Helper()
	nodes := clusters[0].Client.CoreV1().Nodes()
	// A node's status may be set as it is made; kwok (which manages every
	// node) keeps the nodeInfo it finds.
	_, err := nodes.Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"jetway-test/agent-mount": pool}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "jetway-test/agent-mount", Effect: corev1.TaintEffectNoSchedule},
			{Key: "jetway-test/agent-mount", Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: runtime, KubeletVersion: kubelet}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = nodes.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	var n *corev1.Node
	require.Eventually(t, func() bool {
		n, err = nodes.Get(ctx, name, metav1.GetOptions{})
		return err == nil && n.Status.NodeInfo.ContainerRuntimeVersion == runtime && n.Status.NodeInfo.KubeletVersion == kubelet
	}, 10*time.Second, 50*time.Millisecond, "node %s reports %s, kubelet %s", name, runtime, kubelet)
	return n
}

// grantListNodes lets the service account jetway of each namespace list
// nodes of c, through a ClusterRole and ClusterRoleBinding named name.
func grantListNodes(ctx context.Context, t *testing.T, c *cluster.Cluster, name string, namespaces ...string) {
	t.Helper()
	rbac := c.Client.RbacV1()
	_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rbac.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	for _, ns := range namespaces {
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "jetway", Namespace: ns})
	}
	_, err = rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rbac.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}
