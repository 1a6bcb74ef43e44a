package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/provision"
)

// hermeticPipeline: the same script in a task and in its hermetic twin,
// each in a mock mirror_self image (a rootfs the volume holder serves to
// the node through its NodePort): fetch a page from a server pod in the
// namespace (busybox nc: the mock image's wget crashes), then ping it, as
// testflight's hermetic spec pings.
const hermeticPipeline = `
resources:
- name: image
  type: mock
  source: {mirror_self: true, initial_version: v1}
jobs:
- name: reach
  plan:
  - get: image
  - task: open
    image: image
    params: {WHO: open}
    config: &reach
      platform: linux
      params: {WHO: ~}
      run:
        path: sh
        args:
        - -c
        - |
          echo "$WHO fetched: $(printf 'GET /hello HTTP/1.0\r\n\r\n' | nc -w 5 SERVER 8080 2>&1 | tail -n 1)."
          ping -c 1 -w 3 SERVER 2>&1 | sed "s/^/$WHO: /"
  - task: sealed
    image: image
    hermetic: true
    params: {WHO: sealed}
    config: *reach
`

// TestRealNodeConcourseHermetic: a `hermetic: true` task cannot reach a
// server pod in its namespace that its twin without hermetic reaches,
// through an unmodified web node and real fly on the real node, whose
// NetworkPolicy enforcer (tools/netpol, kube-network-policies) enforces
// the target's policies as `gateway target add` makes them. The twin
// fetches the page and its ping is answered; the hermetic task's connect
// times out and its ping is sent and lost (testflight's "1 packets
// transmitted, 0 packets received"): the packets leave the pod and the
// node drops them. Both run in the holder's mirror_self image, which the
// node's runtime pulls through the holder's NodePort under the same
// policies, and with steps.netRaw (ping's raw socket) in user namespaces.
func TestRealNodeConcourseHermetic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const name = "rn-hermetic"
	web := mockWorkerOnNode(ctx, t, name, "steps:\n  netRaw: true\n  userNamespaces: true\n  volumeHolder: {images: NodePort}\n")
	rn := startRealNode(t)
	access := provision.Access{Target: name, Namespace: name}
	for _, p := range access.NetworkPolicies(provision.DefaultEgressDeny()) {
		_, err := rn.Client.NetworkingV1().NetworkPolicies(name).Create(ctx, p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	server := serverPod(ctx, t, rn, name)

	file := filepath.Join(t.TempDir(), "hermetic.yml")
	writeFile(t, file, []byte(strings.ReplaceAll(hermeticPipeline, "SERVER", server)))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "hermetic", "-c", file)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "hermetic")
	out := flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "hermetic/reach", "--watch")
	assert.Contains(t, out, "open fetched: reached.", "the task without hermetic reaches the server")
	assert.Contains(t, out, "open: 1 packets transmitted, 1 packets received", "and its ping is answered")
	assert.Regexp(t, `sealed fetched: nc: timed out\.`, out, "the hermetic task's connect is dropped")
	assert.Contains(t, out, "sealed: 1 packets transmitted, 0 packets received, 100% packet loss", "its ping is sent, and lost")
	assert.Contains(t, out, "succeeded")
}

// serverPod starts, in namespace ns of the real node, a pod no policy
// selects that answers http://IP:8080/hello with "reached", and returns
// its IP once it runs.
func serverPod(ctx context.Context, t *testing.T, rn *cluster.Cluster, ns string) string {
	t.Helper()
	pods := rn.Client.CoreV1().Pods(ns)
	no := false
	_, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Containers: []corev1.Container{{
			Name: "httpd", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "mkdir -p /www && echo reached > /www/hello && exec httpd -f -p 8080 -h /www"},
		}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	var ip string
	require.Eventually(t, func() bool {
		p, err := pods.Get(ctx, "server", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return false
		}
		ip = p.Status.PodIP
		return ip != ""
	}, 2*time.Minute, 200*time.Millisecond, "the server pod runs")
	return ip
}
