package targets

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/kubecount"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/watchcache"
)

// Target is one target as every component acting on it sees it: its
// configuration, the clients for its cluster, built once per
// configuration (clients of one cluster share client-go's cached
// transport, so 1,000 targets on 3 clusters hold 3 connection pools), and
// a watch-fed cache of what this installation owns in its namespace: its
// step pods and its lifecycle record. The registry makes one per
// configuration and runs its watches while that configuration is current;
// health, lifecycle, placement and streams read it and never write back.
type Target struct {
	Config *Config
	Core   corev1client.CoreV1Interface
	Leases coordinationv1client.CoordinationV1Interface
	// Discovery makes the EndpointSlice of a volume holder that serves
	// images (steps.volumeHolder.images).
	Discovery discoveryv1client.DiscoveryV1Interface
	// Installation names this jetway installation in ownership labels.
	Installation string
	// Selector matches the objects this installation owns for the target.
	Selector string
	// RecordName names the lifecycle record ConfigMap and the Lease.
	RecordName string

	authz authorizationv1client.AuthorizationV1Interface
	raw   rest.Interface
	// rest is Config.REST, its requests counted in requests.
	rest     *rest.Config
	requests *kubecount.Counts

	pods   *watchcache.Cache // step pods, with their counts
	record *watchcache.Cache // the lifecycle record
}

// CachedPod returns a step pod as the watch last saw it, or nil. It is
// shared: do not modify it.
func (t *Target) CachedPod(name string) *corev1.Pod {
	if t.pods == nil {
		return nil // a Target made without its watch (tests): nothing cached
	}
	return t.pods.View().(podSummary).byName[name]
}

// PodsChanged returns a channel closed at the next change of the cached
// step pods.
func (t *Target) PodsChanged() <-chan struct{} { return t.pods.Changes() }

// AwaitPods waits until done holds for the cached step pods, checking on
// every change, or ctx ends.
func (t *Target) AwaitPods(ctx context.Context, done func(pods []*corev1.Pod) bool) error {
	return t.pods.Await(ctx, func(items []any) bool {
		pods := make([]*corev1.Pod, len(items))
		for i, it := range items {
			pods[i] = it.(*corev1.Pod)
		}
		return done(pods)
	})
}

// AwaitPodGone waits until the cached step pods show no pod of uid, or
// ctx ends: a pod of its name made before that could be confused with it
// by the kubelet, which finds the pod it execs and port-forwards into by
// name.
func (t *Target) AwaitPodGone(ctx context.Context, uid types.UID) error {
	return t.AwaitPods(ctx, func(pods []*corev1.Pod) bool {
		return !slices.ContainsFunc(pods, func(q *corev1.Pod) bool { return q.UID == uid })
	})
}

// ErrPodGone: the pod a call was made to is gone, deleted or replaced by
// another of its name.
var ErrPodGone = errors.New("the pod is gone")

