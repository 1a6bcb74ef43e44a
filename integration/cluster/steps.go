package cluster

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
)

// StepContainer and SidecarContainer are the containers of a step pod
// that the step kubelet runs execs for (jetway's step pods name their
// main container and their volume sidecar so): both run in the pod's
// root, as both have the emptyDir as their working dir in a real pod.
const (
	StepContainer    = "step"
	SidecarContainer = "volumes"
)

// stepCleanupTimeout bounds deleting a pod's kwok objects once it is gone.
const stepCleanupTimeout = 10 * time.Second

// RunStepPods plays the part of a kubelet for the step pods the gateway
// makes (pods labelled steps.HandleLabel, check sandboxes, labelled
// steps.SandboxLabel, and volume holders, labelled
// targets.VolumeHolderLabel, whose kubelet no test plays, see
// KubeletAnnotation; tests that make step-like pods by hand serve them
// themselves) until ctx ends, then tears every pod down and returns
// once all it started is gone. For each pod it:
//
//   - makes StepRoot(ns, pod), standing in for the pod's emptyDir, and
//     copies agentBin to <root>/bin/step-agent, as the init container
//     does in a real pod (kwok runs no init containers; "" copies nothing);
//   - creates a kwok Exec named after the pod, so that pods/exec into the
//     step container runs the command as a local process in the root with
//     JETWAY_STEP_ROOT=<root> (the relative command bin/step-agent works
//     here as in a pod, whose working dir is /jetway). kwok takes a moment
//     (~230 ms) to see it: until then execs fail "no exec found";
//   - serves <root>/volumes with the volume sidecar, forwarded from the
//     pod's port stepagent.VolumePort.
//
// When the pod is deleted it SIGKILLs the pod's processes (the process
// groups of the supervisor, whose pid is in run/lock, and of the step, in
// run/started.json), stops the sidecar, deletes the kwok objects and the
// root. Errors setting a pod up are printed and returned at the end.
func (c *Cluster) RunStepPods(ctx context.Context, agentBin string) error {
	k := &stepKubelet{c: c, agentBin: agentBin, pods: map[string]*stepPod{}}
	var wg sync.WaitGroup
	for _, selector := range []string{steps.HandleLabel, steps.SandboxLabel, targets.VolumeHolderLabel, concourse.ContainerLabel} {
		inf := coreinformers.NewFilteredPodInformer(c.Client, metav1.NamespaceAll, 0, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = selector })
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.sync(ctx, obj) },
			UpdateFunc: func(_, obj any) { k.sync(ctx, obj) },
			DeleteFunc: func(obj any) { k.gone(obj) },
		}); err != nil {
			return fmt.Errorf("step kubelet %s: watch pods: %w", c.Name, err)
		}
		wg.Go(func() { inf.RunWithContext(ctx) }) // returns once its handlers have
	}
	wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, p := range k.pods {
		k.teardown(p)
		delete(k.pods, key)
	}
	k.errMu.Lock()
	defer k.errMu.Unlock()
	return errors.Join(k.errs...)
}

// StepRoot is the folder standing in for the emptyDir of the step pod
// namespace/pod while the step kubelet runs it.
func (c *Cluster) StepRoot(namespace, pod string) string {
	return filepath.Join(c.dir, "steps", namespace, pod)
}

type stepKubelet struct {
	c        *Cluster
	agentBin string

	mu   sync.Mutex
	pods map[string]*stepPod // by namespace/name

	errMu sync.Mutex
	errs  []error
}

// stepPod is what the kubelet set up for one pod.
type stepPod struct {
	namespace, name string
	uid             types.UID
	root            string
	sidecar         *volumes.Server
	cancel          context.CancelFunc // stops making the Exec
	execMade        chan struct{}      // closed once the Exec is made, or given up
}

func (k *stepKubelet) sync(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	k.mu.Lock()
	defer k.mu.Unlock()
	if old := k.pods[key]; old != nil {
		if old.uid == pod.UID && pod.DeletionTimestamp == nil {
			return // running already
		}
		k.teardown(old) // being deleted, or replaced by a pod of the same name
		delete(k.pods, key)
	}
	if pod.DeletionTimestamp != nil || manualKubelet(pod) || ctx.Err() != nil {
		return
	}
	p, err := k.setup(ctx, pod)
	if err != nil {
		k.fail(fmt.Errorf("step kubelet %s: set up pod %s: %w", k.c.Name, key, err))
	}
	if p != nil {
		k.pods[key] = p
	}
}

