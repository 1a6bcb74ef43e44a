package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testTimeout = 60 * time.Second

// eventually polls check every 50 ms until it returns nil or the test's
// time is up, then fails with check's last error.
func eventually(t *testing.T, ctx context.Context, what string, check func() error) {
	t.Helper()
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func namespace(t *testing.T, ctx context.Context, c *Cluster, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "default service account", func() error {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func createPod(t *testing.T, ctx context.Context, c *Cluster, ns, name string, labels, annotations map[string]string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: StepContainer, Image: "example.invalid/step:1"}}},
	}
	got, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestManualKubeletPod plays kubelet for a pod annotated so: kwok leaves
// it Pending while it turns an ordinary pod, created after it was bound,
// Running, and keeps the image-pull failure the test then writes, as a
// kubelet reports it, while it turns another pod Running.
func TestManualKubeletPod(t *testing.T) {
	c := ForTest(t, 1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	namespace(t, ctx, c, "manual")
	pods := c.Client.CoreV1().Pods("manual")
	createPod(t, ctx, c, "manual", "pull", nil, map[string]string{KubeletAnnotation: KubeletManual})
	sel := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "by-selector"},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{KubeletAnnotation: KubeletManual},
			Containers: []corev1.Container{{Name: StepContainer, Image: "example.invalid/step:1"}}},
	}
	if _, err := pods.Create(ctx, sel, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pull", "by-selector"} {
		eventually(t, ctx, name+" scheduled", func() error {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" {
				return fmt.Errorf("not scheduled yet (%v)", err)
			}
			return nil
		})
	}
	runningPod(t, ctx, c, "manual", "first")
	var p *corev1.Pod
	for _, name := range []string{"by-selector", "pull"} {
		var err error
		if p, err = pods.Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending || len(p.Status.ContainerStatuses) != 0 {
			t.Fatalf("kwok set the status of manual pod %s: phase %q, containers %+v", name, p.Status.Phase, p.Status.ContainerStatuses)
		}
	}

	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"},
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: StepContainer, Image: p.Spec.Containers[0].Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "not found"}}}}
	written, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, c, "manual", "second")
	got, err := pods.Get(ctx, "pull", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != written.ResourceVersion || got.Status.Phase != corev1.PodPending {
		t.Fatalf("manual pod was changed after the test wrote its status: phase %q, containers %+v",
			got.Status.Phase, got.Status.ContainerStatuses)
	}
}

// runningPod creates an ordinary pod and waits until kwok runs it.
func runningPod(t *testing.T, ctx context.Context, c *Cluster, ns, name string) {
	t.Helper()
	createPod(t, ctx, c, ns, name, nil, nil)
	eventually(t, ctx, "pod "+name+" Running", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %q (%v)", p.Status.Phase, err)
		}
		return nil
	})
}

// TestStepPods runs the step kubelet: a step pod gets a root with the
// agent in it, execs through the API server run there, the volume sidecar
// answers through a port-forward, and deleting the pod kills what runs in
// it and removes the root.
func TestStepPods(t *testing.T) {
	c := ForTest(t, 1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho agent \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = c.RunStepPods(kctx, agent) })
	defer func() {
		stop()
		wg.Wait()
		if runErr != nil {
			t.Errorf("RunStepPods: %v", runErr)
		}
	}()
	namespace(t, ctx, c, "steps")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "s1", Labels: map[string]string{targets.StepTypeLabel: "task", steps.HandleLabel: "s1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: StepContainer, Image: "example.invalid/step:1"},
			{Name: SidecarContainer, Image: "example.invalid/agent:1",
				Env: []corev1.EnvVar{{Name: stepagent.TokenHashEnv, Value: ownership.TokenHash(sidecarToken)}}}}},
	}
	if _, err := c.Client.CoreV1().Pods("steps").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := c.StepRoot("steps", "s1")

	var out string
	eventually(t, ctx, "exec in the step container", func() (err error) {
		out, err = execIn(ctx, c, "steps", "s1", "sh", "-c", `pwd; echo "$`+stepagent.RootEnv+`"; bin/step-agent hello`)
		return err
	})
	if want := root + "\n" + root + "\nagent hello\n"; out != want {
		t.Fatalf("exec printed %q, want %q (working dir, %s, the agent)", out, want, stepagent.RootEnv)
	}

	checkSidecar(t, ctx, c, "steps", "s1")

	_, err := execIn(ctx, c, "steps", "s1", "sh", "-c",
		"mkdir -p run; setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > run/lock")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(stepagent.Path(root, stepagent.LockFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if !alive(pid) {
		t.Fatalf("sleep %d is not running", pid)
	}
	if err := c.Client.CoreV1().Pods("steps").Delete(ctx, "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod deleted: its process killed, its root and exec gone", func() error {
		if alive(pid) {
			return fmt.Errorf("sleep %d still runs", pid)
		}
		if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("root %s still there (%v)", root, err)
		}
		_, err := c.Dynamic.Resource(execGVR).Namespace("steps").Get(ctx, "s1", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("exec object: %v", err)
		}
		return nil
	})
}