// WhilePod returns ctx, cancelled with an ErrPodGone that says how once
// the cached step pods, having shown the pod name of uid, show it gone:
// deleted, or replaced by another of its name. A call to a pod that is
// gone then fails at once rather than at its timeout: a kubelet ends the
// streams to a pod it killed, but not every one does (kwok's forward
// waits for its client to end). A pod the watch never showed is never
// taken for gone (a watch still listing may show an older pod of the
// name). stop releases it, and must be called.
func (t *Target) WhilePod(ctx context.Context, name string, uid types.UID) (_ context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop = func() { cancel(nil) }
	if t.pods == nil {
		return ctx, stop // a Target made without its watch (tests)
	}
	go func() {
		seen := false
		for {
			changed := t.pods.Changes() // before the look, so no change is missed
			p := t.CachedPod(name)
			switch {
			case p != nil && p.UID == uid:
				seen = true
			case seen && p != nil:
				cancel(fmt.Errorf("pod %s/%s (uid %s) was replaced by another of its name (uid %s): %w",
					t.Namespace(), name, uid, p.UID, ErrPodGone))
				return
			case seen:
				cancel(fmt.Errorf("pod %s/%s (uid %s) was deleted: %w", t.Namespace(), name, uid, ErrPodGone))
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, stop
}

// StepTypeLabel says which kind of step a step pod runs: task, get, put or
// check. Build containers are steps of type task, get and put.
const StepTypeLabel = "jetway-ci.dev/step-type"

// HermeticLabel ("true") marks a step pod whose step may reach no network
// beyond its pod (Concourse's `hermetic: true`): the target's hermetic
// NetworkPolicy selects it, and its other policy does not
// (provision.Access.HermeticPolicy).
const HermeticLabel = "jetway-ci.dev/hermetic"

// ConcourseContainerLabel marks a Concourse web node's container's pod,
// with its Garden handle (concourse.ContainerLabel).
const ConcourseContainerLabel = "jetway-ci.dev/concourse-container"

// IsConcourseContainer reports whether p is a web node's container's pod:
// once the web node released its worker (Lifecycle.Released), one it
// keeps (a check's, a failed build's) holds no landing or retiring.
func IsConcourseContainer(p *corev1.Pod) bool { return p.Labels[ConcourseContainerLabel] != "" }

// VolumeHolderLabel marks the pod that keeps a Concourse web node's
// volumes on a target (concourse.Holder). It runs no step: it is not
// counted, and a landing target does not wait for it; retiring deletes it
// with the target's other pods.
const VolumeHolderLabel = "jetway-ci.dev/volume-holder"

// IsVolumeHolder reports whether p is labelled as a target's volume holder.
func IsVolumeHolder(p *corev1.Pod) bool { _, ok := p.Labels[VolumeHolderLabel]; return ok }

// RecordName is the name of a target's lifecycle record and Lease.
func RecordName(installation, target string) string {
	return "jetway-" + installation + "-" + target
}

// NewTarget builds a target's clients; it does not touch the network.
// Its cache fills once Run runs.
func NewTarget(cfg *Config, installation string) (*Target, error) {
	return newTarget(cfg, installation, "")
}

// newTarget is NewTarget whose clients say they are userAgent ("": jetway).
func newTarget(cfg *Config, installation, userAgent string) (*Target, error) {
	// Every request to the target's API server is counted, those made
	// with RESTConfig elsewhere (exec, port-forward) too.
	requests := &kubecount.Counts{}
	counted := rest.CopyConfig(cfg.REST)
	counted.Wrap(requests.Wrap)
	rc := rest.CopyConfig(counted)
	rc.QPS, rc.Burst, rc.UserAgent = 50, 100, cmp.Or(userAgent, "jetway")
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
	disc, err := discoveryv1client.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Name, err)
	}
	authz, err := authorizationv1client.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Name, err)
	}
	t := &Target{
		Config: cfg, Core: core, Leases: leases, Discovery: disc, Installation: installation,
		Selector:   ownership.Selector(cfg.Name, installation),
		RecordName: RecordName(installation, cfg.Name),
		authz:      authz, raw: authz.RESTClient(), rest: counted, requests: requests,
	}
	t.pods = watchcache.New(podsView)
	t.record = watchcache.New(t.recordView)
	return t, nil
}

// RESTConfig reaches the target's API server, with its credentials, for
// requests its clients do not make (exec, port-forward): they are
// counted with theirs. Do not modify it.
func (t *Target) RESTConfig() *rest.Config {
	if t.rest == nil {
		return t.Config.REST // a Target made without NewTarget (tests)
	}
	return t.rest
}

// Name is the target's name.
func (t *Target) Name() string { return t.Config.Name }

// Namespace is the target's namespace.
func (t *Target) Namespace() string { return t.Config.Meta.Namespace }

// Labels are the ownership labels of what jetway creates for the target.
func (t *Target) Labels() map[string]string {
	return ownership.Labels(t.Config.Name, t.Installation)
}

// Pod reads a pod of the target's namespace from the API server (not the
// cache: a pod made a moment ago is there).
func (t *Target) Pod(ctx context.Context, name string) (*corev1.Pod, error) {
	return t.Core.Pods(t.Namespace()).Get(ctx, name, metav1.GetOptions{})
}

// Run keeps the cache current until ctx ends: one watch of the target's
// step pods, filtered by the ownership labels, and one of its lifecycle
// record, by name (a foreign object of that name is seen, and refused). A
// broken watch (an API server restart) resumes, or relists when its place
// is gone; either way the cache then matches the cluster again.
func (t *Target) Run(ctx context.Context) {
	ns := t.Namespace()
	bySelector := func(o *metav1.ListOptions) { o.LabelSelector = t.Selector }
	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", t.RecordName).String()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		t.pods.Run(ctx, "pods of "+t.Name(), watchcache.ListWatch(t.Core.Pods(ns), bySelector), &corev1.Pod{})
	})
	wg.Go(func() {
		t.record.Run(ctx, "lifecycle of "+t.Name(), watchcache.ListWatch(t.Core.ConfigMaps(ns), byName), &corev1.ConfigMap{})
	})
	wg.Wait()
}

// Synced reports whether both watches have listed once, and if not, the
// last error of either.
func (t *Target) Synced() (bool, error) {
	okPods, errPods := t.pods.Synced()
	okRecord, errRecord := t.record.Synced()
	if errPods == nil {
		errPods = errRecord
	}
	return okPods && okRecord, errPods
}

