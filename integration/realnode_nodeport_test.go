package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// TestRealNodeNodePortOnLoopback: the real node runs kube-proxy as a
// managed cluster's node does (iptables mode), so a NodePort Service
// answers on the machine's loopback, where a node's container runtime
// pulls a volume holder's images from, and on the node's address; once
// the Service is gone, so is the port. Its rules are kube-proxy's chains,
// which the node's teardown removes (cluster.node.teardown).
func TestRealNodeNodePortOnLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	const ns = "rn-nodeport"
	_, err := rn.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	releaseOnCleanup(t, rn, ns)
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Containers: []corev1.Container{{
			Name: "httpd", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "mkdir -p /www && echo served-by-the-pod > /www/index.html && exec httpd -f -p 8080 -h /www"},
		}}},
	}
	_, err = rn.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	running := waitRunning(ctx, t, rn.Client, ns, pod.Name)
	// As jetway serves a volume holder: no selector, an EndpointSlice
	// naming the pod's address (the local clusters run no endpoint
	// controllers).
	svc, err := rn.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = rn.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{running.Status.PodIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	port := svc.Spec.Ports[0].NodePort
	require.NotZero(t, port)

	client := &http.Client{Timeout: 2 * time.Second}
	fetch := func(host string) (string, error) {
		resp, err := client.Get(fmt.Sprintf("http://%s:%d/", host, port))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for _, host := range []string{"127.0.0.1", cluster.NodeIP} {
		eventually(t, time.Minute, func() error {
			body, err := fetch(host)
			if err != nil {
				return err
			}
			if body != "served-by-the-pod\n" {
				return errorf("%s answered %q", host, body)
			}
			return nil
		})
	}
	rules, err := exec.CommandContext(ctx, "iptables-save", "-t", "nat").CombinedOutput()
	require.NoError(t, err, "%s", rules)
	assert.Contains(t, string(rules), "KUBE-NODEPORTS", "kube-proxy's chains")

	require.NoError(t, rn.Client.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}))
	eventually(t, time.Minute, func() error {
		if body, err := fetch("127.0.0.1"); err == nil {
			return errorf("the port still answers: %q", strings.TrimSpace(body))
		}
		return nil
	})
}
