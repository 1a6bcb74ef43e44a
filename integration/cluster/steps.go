package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steps"
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
// makes (pods labelled steps.HandleLabel, and check sandboxes, labelled
// steps.SandboxLabel, whose kubelet no test plays, see
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
	for _, selector := range []string{steps.HandleLabel, steps.SandboxLabel} {
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
	errs []error
}

// stepPod is what the kubelet set up for one pod.
type stepPod struct {
	namespace, name string
	uid             types.UID
	root            string
	sidecar         *volumes.Server
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
		err = fmt.Errorf("step kubelet %s: set up pod %s: %w", k.c.Name, key, err)
		fmt.Fprintln(os.Stderr, err)
		k.errs = append(k.errs, err)
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
	if err := k.createExec(ctx, p); err != nil {
		return p, err
	}
	sidecar, err := volumes.Start(p.root)
	if err != nil {
		return p, fmt.Errorf("start volume sidecar: %w", err)
	}
	p.sidecar = sidecar
	if err := k.c.ForwardPodPort(ctx, p.namespace, p.name, stepagent.VolumePort, "127.0.0.1", sidecar.Port()); err != nil {
		return p, err
	}
	return p, nil
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
				"envs":    []any{map[string]any{"name": stepagent.RootEnv, "value": p.root}},
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

// teardown does what a kubelet does when a pod goes: kill its processes,
// then free what stood in for its containers and volumes.
func (k *stepKubelet) teardown(p *stepPod) {
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