func (k *stepKubelet) gone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	k.mu.Lock()
	defer k.mu.Unlock()
	if p := k.pods[key]; p != nil && p.uid == pod.UID {
		k.teardown(p)
		delete(k.pods, key)
	}
}

// setup lays out the pod's root, starts its sidecar and creates its kwok
// objects. What it started before an error is returned for teardown.
func (k *stepKubelet) setup(ctx context.Context, pod *corev1.Pod) (*stepPod, error) {
	p := &stepPod{namespace: pod.Namespace, name: pod.Name, uid: pod.UID,
		root: k.c.StepRoot(pod.Namespace, pod.Name)}
	if err := os.RemoveAll(p.root); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(p.root, stepagent.VolumesDir), 0o755); err != nil {
		return nil, err
	}
	if k.agentBin != "" {
		if err := copyExecutable(k.agentBin, stepagent.Path(p.root, stepagent.BinPath)); err != nil {
			return p, fmt.Errorf("install agent: %w", err)
		}
	}
	if err := standInForMounts(p.root, pod); err != nil {
		return p, err
	}
	sidecar, err := volumes.Start(p.root, sidecarTokenHash(pod))
	if err != nil {
		return p, fmt.Errorf("start volume sidecar: %w", err)
	}
	p.sidecar = sidecar
	if err := k.c.ForwardPodPort(ctx, p.namespace, p.name, stepagent.VolumePort, "127.0.0.1", sidecar.Port()); err != nil {
		return p, err
	}
	// kwok sees a new PortForward a moment later (~230 ms, seconds on a
	// busy machine), and until then a port-forward fails "no forward
	// found"; a real kubelet forwards as soon as the sidecar listens. The
	// Exec is made once the forward works, so that a gateway, whose first
	// exec into the pod waits for it, never streams into the pod before.
	pctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	p.execMade = make(chan struct{})
	go func() {
		defer close(p.execMade)
		err := k.c.awaitForward(pctx, p.namespace, p.name, stepagent.VolumePort)
		if err == nil {
			err = k.createExec(pctx, p)
		}
		if err != nil && pctx.Err() == nil {
			k.fail(fmt.Errorf("step kubelet %s: set up pod %s/%s: %w", k.c.Name, p.namespace, p.name, err))
		}
	}()
	return p, nil
}

func (k *stepKubelet) fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	k.errMu.Lock()
	defer k.errMu.Unlock()
	k.errs = append(k.errs, err)
}

// awaitForward waits until a port-forward through the API server to the
// pod's port reaches what listens there: an HTTP request through it gets
// an answer.
func (c *Cluster) awaitForward(ctx context.Context, namespace, pod string, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg := c.AdminConfig()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return err
	}
	url := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("portforward").URL()
	try := func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, url)
		conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		if err != nil {
			return err
		}
		defer conn.Close()
		go func() { <-ctx.Done(); conn.Close() }()
		h := http.Header{}
		h.Set(corev1.StreamType, corev1.StreamTypeError)
		h.Set(corev1.PortHeader, strconv.Itoa(port))
		h.Set(corev1.PortForwardRequestIDHeader, "0")
		errStream, err := conn.CreateStream(h)
		if err != nil {
			return err
		}
		errStream.Close()
		h.Set(corev1.StreamType, corev1.StreamTypeData)
		data, err := conn.CreateStream(h)
		if err != nil {
			return err
		}
		if _, err := io.WriteString(data, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		answer, _ := io.ReadAll(io.LimitReader(data, 12))
		if !strings.HasPrefix(string(answer), "HTTP/") {
			msg, _ := io.ReadAll(io.LimitReader(errStream, 1024))
			return fmt.Errorf("port-forward to %s/%s:%d: no answer (%s)", namespace, pod, port, msg)
		}
		return nil
	}
	return poll(ctx, nil, "port-forward to "+namespace+"/"+pod, func(context.Context) (bool, error) {
		err := try()
		return err == nil, err
	})
}