// Counts are a target's live step counts, from its step pods.
type Counts struct {
	// ActiveContainers counts unfinished step pods.
	ActiveContainers int
	// BuildContainers counts unfinished step pods of type task, get or put.
	BuildContainers int
	// ActiveTasks counts unfinished step pods of type task.
	ActiveTasks int
	// ActiveVolumes counts the emptyDir volumes of step pods not being
	// deleted, finished or not: a step's inputs, outputs and caches live
	// there, and a finished step's outputs stay until the pod is deleted.
	ActiveVolumes int
}

// Counts returns the target's live counts (zero before the first list).
func (t *Target) Counts() Counts { return t.pods.View().(podSummary).counts }

// Holding names the target's unfinished step pods, sorted: what a landing
// target waits for.
func (t *Target) Holding() []string { return t.pods.View().(podSummary).holding }

// HoldingBut is Holding without the pods of Concourse containers, which
// hold no target whose worker the web node released.
func (t *Target) HoldingBut(released bool) []string {
	s := t.pods.View().(podSummary)
	if !released || len(s.held) == 0 {
		return s.holding
	}
	return slices.DeleteFunc(slices.Clone(s.holding), func(name string) bool { return s.held[name] })
}

// Pods returns the cached step pods. They are shared: do not modify them.
func (t *Target) Pods() []*corev1.Pod { return t.pods.View().(podSummary).pods }

// Lifecycle returns the lifecycle recorded in the target cluster, as last
// seen by the watch, and false before the first list. A record without
// this installation's ownership labels reads as none (see RecordProblem).
func (t *Target) Lifecycle() (Lifecycle, bool) {
	ok, _ := t.record.Synced()
	return t.record.View().(recordSummary).life, ok
}

// RecordProblem says what is wrong with the object where the target's
// lifecycle record belongs (ErrNotOurs), or nil.
func (t *Target) RecordProblem() error { return t.record.View().(recordSummary).problem }

// AwaitRecord waits until the cache has seen the lifecycle record at
// resourceVersion or later ("" waits for it to be gone), so that a decision
// just written shows in the next snapshot. It gives up when ctx ends.
func (t *Target) AwaitRecord(ctx context.Context, resourceVersion string) error {
	return t.record.Await(ctx, func(items []any) bool {
		if len(items) == 0 {
			return resourceVersion == ""
		}
		return resourceVersion != "" && watchcache.NotOlder(items[0].(*corev1.ConfigMap).ResourceVersion, resourceVersion)
	})
}

// podSummary is what the pods cache serves, computed on every change.
type podSummary struct {
	pods    []*corev1.Pod
	byName  map[string]*corev1.Pod // each step's runner looks its pod up on every change
	counts  Counts
	holding []string
	// held are the names of holding that are Concourse containers' pods.
	held map[string]bool
}

func podsView(items []any) any {
	s := podSummary{pods: make([]*corev1.Pod, 0, len(items)), byName: make(map[string]*corev1.Pod, len(items))}
	for _, it := range items {
		p := it.(*corev1.Pod)
		s.pods = append(s.pods, p)
		s.byName[p.Name] = p
		if IsVolumeHolder(p) {
			continue
		}
		if p.DeletionTimestamp == nil {
			for _, v := range p.Spec.Volumes {
				if v.EmptyDir != nil {
					s.counts.ActiveVolumes++
				}
			}
		}
		if !Finished(p) || p.DeletionTimestamp != nil {
			s.holding = append(s.holding, p.Name) // gone only once deleted
			if IsConcourseContainer(p) {
				if s.held == nil {
					s.held = map[string]bool{}
				}
				s.held[p.Name] = true
			}
		}
		if Finished(p) {
			continue
		}
		s.counts.ActiveContainers++
		switch p.Labels[StepTypeLabel] {
		case "task":
			s.counts.ActiveTasks++
			s.counts.BuildContainers++
		case "get", "put":
			s.counts.BuildContainers++
		}
	}
	slices.Sort(s.holding)
	return s
}

// StepEndedAnnotation marks a step pod whose step has ended, with the time
// (RFC 3339) it did. Its containers keep running so that its outputs stay
// served, but it holds no target and counts only its volumes.
const StepEndedAnnotation = "jetway-ci.dev/step-ended"

// Finished reports whether a pod's step is over: its containers have all
// ended, or jetway marked its step ended.
func Finished(p *corev1.Pod) bool {
	_, ended := p.Annotations[StepEndedAnnotation]
	return ended || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// recordSummary is what the record cache serves.
type recordSummary struct {
	life    Lifecycle
	problem error
}

// recordView decodes the record, unless it is not ours.
func (t *Target) recordView(items []any) any {
	if len(items) == 0 {
		return recordSummary{}
	}
	cm := items[0].(*corev1.ConfigMap)
	for k, v := range t.Labels() {
		if cm.Labels[k] != v {
			return recordSummary{problem: fmt.Errorf("configmap %s/%s %w", cm.Namespace, cm.Name, ErrNotOurs)}
		}
	}
	return recordSummary{life: DecodeLifecycle(cm.Data)}
}
