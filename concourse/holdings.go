package concourse

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"code.cloudfoundry.org/garden"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// ContainerLabel marks a pod as a web node's container, with its Garden
// handle as the value: the pods Garden's Create makes for a target. A pod
// with this label counts as a container only if jetway sealed it
// (ownership.Key): a pod planted with the label is never reported to the
// web node, nor deleted when the web node names its handle.
const ContainerLabel = targets.ConcourseContainerLabel

// Holdings are what jetway holds for a web node on a target: the
// containers and volumes the worker reports at each sweep, and destroys
// when the web node names them.
type Holdings interface {
	// Containers are the handles of the target's containers. An error
	// means the list is not known now (the target's pods not listed yet,
	// the pod key not read): nothing is reported then, since a short list
	// would tell the web node its containers are missing.
	Containers(ctx context.Context, target string) ([]string, error)
	// DestroyContainer destroys a container the web node named: nil if
	// it is gone, ErrNotOurs if a pod with its handle is not jetway's.
	DestroyContainer(ctx context.Context, target, handle string) error
	// Volumes are the handles of the target's volumes.
	Volumes(ctx context.Context, target string) ([]string, error)
	// DestroyVolume destroys a volume the web node named.
	DestroyVolume(ctx context.Context, target, handle string) error
	// Release ends what the web node destroyed but jetway still keeps
	// for it (held.go), once it may: at each sweep.
	Release(ctx context.Context, target string) error
}

// ErrNotOurs: the web node named something to destroy that jetway did not
// make; it is left alone.
var ErrNotOurs = errors.New("not jetway's: left alone")

// PodTargets finds a target's pods (the targets registry).
type PodTargets interface {
	Target(name string) (*targets.Target, error)
}

// Pods are the holdings of cluster targets and agents' workers: a
// container is one the web node made (its record, Records), a pod jetway
// sealed carrying ContainerLabel, or a folder of an agent's; a volume is
// one its Holder keeps (nil: none), or the agent.
type Pods struct {
	Targets PodTargets
	// Key is the installation's pod key, zero until it is read.
	Key     func() ownership.Key
	Holder  *Holder
	Records *ContainerRecords
	// Agents hold the containers of the agents' workers (nil: none).
	Agents *Agents
	// KeepGrace is how long a destroyed container's pod is kept for the
	// volumes it holds (default DefaultKeepGrace).
	KeepGrace time.Duration
	// LostGrace is how long a lost container's record is kept (default
	// DefaultLostGrace).
	LostGrace time.Duration
	Metrics   *Metrics
	Logger    *slog.Logger
}

// Containers lists the target's containers: those recorded, and the
// sealed pods with ContainerLabel in the target's pod cache, or an
// agent's folders (a pod or folder whose record is gone is reported, so
// that the web node names it to destroy).
func (h Pods) Containers(ctx context.Context, target string) ([]string, error) {
	w, err := h.worker(target)
	if err != nil || w == nil {
		return nil, err
	}
	handles, err := w.containers(ctx)
	if err != nil {
		return nil, err
	}
	if h.Records == nil {
		return sortedHandles(handles), nil
	}
	recorded, err := h.Records.List(ctx, target)
	if err != nil {
		return nil, err
	}
	// A kept container is gone to the web node, and a lost one is gone:
	// neither is reported, nor is its pod.
	gone := map[string]bool{}
	for _, c := range recorded {
		lost, err := h.lost(ctx, w, c)
		if err != nil {
			return nil, err
		}
		if c.state.Kept.IsZero() && !lost {
			handles = append(handles, c.Handle())
		} else {
			gone[c.Handle()] = true
		}
	}
	return slices.DeleteFunc(sortedHandles(handles), func(h string) bool { return gone[h] }), nil
}