// alive says whether pid runs: it exists and is no zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// execIn runs a command in the pod's step container through the API server
// (over WebSocket) and returns its stdout, or an error with its stderr.
func execIn(ctx context.Context, c *Cluster, ns, pod string, cmd ...string) (string, error) {
	req := c.Client.CoreV1().RESTClient().Get().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: StepContainer, Command: cmd, Stdout: true, Stderr: true},
			scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(c.AdminConfig(), "GET", req.URL().String())
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ex.StreamWithContext(ectx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return "", fmt.Errorf("exec %q: %w (stderr %q)", cmd, err, stderr.String())
	}
	return stdout.String(), nil
}

// checkSidecar creates a volume through a port-forward to the pod's
// volume port and finds its folder under the step root.
func checkSidecar(t *testing.T, ctx context.Context, c *Cluster, ns, pod string) {
	t.Helper()
	var status int
	// A new port-forward per try: client-go's forwarder ends for good when
	// kwok answers "no forward found", as it does until it has seen the
	// pod's PortForward.
	eventually(t, ctx, "POST /volumes through the port-forward", func() error {
		code, err := postVolume(ctx, c, ns, pod, "")
		status = code
		return err
	})
	if status != http.StatusUnauthorized {
		t.Fatalf("POST /volumes without the pod's token: status %d, want 401", status)
	}
	status, err := postVolume(ctx, c, ns, pod, sidecarToken)
	if err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
	if status != http.StatusCreated {
		t.Fatalf("POST /volumes: status %d, want 201", status)
	}
	if _, err := os.Stat(filepath.Join(c.StepRoot(ns, pod), stepagent.VolumesDir, "v1")); err != nil {
		t.Fatalf("volume not under the step root: %v", err)
	}
}

// sidecarToken is the token of the test pod's sidecar: its hash is in the
// pod's spec, as a gateway puts it there.
const sidecarToken = "s1-sidecar-token"

// postVolume creates volume v1 through a fresh port-forward to the pod's
// volume port, with token if not "", and returns the answer's status.
func postVolume(ctx context.Context, c *Cluster, ns, pod, token string) (int, error) {
	rt, upgrader, err := spdy.RoundTripperFor(c.AdminConfig())
	if err != nil {
		return 0, err
	}
	u, err := url.Parse(c.Server + "/api/v1/namespaces/" + ns + "/pods/" + pod + "/portforward")
	if err != nil {
		return 0, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, "POST", u)
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"},
		[]string{"0:" + strconv.Itoa(stepagent.VolumePort)}, stopCh, readyCh, io.Discard, io.Discard)
	if err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	defer func() { close(stopCh); <-done }()
	select {
	case <-readyCh:
	case err := <-done:
		return 0, fmt.Errorf("port-forward: %w", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, "POST", "http://127.0.0.1:"+strconv.Itoa(int(ports[0].Local))+"/volumes",
		strings.NewReader(`{"handle":"v1"}`))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
