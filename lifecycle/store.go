package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/targets"
)

// Keys of the lifecycle record's data.
const (
	keyState      = "state"
	keySince      = "since"
	keyConfigHash = "config-sha256"
	// keyPruned holds the hash of the configuration that was pruned.
	keyPruned = "pruned-config-sha256"
)

// kube is what the controller needs of one target's cluster; clients of one
// cluster share client-go's cached transport.
type kube struct {
	cfg    *targets.Config
	core   corev1client.CoreV1Interface
	leases coordinationv1client.CoordinationV1Interface
	ns     string
	name   string // of the record ConfigMap and the Lease
	labels map[string]string
	sel    string
}

func newKube(cfg *targets.Config, installation string) (*kube, error) {
	rc := rest.CopyConfig(cfg.REST)
	rc.QPS, rc.Burst, rc.UserAgent = 50, 100, "jetway"
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Name, err)
	}
	core, err := corev1client.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Name, err)
	}
	leases, err := coordinationv1client.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Name, err)
	}
	return &kube{
		cfg: cfg, core: core, leases: leases, ns: cfg.Meta.Namespace,
		name:   "jetway-" + installation + "-" + cfg.Name,
		labels: ownership.Labels(cfg.Name, installation),
		sel:    ownership.Selector(cfg.Name, installation),
	}, nil
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
		return targets.Lifecycle{}, fmt.Errorf("read lifecycle of %s: %w", k.cfg.Name, err)
	}
	return decode(cm), nil
}

// ErrNotOurs means an object with the name jetway uses exists but lacks
// jetway's ownership labels: jetway never modifies or deletes it.
var ErrNotOurs = errors.New("exists without this installation's ownership labels; jetway leaves it alone")

// mine checks that an object found by name carries our ownership labels.
func (k *kube) mine(kind string, meta metav1.ObjectMeta) error {
	for key, v := range k.labels {
		if meta.Labels[key] != v {
			return fmt.Errorf("%s %s/%s %w", kind, k.ns, meta.Name, ErrNotOurs)
		}
	}
	return nil
}

func decode(cm *corev1.ConfigMap) targets.Lifecycle {
	since, _ := time.Parse(time.RFC3339, cm.Data[keySince])
	return targets.Lifecycle{State: targets.State(cm.Data[keyState]), Since: since,
		ConfigHash: cm.Data[keyConfigHash], PrunedHash: cm.Data[keyPruned]}
}

// encode is the record's data for life; empty fields are left out.
func encode(life targets.Lifecycle) map[string]string {
	data := map[string]string{}
	for key, v := range map[string]string{keyState: string(life.State), keyConfigHash: life.ConfigHash, keyPruned: life.PrunedHash} {
		if v != "" {
			data[key] = v
		}
	}
	if !life.Since.IsZero() {
		data[keySince] = life.Since.UTC().Format(time.RFC3339)
	}
	return data
}

// update changes the record with optimistic concurrency: mutate sees the
// current value and returns the new one, or false to leave it as it is.
// Conflicting writers (other replicas) make it re-read and retry.
func (k *kube) update(ctx context.Context, mutate func(targets.Lifecycle) (targets.Lifecycle, bool)) (targets.Lifecycle, error) {
	var result targets.Lifecycle
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
			current = decode(cm)
		}
		next, change := mutate(current)
		result = current
		if !change {
			return nil
		}
		data := encode(next)
		if cm == nil {
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.ns, Labels: k.labels},
				Data:       data,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), k.name, err)
			}
		} else {
			cm.Data = data
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			result = next
		}
		return err
	})
	if err != nil {
		return result, fmt.Errorf("record lifecycle of %s: %w", k.cfg.Name, err)
	}
	return result, nil
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
		return fmt.Errorf("forget lifecycle of %s: %w", k.cfg.Name, err)
	}
	err = k.core.ConfigMaps(k.ns).Delete(ctx, k.name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("forget lifecycle of %s: %w", k.cfg.Name, err)
	}
	return nil
}

// ownedPods lists the target's step pods: those with its ownership labels.
func (k *kube) ownedPods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := k.core.Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.sel})
	if err != nil {
		return nil, fmt.Errorf("list step pods of %s: %w", k.cfg.Name, err)
	}
	return list.Items, nil
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// finishedAt is when a finished pod's last container ended, else when it
// was created.
func finishedAt(p *corev1.Pod) time.Time {
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
