package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// kwokDataDir is the folder under the bin dir where `make tools` copies the
// pinned kwok's stage and CRD manifests.
const kwokDataDir = "kwok-data"

// The kwok CRDs the clusters enable: how kwok's kubelet API finds what to
// do for a pod's port-forward, exec and logs.
var kwokCRDKinds = []string{"PortForward", "ClusterPortForward", "Exec", "ClusterExec", "Logs", "ClusterLogs"}

// KubeletAnnotation set to KubeletManual on a pod tells kwok to leave the
// pod's status alone: kwok's pod-ready stage would turn any Pending pod
// Running, so a test that plays kubelet (an image that cannot be pulled,
// say) marks the pod and writes its status itself. The step kubelet
// (RunStepPods) skips such pods too.
//
// A pod the test does not create itself (a step pod the gateway makes)
// asks for the same with its nodeSelector, KubeletManualSelector (a
// target's nodeSelector in YAML): every fake node carries that label, so
// such pods still schedule.
const (
	KubeletAnnotation     = "kwok.jetway-ci.dev/kubelet"
	KubeletManual         = "manual"
	KubeletManualSelector = "{" + KubeletAnnotation + ": " + KubeletManual + "}"
)

// manualKubelet says whether a test plays kubelet for the pod.
func manualKubelet(pod *corev1.Pod) bool {
	return pod.Annotations[KubeletAnnotation] == KubeletManual || pod.Spec.NodeSelector[KubeletAnnotation] == KubeletManual
}

// kwokStages are kwok's own node and pod lifecycles: nodes become Ready and
// keep a lease, pods go Pending -> Running, Job pods complete, deleted pods
// go away.
var kwokStages = []string{
	"node-initialize.yaml", "node-heartbeat-with-lease.yaml",
	"pod-ready.yaml", "pod-complete.yaml", "pod-delete.yaml",
}

var kwokCRDs = []string{
	"kwok.x-k8s.io_portforwards.yaml", "kwok.x-k8s.io_clusterportforwards.yaml",
	"kwok.x-k8s.io_execs.yaml", "kwok.x-k8s.io_clusterexecs.yaml",
	"kwok.x-k8s.io_logs.yaml", "kwok.x-k8s.io_clusterlogs.yaml",
}

var (
	crdGVR         = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	portForwardGVR = schema.GroupVersionResource{Group: "kwok.x-k8s.io", Version: "v1alpha1", Resource: "portforwards"}
	execGVR        = schema.GroupVersionResource{Group: "kwok.x-k8s.io", Version: "v1alpha1", Resource: "execs"}
)

// writeKwokConfig joins the stage manifests into the one file kwok reads;
// pod-ready skips pods whose kubelet is manual.
func writeKwokConfig(bin, dir string) (string, error) {
	var out []byte
	for _, name := range kwokStages {
		b, err := os.ReadFile(filepath.Join(bin, kwokDataDir, name))
		if err != nil {
			return "", err
		}
		if name == "pod-ready.yaml" {
			if b, err = skipManualPods(b); err != nil {
				return "", fmt.Errorf("patch %s: %w", name, err)
			}
		}
		out = append(append(out, "---\n"...), b...)
	}
	path := filepath.Join(dir, "kwok.yaml")
	return path, os.WriteFile(path, out, 0o600)
}

// skipManualPods adds to a Stage's selector that the pod neither is
// annotated nor selects nodes KubeletAnnotation: KubeletManual. kwok's
// selector keys are jq queries over the object; a missing key reads null,
// which NotIn matches.
func skipManualPods(stage []byte) ([]byte, error) {
	var obj map[string]any
	if err := yaml.Unmarshal(stage, &obj); err != nil {
		return nil, err
	}
	exprs, found, err := unstructured.NestedSlice(obj, "spec", "selector", "matchExpressions")
	if err != nil || !found {
		return nil, fmt.Errorf("no spec.selector.matchExpressions (%v)", err)
	}
	for _, field := range []string{".metadata.annotations", ".spec.nodeSelector"} {
		exprs = append(exprs, map[string]any{
			"key":      fmt.Sprintf("%s[%q]", field, KubeletAnnotation),
			"operator": "NotIn",
			"values":   []any{KubeletManual},
		})
	}
	if err := unstructured.SetNestedSlice(obj, exprs, "spec", "selector", "matchExpressions"); err != nil {
		return nil, err
	}
	return yaml.Marshal(obj)
}

func (c *Cluster) installKwokCRDs(ctx context.Context, bin string) error {
	for _, name := range kwokCRDs {
		b, err := os.ReadFile(filepath.Join(bin, kwokDataDir, name))
		if err != nil {
			return err
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(b, &obj.Object); err != nil {
			return fmt.Errorf("parse %s: %w", name, err)
		}
		if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
		if err := poll(ctx, c.apiserver, "CRD "+obj.GetName()+" established", func(ctx context.Context) (bool, error) {
			got, err := c.Dynamic.Resource(crdGVR).Get(ctx, obj.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// ForwardPodPort makes port-forwards to port of the pod namespace/pod
// connect to the local TCP address host:hostPort, as if a process in the pod
// listened there. It replaces any earlier forward for the pod.
func (c *Cluster) ForwardPodPort(ctx context.Context, namespace, pod string, port int32, host string, hostPort int) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kwok.x-k8s.io/v1alpha1",
		"kind":       "PortForward",
		"metadata":   map[string]any{"name": pod, "namespace": namespace},
		"spec": map[string]any{"forwards": []any{map[string]any{
			"ports":  []any{int64(port)},
			"target": map[string]any{"address": host, "port": int64(hostPort)},
		}}},
	}}
	res := c.Dynamic.Resource(portForwardGVR).Namespace(namespace)
	err := res.Delete(ctx, pod, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("replace port-forward for %s/%s: %w", namespace, pod, err)
	}
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("forward %s/%s:%s: %w", namespace, pod, strconv.Itoa(int(port)), err)
	}
	return nil
}