// createExec makes pods/exec into the step container run locally in root.
func (k *stepKubelet) createExec(ctx context.Context, p *stepPod) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kwok.x-k8s.io/v1alpha1",
		"kind":       "Exec",
		"metadata":   map[string]any{"name": p.name, "namespace": p.namespace},
		"spec": map[string]any{"execs": []any{map[string]any{
			"containers": []any{StepContainer, SidecarContainer},
			"local": map[string]any{
				"workDir": p.root,
				"envs": []any{map[string]any{"name": stepagent.RootEnv, "value": p.root},
					map[string]any{"name": stepagent.FSEnv, "value": filepath.Join(p.root, containerFS)}},
			},
		}}},
	}}
	res := k.c.Dynamic.Resource(execGVR).Namespace(p.namespace)
	if err := res.Delete(ctx, p.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("replace exec: %w", err)
	}
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create exec: %w", err)
	}
	return nil
}

// containerFS is the folder of a pod's root standing in for its step
// container's own filesystem (stepagent.FSEnv): a kwok exec runs a local
// process, which takes an absolute working dir under it.
const containerFS = "fs"

// standInForMounts makes, for each mount of a folder of the pod's emptyDir
// (a subPath) in its step container, that folder and a link to it at the
// mount's path under containerFS, as a kubelet mounts it there.
func standInForMounts(root string, pod *corev1.Pod) error {
	for _, c := range pod.Spec.Containers {
		if c.Name != StepContainer {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.SubPath == "" {
				continue
			}
			dir := filepath.Join(root, filepath.FromSlash(m.SubPath))
			link := filepath.Join(root, containerFS, filepath.FromSlash(m.MountPath))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(dir, link); err != nil {
				return fmt.Errorf("stand in for mount %s: %w", m.MountPath, err)
			}
		}
	}
	return nil
}

// teardown does what a kubelet does when a pod goes: kill its processes,
// then free what stood in for its containers and volumes.
func (k *stepKubelet) teardown(p *stepPod) {
	if p.cancel != nil {
		p.cancel()
		<-p.execMade
	}
	killStepProcesses(p.root)
	if p.sidecar != nil {
		_ = p.sidecar.Kill()
	}
	ctx, cancel := context.WithTimeout(context.Background(), stepCleanupTimeout)
	defer cancel()
	for _, gvr := range []schema.GroupVersionResource{execGVR, portForwardGVR} {
		err := k.c.Dynamic.Resource(gvr).Namespace(p.namespace).Delete(ctx, p.name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "step kubelet %s: delete %s %s/%s: %v\n", k.c.Name, gvr.Resource, p.namespace, p.name, err)
		}
	}
	_ = os.RemoveAll(p.root)
}

// killStepProcesses SIGKILLs the process groups of the supervisor and of
// the step, and those processes themselves should they lead no group; in
// a sandbox pod, those of every run.
func killStepProcesses(root string) {
	runs, _ := os.ReadDir(filepath.Join(root, stepagent.RunsDir))
	for _, run := range runs {
		killStepProcesses(filepath.Join(root, stepagent.RunsDir, run.Name()))
	}
	var pids []int
	if b, err := os.ReadFile(stepagent.Path(root, stepagent.DaemonLock)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid) // a sandbox's session daemon
		}
	}
	if b, err := os.ReadFile(stepagent.Path(root, stepagent.LockFile)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid)
		}
	}
	if b, err := os.ReadFile(stepagent.Path(root, stepagent.StartedFile)); err == nil {
		var s stepagent.Started
		if json.Unmarshal(b, &s) == nil {
			pids = append(pids, s.PID)
		}
	}
	for _, pid := range pids {
		if pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sidecarTokenHash is the token hash in the pod's volume sidecar's
// environment, as a real sidecar reads it; a pod without one (a check
// sandbox) gets a server nobody holds a token of.
func sidecarTokenHash(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == stepagent.TokenHashEnv {
				return e.Value
			}
		}
	}
	return ownership.TokenHash(rand.Text())
}
