package lifecycle

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

	"github.com/jetway-ci/jetway/targets"
)

// kube is what the controller needs of one target's cluster, taken from
// the target's shared clients.
type kube struct {
	t      *targets.Target
	core   corev1client.CoreV1Interface
	leases coordinationv1client.CoordinationV1Interface
	ns     string
	name   string // of the record ConfigMap and the Lease
	labels map[string]string
	sel    string
}

func newKube(t *targets.Target) *kube {
	return &kube{t: t, core: t.Core, leases: t.Leases, ns: t.Namespace(), name: t.RecordName,
		labels: t.Labels(), sel: t.Selector}
}

// read returns the recorded lifecycle; a missing record is the zero value.
func (k *kube) read(ctx context.Context) (targets.Lifecycle, error) {
	cm, err := k.core.ConfigMaps(k.ns).Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return targets.Lifecycle{}, nil
	}
	if err == nil {
		err = k.mine("configmap", cm.ObjectMeta)
	}
	if err != nil {
		return targets.Lifecycle{}, fmt.Errorf("read lifecycle of %s: %w", k.t.Name(), err)
	}
	return targets.DecodeLifecycle(cm.Data), nil
}

// ErrNotOurs means an object with the name jetway uses exists but lacks
// jetway's ownership labels: jetway never modifies or deletes it.
var ErrNotOurs = targets.ErrNotOurs

// mine checks that an object found by name carries our ownership labels.
func (k *kube) mine(kind string, meta metav1.ObjectMeta) error {
	for key, v := range k.labels {
		if meta.Labels[key] != v {
			return fmt.Errorf("%s %s/%s %w", kind, k.ns, meta.Name, ErrNotOurs)
		}
	}
	return nil
}

// update changes the record with optimistic concurrency: mutate sees the
// current value and returns the new one, or false to leave it as it is.
// Conflicting writers (other replicas) make it re-read and retry. It
// returns the lifecycle now recorded and the record's resource version.
func (k *kube) update(ctx context.Context, mutate func(targets.Lifecycle) (targets.Lifecycle, bool)) (targets.Lifecycle, string, error) {
	var result targets.Lifecycle
	var version string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cms := k.core.ConfigMaps(k.ns)
		cm, err := cms.Get(ctx, k.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm, err = nil, nil
		} else if err == nil {
			err = k.mine("configmap", cm.ObjectMeta)
		}
		if err != nil {
			return err
		}
		current := targets.Lifecycle{}
		if cm != nil {
			current, version = targets.DecodeLifecycle(cm.Data), cm.ResourceVersion
		}
		next, change := mutate(current)
		result = current
		if !change {
			return nil
		}
		var written *corev1.ConfigMap
		if cm == nil {
			written, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.ns, Labels: k.labels},
				Data:       next.Data(),
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), k.name, err)
			}
		} else {
			cm.Data = next.Data()
			written, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			result, version = next, written.ResourceVersion
		}
		return err
	})
	if err != nil {
		return result, "", fmt.Errorf("record lifecycle of %s: %w", k.t.Name(), err)
	}
	return result, version, nil
}

// forget deletes the record, bringing the target back as new. The read
// before it checked the record is ours; the precondition keeps it so.
func (k *kube) forget(ctx context.Context) error {
	cm, err := k.core.ConfigMaps(k.ns).Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		err = k.mine("configmap", cm.ObjectMeta)
	}
	if err != nil {
		return fmt.Errorf("forget lifecycle of %s: %w", k.t.Name(), err)
	}
	err = k.core.ConfigMaps(k.ns).Delete(ctx, k.name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("forget lifecycle of %s: %w", k.t.Name(), err)
	}
	return nil
}

// ownedPods lists the target's step pods, those with its ownership labels,
// from the API server: what an action checks before it acts (the cache
// may be a moment behind).
func (k *kube) ownedPods(ctx context.Context) ([]*corev1.Pod, error) {
	list, err := k.core.Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.sel})
	if err != nil {
		return nil, fmt.Errorf("list step pods of %s: %w", k.t.Name(), err)
	}
	pods := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[i] = &list.Items[i]
	}
	return pods, nil
}

// finishedAt is when a finished pod's last container ended, else when it
// was created.
func finishedAt(p *corev1.Pod) time.Time {
	if v, ok := p.Annotations[targets.StepEndedAnnotation]; ok {
		if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return at
		}
	}
	var at time.Time
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.FinishedAt.After(at) {
			at = t.FinishedAt.Time
		}
	}
	if at.IsZero() {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.LastTransitionTime.After(at) {
				at = c.LastTransitionTime.Time
			}
		}
	}
	if at.IsZero() {
		at = p.CreationTimestamp.Time
	}
	return at
}
