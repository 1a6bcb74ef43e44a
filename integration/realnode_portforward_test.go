package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/targets"
)

// TestRealNodePortForwardAfterARefusal: on a real kubelet, a stream to a
// port of a pod nothing listens on (as a volume sidecar that has started
// but not yet listens), with a body on its way as a volume's stream-in
// has, is refused, naming the port; the next stream to the pod answers at
// once, over both transports. A Concourse container's first process
// relies on it: it moves its volumes in as soon as the sidecar runs, and
// tries a refused move again after 10 ms.
func TestRealNodePortForwardAfterARefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	const ns = "rn-pf"
	tg, err := rn.CreateTarget(ctx, cluster.TargetOptions{Namespace: ns, Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	releaseOnCleanup(t, rn, ns)
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "httpd", Namespace: ns},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Containers: []corev1.Container{{
			Name: "httpd", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"httpd", "-f", "-p", "7788", "-h", "/tmp"},
		}}},
	}
	_, err = rn.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	waitRunning(ctx, t, rn.Client, ns, pod.Name)
	cfg := restConfig(t, tg.Kubeconfig)

	for _, mode := range []struct {
		name     string
		spdyOnly bool
	}{{"websocket", false}, {"spdy", true}} {
		t.Run(mode.name, func(t *testing.T) {
			d, _ := startDialer(t, portforward.Options{SPDYOnly: mode.spdyOnly}, map[string]*rest.Config{"a": cfg})
			// httpd listens a moment after the pod runs.
			eventually(t, 20*time.Second, func() error { _, err := get(ctx, d, ns, 7788); return err })

			_, err := get(ctx, d, ns, 7799)
			require.Error(t, err, "nothing listens on 7799")
			assert.ErrorContains(t, err, "port 7799")
			start := time.Now()
			status, err := get(ctx, d, ns, 7788)
			require.NoError(t, err)
			assert.Contains(t, status, "HTTP/1.")
			assert.Less(t, time.Since(start), 10*time.Second, "the next stream answers at once, not after a timeout")
		})
	}
}

// get asks the pod's port for / through d and returns the status line.
func get(ctx context.Context, d *portforward.Dialer, ns string, port int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := d.Dial(ctx, "a", ns, "httpd", port)
	if err != nil {
		return "", err
	}
	defer c.Close()
	go func() { <-ctx.Done(); c.Close() }()
	if _, err := fmt.Fprint(c, "PUT / HTTP/1.0\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n"); err != nil {
		return "", err
	}
	go func() { _, _ = c.Write(make([]byte, 4<<20)) }()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		if err == io.EOF {
			return "", fmt.Errorf("no answer from port %d", port)
		}
		return "", err
	}
	return line, nil
}