// lost reports whether recorded container ct is lost (lost.go), finding
// and recording it so on a cluster target.
func (h Pods) lost(ctx context.Context, w worker, ct *Container) (bool, error) {
	if !ct.state.Lost.IsZero() {
		return true, nil
	}
	cw, ok := w.(clusterWorker)
	if !ok || !ct.state.Kept.IsZero() {
		return false, nil
	}
	why, err := cw.lost(ctx, ct, false)
	if err != nil || why == "" {
		return false, err
	}
	if err := h.Records.markLost(ctx, ct, why, h.Metrics, h.logger().Warn); err != nil {
		h.logger().Warn("a lost container not recorded lost: the next sweep tries again", "target", ct.Target, "handle", ct.Handle(), "error", err.Error())
	}
	return true, nil
}

func (h Pods) logger() *slog.Logger { return cmp.Or(h.Logger, slog.New(slog.DiscardHandler)) }

// DestroyContainer deletes the sealed pods of handle (on an agent, its
// folder), then its record; a pod of that handle jetway did not seal
// stays, and the answer is ErrNotOurs.
func (h Pods) DestroyContainer(ctx context.Context, target, handle string) error {
	w, err := h.worker(target)
	if err != nil || w == nil {
		return err
	}
	if h.Records != nil {
		ct, err := h.Records.Get(ctx, target, handle)
		if err == nil {
			if kept, err := h.Records.keep(ctx, ct); kept || err != nil {
				return err
			}
		} else if !errors.As(err, new(garden.ContainerNotFoundError)) {
			return err
		}
	}
	err = w.destroyContainer(ctx, handle)
	if h.Records != nil && (err == nil || errors.Is(err, ErrNotOurs)) {
		if rerr := h.Records.Delete(ctx, target, handle); rerr != nil {
			return rerr
		}
	}
	return err
}

// Volumes lists the volumes the target's holder keeps.
func (h Pods) Volumes(ctx context.Context, target string) ([]string, error) {
	if h.Holder == nil {
		return nil, nil
	}
	return h.Holder.List(ctx, target)
}

// DestroyVolume destroys a volume the target's holder keeps: every volume
// there is one the web node made.
func (h Pods) DestroyVolume(ctx context.Context, target, handle string) error {
	if h.Holder == nil {
		return fmt.Errorf("volume %s: %w", handle, ErrNotOurs)
	}
	return h.Holder.Destroy(ctx, target, handle)
}

// worker is target's worker, nil (and no error) for a worker jetway does
// not know: it holds nothing there.
func (h Pods) worker(target string) (worker, error) {
	w, err := findWorker(h.Targets, h.Agents, func() steppod.Options { return steppod.Options{Key: h.Key()} }, nil, target)
	if errors.Is(err, errNoWorker) {
		return nil, nil
	}
	return w, err
}

// listed is target once its pods are listed, so that what jetway holds
// there can be told; nil, nil for an agent's target (not in the
// registry), which has no pods. A target not listed yet is an error, not
// "none": a short list would tell the web node its holdings are gone.
func listed(ts PodTargets, target string) (*targets.Target, error) {
	t, err := ts.Target(target)
	if errors.Is(err, targets.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if ok, err := t.Synced(); !ok {
		if err == nil {
			err = errors.New("not listed yet")
		}
		return nil, fmt.Errorf("the pods of target %s: %w", target, err)
	}
	return t, nil
}

// listWait bounds how long a create waits for a target's watches to list
// once: a target whose configuration changed is made anew, and lists
// again within moments.
const listWait = 10 * time.Second

// awaitListed waits, at most listWait, until target's pods are listed
// (listed answers without error), so that a create in the moment after
// its target.yaml changed does not fail the step. A target that is not
// a cluster target returns at once.
func awaitListed(ctx context.Context, ts PodTargets, target string) {
	ctx, cancel := context.WithTimeout(ctx, listWait)
	defer cancel()
	for {
		if _, err := listed(ts, target); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			return // the caller's own look says why
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// deletePod deletes p if it is still the pod listed (its UID).
func deletePod(ctx context.Context, t *targets.Target, p *corev1.Pod) error {
	uid := p.UID
	err := t.Core.Pods(t.Namespace()).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or another pod of that name now: not this one
	}
	return err
}
