package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/jetway-ci/jetway/integration/cluster"
)

var podRules = []rbacv1.PolicyRule{{
	APIGroups: []string{""},
	Resources: []string{"pods"},
	Verbs:     []string{"create", "get", "list", "watch", "delete"},
}}

var portForwardRules = append([]rbacv1.PolicyRule{{
	APIGroups: []string{""},
	Resources: []string{"pods/portforward"},
	Verbs:     []string{"create", "get"},
}}, podRules...)

// TestGroundIsReal proves the local clusters behave as Kubernetes: pods
// reach Running on kwok's nodes, port-forward through the API server reaches
// a local server behind the pod, and RBAC refuses what it does not grant.
func TestGroundIsReal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	greeting := startGreeter(t)

	for _, c := range clusters {
		t.Run(c.Name, func(t *testing.T) {
			target, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "smoke", Rules: portForwardRules})
			require.NoError(t, err)
			cfg := restConfig(t, target.Kubeconfig)
			client := kubernetes.NewForConfigOrDie(cfg)

			pod := runPod(ctx, t, client, "smoke", "greeter")
			assert.Equal(t, corev1.PodRunning, pod.Status.Phase)
			assert.NotEmpty(t, pod.Spec.NodeName, "scheduled by kube-scheduler")

			_, port, _ := net.SplitHostPort(greeting.Addr().String())
			require.NoError(t, c.ForwardPodPort(ctx, "smoke", "greeter", 8080, "127.0.0.1", atoi(port)))

			for name, dialer := range portForwardDialers(t, cfg, "smoke", "greeter") {
				t.Run(name, func(t *testing.T) {
					var got string
					eventually(t, 30*time.Second, func() (err error) {
						got, err = readThroughPortForward(ctx, dialer, 8080)
						return err
					})
					assert.Equal(t, "hello from "+greeting.Addr().String()+"\n", got)
				})
			}
		})
	}

	t.Run("rbac refuses port-forward", func(t *testing.T) {
		c := clusters[0]
		target, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "smoke-noforward", Rules: podRules})
		require.NoError(t, err)
		cfg := restConfig(t, target.Kubeconfig)
		runPod(ctx, t, kubernetes.NewForConfigOrDie(cfg), "smoke-noforward", "greeter")
		for name, dialer := range portForwardDialers(t, cfg, "smoke-noforward", "greeter") {
			t.Run(name, func(t *testing.T) {
				_, err := readThroughPortForward(ctx, dialer, 8080)
				require.Error(t, err)
				assert.Contains(t, strings.ToLower(err.Error()), "forbidden")
			})
		}
	})
}

// serveTCP runs handle for every connection to a new loopback listener.
// Cleanup closes the listener and every accepted connection (kwok keeps
// its side of a forwarded connection open after the stream ends) and
// waits for the handlers.
func serveTCP(t *testing.T, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { handle(conn) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln
}

// startGreeter serves one line naming its address to every connection.
func startGreeter(t *testing.T) net.Listener {
	return serveTCP(t, func(conn net.Conn) {
		fmt.Fprintf(conn, "hello from %s\n", conn.LocalAddr())
		conn.Close()
	})
}

func restConfig(t *testing.T, kubeconfig []byte) *rest.Config {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	require.NoError(t, err)
	return cfg
}

func runPod(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "example.invalid/step:latest",
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		}}},
	}
	_, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	return waitRunning(ctx, t, client, ns, name)
}

// waitRunning waits for a pod to be scheduled and reach Running.
func waitRunning(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, 60*time.Second, func() error {
		got, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = got
		if pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s/%s is %q on node %q: %+v", ns, name, pod.Status.Phase, pod.Spec.NodeName, pod.Status.Conditions)
		}
		return nil
	})
	return pod
}

// portForwardDialers returns client-go's two port-forward transports for a
// pod: WebSocket (the default since Kubernetes 1.31) and SPDY.
func portForwardDialers(t *testing.T, cfg *rest.Config, ns, pod string) map[string]httpstream.Dialer {
	u, err := url.Parse(cfg.Host)
	require.NoError(t, err)
	u.Path = fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", ns, pod)

	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	require.NoError(t, err)
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	wsDialer, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
	require.NoError(t, err)
	return map[string]httpstream.Dialer{"spdy": spdyDialer, "websocket": wsDialer}
}

// readThroughPortForward forwards a local port to the pod's port and reads
// what the pod side sends.
func readThroughPortForward(ctx context.Context, dialer httpstream.Dialer, port int) (string, error) {
	stop, ready := make(chan struct{}), make(chan struct{})
	var errOut strings.Builder
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, &errOut)
	if err != nil {
		return "", err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	defer func() { close(stop); <-errc }()
	select {
	case <-ready:
	case err := <-errc:
		errc <- err
		return "", err
	case <-ctx.Done():
		return "", ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil {
		return "", err
	}
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0].Local))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// One line: the pod side closing does not end the forwarded stream
	// until the client closes its side too.
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read: %w (port-forward said %q)", err, errOut.String())
	}
	return line, nil
}

func atoi(s string) int {
	var n int
	fmt.Sscanf(s, "%d", &n)
	return n
}

// eventually retries check until it succeeds or timeout passes, then fails
// the test with check's last error.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAPIServerOutage proves the outage helpers: a stopped API server
// refuses connections, and once restarted on the same address the cluster
// works again, kwok and the scheduler included.
func TestAPIServerOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[1]
	target, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "outage", Rules: podRules})
	require.NoError(t, err)
	client := kubernetes.NewForConfigOrDie(restConfig(t, target.Kubeconfig))

	c.StopAPIServer()
	_, err = client.CoreV1().Pods("outage").List(ctx, metav1.ListOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connection refused")

	require.NoError(t, c.StartAPIServer(ctx))
	pod := runPod(ctx, t, client, "outage", "after-restart")
	assert.Equal(t, corev1.PodRunning, pod.Status.Phase)
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
