package concourse

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/jetway-ci/jetway/internal/httpjson"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// A web node's volumes live in one pod per target, its volume holder
// (steppod.HolderPod): the step pods' volume sidecar alone, serving
// an emptyDir. The worker's volume (baggageclaim) API is served by the
// gateway, which passes each call to the holder's sidecar with the pod's
// token; the holder is made by the first create, so that a target whose
// web node makes no volume runs no pod for it. What the web node stored
// (files, properties, privileged) lives in the target cluster: a
// restarted gateway, or another replica, answers the same.

// VolumeServer sends one request to a pod's volume server
// (streams.Streamer.VolumeServer).
type VolumeServer func(ctx context.Context, target, pod, method, path string, q url.Values, h http.Header, body io.Reader) (*http.Response, error)

// Holder keeps a web node's volumes in each target's volume holder.
type Holder struct {
	Targets PodTargets
	// Pod are the step pods' options (the agent image, the installation,
	// the pod key); read at each use, since the key is read after start.
	Pod    func() steppod.Options
	Server VolumeServer
	// Agents keep the volumes of the agents' workers (nil: none).
	Agents *Agents
	// Ready bounds the wait for a new holder to run and answer.
	Ready time.Duration
	// BindGrace is how long a holder pod sealed but not bound is given to
	// be bound by the gateway that made it (default holderBindGrace).
	BindGrace time.Duration
	// Stream copies a volume between two pods of a target
	// (streams.Streamer.Stream): into a container's pod before its first
	// process, and out of a pod that holds a volume (held.go).
	Stream  func(ctx context.Context, req streams.Request) (wire.StreamResult, error)
	Metrics *Metrics
	Logger  *slog.Logger

	settling singleflight.Group // settles under way, by target and handle
	mu       sync.Mutex
	ctx      context.Context // Start's, for the async creates; nil before
	wg       sync.WaitGroup
	futures  map[string]*future // async creates, by target and handle
	// served are the holder pods (by UID) whose images are served
	// (images.go): their Service is made as they start, so that the
	// nodes' kube-proxy has its rules long before a pull.
	served sync.Map
}

// future is an async create: done is closed once vol or err is set.
type future struct {
	done  chan struct{}
	vol   json.RawMessage
	err   error
	began time.Time
}

// Bounds of the async creates: how many may wait for the web node to
// collect them, and for how long.
const (
	maxFutures   = 1024
	futureTTL    = 10 * time.Minute
	maxCreate    = 1 << 20 // bytes of a create's body
	holderReady  = 2 * time.Minute
	holderPoll   = 200 * time.Millisecond
	holderAnswer = 30 * time.Second // for a new holder's port-forward to work
	holderCall   = 30 * time.Second // a list or a destroy
	// holderGone bounds the wait for a replaced holder pod to be stopped
	// by its kubelet (a second's grace, then the kubelet's own pace).
	holderGone   = 20 * time.Second
	holderCreate = 10 * time.Minute // a create, which may copy a volume
)

// Start runs the async creates until ctx ends, then waits for them.
func (h *Holder) Start(ctx context.Context) error {
	h.mu.Lock()
	h.ctx = ctx
	h.mu.Unlock()
	<-ctx.Done()
	h.wg.Wait()
	return nil
}

// Errors of a worker's volumes.
var (
	// errNoHolder: the worker has no volume holder, so no volume.
	errNoHolder = errors.New("no volume holder")
	// errHolderToMake: a cluster target has no volume holder pod yet;
	// the first create makes it.
	errHolderToMake = fmt.Errorf("%w pod yet", errNoHolder)
)

// volumeSender sends one request to a worker's volume server (its volume
// holder pod's sidecar, or an agent's): path is the volume API's.
type volumeSender func(ctx context.Context, method, path string, q url.Values, h http.Header, body io.Reader) (*http.Response, error)

// worker is target's worker, whose volumes h keeps: errNoHolder for a
// worker jetway does not know.
func (h *Holder) worker(target string) (worker, error) {
	w, err := findWorker(h.Targets, h.Agents, h.Pod, nil, target)
	if errors.Is(err, errNoWorker) {
		return nil, fmt.Errorf("worker %s is neither a cluster target nor an agent joined to this gateway: "+
			"jetway keeps no volumes for it: %w", target, errNoHolder)
	}
	return w, err
}

// volumes is where target's volumes are served: errNoHolder if it keeps
// none.
func (h *Holder) volumes(target string) (volumeSender, error) {
	w, err := h.worker(target)
	if err != nil {
		return nil, err
	}
	return w.volumes(h)
}

// holderPod is the name of cluster target t's volume holder pod if there
// is one and it is jetway's: errHolderToMake if there is none (an
// awayHolder if its volumes are kept on a claim), an unboundHolder if it
// is sealed but not bound, errNoHolder for a pod of that name jetway did
// not seal (which is never used), a lostHolder if it ended.
func (h *Holder) holderPod(t *targets.Target, opts steppod.Options) (string, error) {
	name := steppod.HolderName(opts.Installation)
	p := t.CachedPod(name)
	if p == nil || p.DeletionTimestamp != nil {
		if class, _ := steppod.HolderStorage(t, opts); class != "" {
			return name, &awayHolder{namespace: t.Namespace(), name: name}
		}
		return name, errHolderToMake
	}
	switch why := opts.Key.Verdict(t.Name(), p); why {
	case ownership.Unsealed:
		// Planted: it gets no request. The worker holds no volume, and
		// makes none.
		h.Metrics.podRefused(why)
		return "", fmt.Errorf("pod %s/%s carries the volume holder's name and labels but jetway did not make it: "+
			"left alone, and no volume is kept on this worker until it is gone: %w", t.Namespace(), name, errNoHolder)
	case ownership.Unbound:
		return name, &unboundHolder{p}
	}
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return name, &lostHolder{p}
	}
	return name, nil
}

// lostHolder: the volume holder pod ended (evicted past its emptyDir's
// limit or for its node's pressure, its node lost): it never runs again.
// The sweep and the next create replace it. With an emptyDir the volumes
// it held went with it: it is a worker without volumes (errNoHolder), the
// sweep reports none, so the web node marks them missing and makes them
// again. With a claim (kept) they wait on the claim for the new holder.
type lostHolder struct{ pod *corev1.Pod }

func (e *lostHolder) Error() string {
	why := string(e.pod.Status.Phase)
	if e.pod.Status.Reason != "" {
		why += ": " + e.pod.Status.Reason
	}
	if e.pod.Status.Message != "" {
		why += ": " + e.pod.Status.Message
	} else if c := disruption(e.pod); c != nil {
		why += ": " + c.Reason + ": " + c.Message
	}
	if claim := steppod.HolderClaimName(e.pod); claim != "" {
		return fmt.Sprintf("the volume holder pod %s ended (%s): it is made again, and the volumes on its claim %s wait for it",
			e.pod.Name, why, claim)
	}
	return fmt.Sprintf("the volume holder pod %s ended (%s): the volumes it held are gone", e.pod.Name, why)
}

// Unwrap is errNoHolder (no volume) for an emptyDir's holder; one whose
// volumes are kept on a claim is not without volumes, only away.
func (e *lostHolder) Unwrap() error {
	if e.kept() {
		return nil
	}
	return errNoHolder
}

// kept reports whether its volumes are kept on a claim.
func (e *lostHolder) kept() bool { return steppod.HolderClaimName(e.pod) != "" }

// reason is why it ended, for the metric: evicted, or failed. The
// kubelet's eviction says Evicted, or a DisruptionTarget condition, but
// what stays of it on a holder may be neither: its sidecar ends 0 on
// TERM, and the kubelet on the real node left an emptyDir's holder it
// evicted past its limit Succeeded, with no reason (TestRealNodeConcourseHolderPastItsLimit).
// The sidecar never ends by itself, and a deleted pod is no lost one
// (holderPod): a holder that ended Succeeded was ended by its kubelet,
// evicted (or its node shut down).
func (e *lostHolder) reason() string {
	if e.pod.Status.Reason == "Evicted" || e.pod.Status.Phase == corev1.PodSucceeded || disruption(e.pod) != nil {
		return "evicted"
	}
	return "failed"
}

// disruption is p's DisruptionTarget condition (the kubelet's eviction,
// its node's shutdown), or nil.
func disruption(p *corev1.Pod) *corev1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// podSender sends to target's volume holder pod.
func (h *Holder) podSender(target, pod string) volumeSender {
	return func(ctx context.Context, method, path string, q url.Values, hdr http.Header, body io.Reader) (*http.Response, error) {
		return h.Server(ctx, target, pod, method, path, q, hdr, body)
	}
}

// unboundHolder: a pod of the volume holder's name is sealed but not
// bound to jetway's create: planted with a copied seal, made before pods
// were bound, or made a moment ago by a gateway still binding it.
type unboundHolder struct{ pod *corev1.Pod }

func (e *unboundHolder) Error() string {
	return fmt.Sprintf("the volume holder pod %s is not bound to jetway's create: it gets no request", e.pod.Name)
}

// Unwrap is errNoHolder (no volume: it never got a request) for an
// emptyDir's holder, so that a lookup finds none and a destroy has none
// to destroy while its maker binds it; a claim's holder's volumes may be
// on its claim, for the holder once it is bound.
func (e *unboundHolder) Unwrap() error {
	if steppod.HolderClaimName(e.pod) != "" {
		return nil
	}
	return errNoHolder
}

// ensure makes cluster target t's volume holder (and binds it) if there
// is none, and waits until it runs. Whoever made the pod of that name, it
// is used only if it is the very pod jetway made (ownership.Key.Bound):
// the caller looks at it again.
func (h *Holder) ensure(ctx context.Context, t *targets.Target, opts steppod.Options) error {
	name, err := h.holderPod(t, opts)
	var unbound *unboundHolder
	var lost *lostHolder
	var away *awayHolder
	switch {
	case errors.As(err, &unbound):
		err = h.replaceUnbound(ctx, t, unbound.pod)
	case errors.As(err, &lost):
		err = h.replaceLost(ctx, t, lost)
	case errors.As(err, &away):
		err = h.makeAway(ctx, t, away)
	case errors.Is(err, errHolderToMake):
		_, err = h.makeHolder(ctx, t)
	case err == nil:
		err = h.replaceChanged(ctx, t, opts, name)
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cmpDuration(h.Ready, holderReady))
	defer cancel()
	key := h.Pod().Key
	err = t.AwaitPods(ctx, func(pods []*corev1.Pod) bool {
		// Called with the cache held: read the pods given, not the cache.
		i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return p.Name == name })
		return i >= 0 && steppod.SidecarListens(pods[i]) && key.Bound(t.Name(), pods[i])
	})
	if err != nil {
		err = fmt.Errorf("the volume holder pod %s/%s does not run and listen (%s): %w", t.Namespace(), name, h.whyNotRunning(ctx, t, name), err)
		h.logger().Warn("volume holder not running", "target", t.Name(), "pod", name, "error", err.Error())
		return err
	}
	h.serveImages(ctx, t, name)
	return nil
}

// makeHolder makes target's volume holder (its claim first, when it
// keeps its volumes on one) and binds it, and reports whether it made
// it; one another replica made first is left to it.
func (h *Holder) makeHolder(ctx context.Context, t *targets.Target) (bool, error) {
	opts := h.Pod()
	claim, err := h.ensureClaim(ctx, t, opts)
	if err != nil {
		return false, err
	}
	pod, err := steppod.HolderPod(t, opts, claim)
	if err != nil {
		return false, fmt.Errorf("the volume holder of %s: %w", t.Name(), err)
	}
	pods := t.Core.Pods(t.Namespace())
	for attempt := 1; ; attempt++ {
		created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("make the volume holder pod %s/%s: %w", t.Namespace(), pod.Name, err)
		}
		_, err = ownership.Bind(ctx, pods, opts.Key, t.Name(), created)
		if err == nil {
			return true, nil
		}
		// Deleted before it was bound: a delete of the pod before it by
		// name alone, without its UID (kwok's, a script's), takes the new
		// one. Made again at once, rather than at the next sweep.
		if attempt == maxHolderMakes || !errors.Is(err, ownership.ErrNotBound) || !gonePod(ctx, pods, pod.Name) {
			return false, fmt.Errorf("the volume holder: %w", err)
		}
		h.logger().Warn("volume holder pod deleted before it was bound: made again", "target", t.Name(), "pod", pod.Name,
			"uid", string(created.UID))
	}
}

// gonePod reports whether the API server has no pod name.
func gonePod(ctx context.Context, pods corev1client.PodInterface, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	_, err := pods.Get(ctx, name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// maxHolderMakes bounds the creates of one makeHolder whose pods are
// deleted before they are bound.
const maxHolderMakes = 3

// holderBindGrace is how long a holder pod that is sealed but not bound
// is given to be bound by the gateway that made it, a moment after its
// create, before it is taken for one jetway did not make.
const holderBindGrace = 30 * time.Second

// replaceUnbound waits for p, a holder pod sealed but not bound, to be
// bound; one that is not within holderBindGrace is deleted (sealed, it is
// jetway's to delete; unbound, it never got a request, so nothing in it
// is a volume of the web node's) and a new holder made.
func (h *Holder) replaceUnbound(ctx context.Context, t *targets.Target, p *corev1.Pod) error {
	key := h.Pod().Key
	wctx, cancel := context.WithTimeout(ctx, cmpDuration(h.BindGrace, holderBindGrace))
	err := t.AwaitPods(wctx, func(pods []*corev1.Pod) bool {
		i := slices.IndexFunc(pods, func(q *corev1.Pod) bool { return q.Name == p.Name })
		return i < 0 || pods[i].UID != p.UID || key.Bound(t.Name(), pods[i])
	})
	cancel()
	if err == nil {
		return nil // bound by its maker, or gone: looked at again by the caller
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	h.Metrics.podRefused(ownership.Unbound)
	h.logger().Warn("volume holder pod deleted: it has the holder's name and seal but is not bound to jetway's create "+
		"(planted with a copied seal, or made before pods were bound); a new one is made, without the files it held",
		"target", t.Name(), "pod", p.Name, "uid", string(p.UID))
	if err := h.remake(ctx, t, p); err != nil {
		return fmt.Errorf("the unbound volume holder: %w", err)
	}
	return nil
}

// deleteHolder deletes the holder pod p, that pod alone (its UID: a new
// one another replica made meanwhile stays); one already gone is no
// error. It gets a second's grace (its sidecar ends on TERM), not
// forced, also when it ended: its object goes only once its kubelet
// stopped it, and a pod of the same name must not be made before. The
// kubelet finds the pod it port-forwards to by name, among those it runs,
// so the new pod's requests could reach the old pod's sidecar, which
// refuses the new pod's token; and a forced delete leaves the kubelet
// (kwok too) deleting the pod of that name after the new one is made.
// force is for a pod whose kubelet did not stop it within holderGone
// (unreachable: it runs nothing a request could reach).
func deleteHolder(ctx context.Context, t *targets.Target, p *corev1.Pod, force bool) error {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	grace, uid := int64(1), p.UID
	if force {
		grace = 0
	}
	err := t.Core.Pods(t.Namespace()).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete the volume holder pod %s/%s: %w", t.Namespace(), p.Name, err)
	}
	return nil
}

// replaceLost deletes a volume holder pod that ended (lost) and makes a
// new one: empty, or on the same claim. Another gateway may replace it
// first: the delete is of that pod alone (its UID), and a new one made
// meanwhile is left to it.
func (h *Holder) replaceLost(ctx context.Context, t *targets.Target, lost *lostHolder) error {
	p := lost.pod
	attrs := []any{"target", t.Name(), "pod", p.Name, "uid", string(p.UID), "phase", string(p.Status.Phase),
		"reason", p.Status.Reason, "message", p.Status.Message, "as", lost.reason()}
	if c := disruption(p); c != nil {
		attrs = append(attrs, "disruption", c.Reason+": "+c.Message)
	}
	if lost.kept() {
		h.logger().Warn("volume holder pod replaced: it ended; the volumes on its claim wait for the new one",
			append(attrs, "claim", steppod.HolderClaimName(p))...)
		h.Metrics.holderReplaced(lost.reason(), volumesKept)
	} else {
		h.logger().Warn("volume holder pod replaced: it ended, and the volumes it held are gone; the web node makes them again", attrs...)
		h.Metrics.holderReplaced(lost.reason(), volumesLost)
	}
	if err := h.remake(ctx, t, p); err != nil {
		return fmt.Errorf("the volume holder that ended: %w", err)
	}
	return nil
}

// remake deletes the holder pod p (that pod alone) and, once the target's
// pod cache shows it gone (deleteHolder says why it must be), makes a new
// holder. One still there after holderGone (its kubelet unreachable: it
// runs nothing any request could reach) is deleted by force.
func (h *Holder) remake(ctx context.Context, t *targets.Target, p *corev1.Pod) error {
	gone := func(wait time.Duration) error {
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		return t.AwaitPodGone(wctx, p.UID)
	}
	if err := deleteHolder(ctx, t, p, false); err != nil {
		return err
	}
	if err := gone(holderGone); err != nil && ctx.Err() == nil {
		h.logger().Warn("volume holder pod not gone after its grace: deleted by force (its kubelet may be unreachable)",
			"target", t.Name(), "pod", p.Name, "uid", string(p.UID), "waited", holderGone.String())
		if err := deleteHolder(ctx, t, p, true); err != nil {
			return err
		}
		if err := gone(holderCall); err != nil {
			return fmt.Errorf("the volume holder pod %s/%s is not gone: %w", t.Namespace(), p.Name, err)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	_, err := h.makeHolder(ctx, t)
	return err
}

func (h *Holder) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// call sends one request to a worker's volumes; a holder just made may
// not answer at once (its port-forward), so a failure to connect is
// retried for a while. body must be replayable when retried: nil or
// bytes.
func (send volumeSender) call(ctx context.Context, method, path string, q url.Values, hdr http.Header, body []byte) (*http.Response, error) {
	deadline := time.Now().Add(holderAnswer)
	for {
		var r io.Reader
		if body != nil {
			r = bytes.NewReader(body)
		}
		resp, err := send(ctx, method, path, q, hdr, r)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(holderPoll):
		}
	}
}

// create makes a volume in target's holder (making the holder first):
// body is the web node's create request, passed on unchanged. It returns
// the volume's JSON.
func (h *Holder) create(ctx context.Context, target string, body []byte) (json.RawMessage, error) {
	// Making the holder waits for its pod; a copy takes its time.
	ctx, cancel := context.WithTimeout(ctx, holderReady+holderCreate)
	defer cancel()
	awaitListed(ctx, h.Targets, target)
	w, err := h.worker(target)
	if err != nil {
		return nil, err
	}
	send, err := w.makeVolumes(ctx, h)
	if err != nil {
		return nil, err
	}
	if certsImport(body) {
		return h.createCerts(ctx, target, send, body)
	}
	if parent := parentOf(body); parent != "" {
		if err := h.settle(ctx, target, parent); err != nil {
			return nil, err
		}
	}
	return h.post(ctx, target, send, body)
}

// post sends the create request body to target's holder (send), and
// returns the volume's JSON.
func (h *Holder) post(ctx context.Context, target string, send volumeSender, body []byte) (json.RawMessage, error) {
	start := time.Now()
	resp, err := send.call(ctx, http.MethodPost, "/volumes", nil, http.Header{"Content-Type": {"application/json"}}, body)
	if err != nil {
		return nil, fmt.Errorf("volume holder of %s: %w", target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCreate))
	if err != nil {
		return nil, fmt.Errorf("volume holder of %s: %w", target, err)
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("volume holder of %s: %s", target, answerError(resp.StatusCode, b))
	}
	n, _ := strconv.ParseInt(resp.Header.Get(volumes.CopiedBytesHeader), 10, 64)
	linked, _ := strconv.Atoi(resp.Header.Get(volumes.LinkedEntriesHeader))
	h.Metrics.copied(n, linked, time.Since(start))
	return b, nil
}

// parentOf is the volume a create request copies, if it names one: a
// cow's parent, or the volume an import's path is in (the web node keeps
// a task's cache so).
func parentOf(body []byte) string {
	var req volumes.CreateRequest
	if json.Unmarshal(body, &req) != nil || req.Strategy == nil {
		return ""
	}
	switch req.Strategy.Type {
	case volumes.StrategyCOW:
		return req.Strategy.Volume
	case volumes.StrategyImport:
		if p := req.Strategy.Path; path.IsAbs(p) {
			return path.Base(path.Clean(p))
		}
	}
	return ""
}

// asyncCreateWait bounds how long an async create's answer waits for the
// create to end: well under the web node's one-minute bound on the
// volume API's answers.
const asyncCreateWait = 5 * time.Second

// answerError says what a volume server's error answer says.
func answerError(code int, body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return fmt.Sprintf("answered %d", code)
}

// startCreate begins an async create of handle on target.
func (h *Holder) startCreate(target, handle string, body []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil || h.ctx.Err() != nil {
		return errors.New("the gateway is not serving volumes (starting or stopping)")
	}
	if h.futures == nil {
		h.futures = map[string]*future{}
	}
	now := time.Now()
	for k, f := range h.futures {
		if now.Sub(f.began) > futureTTL {
			delete(h.futures, k)
		}
	}
	key := target + "/" + handle
	if _, ok := h.futures[key]; ok {
		return fmt.Errorf("volume %s is being created already", handle)
	}
	if len(h.futures) >= maxFutures {
		return fmt.Errorf("%d volume creates wait already; try again", maxFutures)
	}
	f := &future{done: make(chan struct{}), began: now}
	h.futures[key] = f
	ctx := h.ctx
	h.wg.Go(func() {
		f.vol, f.err = h.create(ctx, target, body)
		close(f.done)
	})
	return nil
}

// future returns the async create of handle on target, or nil.
func (h *Holder) future(target, handle string, drop bool) *future {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.futures[target+"/"+handle]
	if drop {
		delete(h.futures, target+"/"+handle)
	}
	return f
}

// List returns the handles of target's volumes: none without a holder.
// A volume held by a pod that is gone is lost: it is destroyed, and not
// reported, so that the web node makes it again.
func (h *Holder) List(ctx context.Context, target string) ([]string, error) {
	vols, err := h.list(ctx, target)
	if err != nil {
		return nil, err
	}
	t, err := listed(h.Targets, target)
	if err != nil {
		return nil, err
	}
	handles := make([]string, 0, len(vols))
	for _, v := range reportable(vols) {
		if v.Held != nil && t != nil {
			if why := podGone(t, *v.Held); why != "" {
				_ = h.lose(ctx, target, v.Handle, *v.Held, why)
				continue
			}
		}
		handles = append(handles, v.Handle)
	}
	return handles, nil
}

// list lists target's volumes as its holder describes them: none without
// a holder, or with an emptyDir's that ended (its volumes went with it: a
// new one is made now rather than at the web node's next create); an
// error while a claim's holder is away (listWithout).
func (h *Holder) list(ctx context.Context, target string) ([]volumes.Volume, error) {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	send, err := h.volumes(target)
	if err != nil {
		return nil, h.listWithout(ctx, target, err)
	}
	resp, err := send(ctx, http.MethodGet, "/volumes", nil, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("volume holder of %s: %w", target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("volume holder of %s: %s", target, answerError(resp.StatusCode, b))
	}
	var vols []volumes.Volume
	if err := json.Unmarshal(b, &vols); err != nil {
		return nil, fmt.Errorf("volume holder of %s: %w", target, err)
	}
	return vols, nil
}

// Destroy destroys a volume of target's holder; a volume already gone is
// no error.
func (h *Holder) Destroy(ctx context.Context, target, handle string) error {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	send, err := h.volumes(target)
	if errors.Is(err, errNoHolder) {
		return nil
	}
	if err != nil {
		return err
	}
	resp, err := send(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(handle), nil, nil, nil)
	if err != nil {
		return fmt.Errorf("volume %s: %w", handle, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("volume %s: %s", handle, answerError(resp.StatusCode, b))
	}
	if resp.Header.Get(volumes.HeldHeader) != "" {
		h.Metrics.held("dropped") // never copied back
	}
	return nil
}

// API serves target's volume (baggageclaim) API to the web node.
func (h *Holder) API(target string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /volumes-async", func(w http.ResponseWriter, r *http.Request) {
		body, handle, ok := createBody(w, r)
		if !ok {
			return
		}
		if err := h.startCreate(target, handle, body); err != nil {
			httpjson.Write(w, http.StatusServiceUnavailable, httpjson.Error(err))
			return
		}
		// The web node polls a create first at once, then only after
		// about half a second (baggageclaim's client: its backoff
		// starts at the library's default, not its own 10 ms): a
		// create that ends soon is waited for, so that the first poll
		// finds it done.
		if f := h.future(target, handle, false); f != nil {
			select {
			case <-f.done:
			case <-r.Context().Done():
			case <-time.After(asyncCreateWait):
			}
		}
		httpjson.Write(w, http.StatusCreated, map[string]string{"handle": handle})
	})
	mux.HandleFunc("GET /volumes-async/{handle}", func(w http.ResponseWriter, r *http.Request) {
		f := h.future(target, r.PathValue("handle"), false)
		if f == nil {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		select {
		case <-f.done:
		default:
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if f.err != nil {
			httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(f.err))
			return
		}
		writeRaw(w, http.StatusOK, f.vol)
	})
	mux.HandleFunc("DELETE /volumes-async/{handle}", func(w http.ResponseWriter, r *http.Request) {
		if h.future(target, r.PathValue("handle"), true) == nil {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /volumes", func(w http.ResponseWriter, r *http.Request) {
		body, _, ok := createBody(w, r)
		if !ok {
			return
		}
		vol, err := h.create(r.Context(), target, body)
		if err != nil {
			httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(err))
			return
		}
		writeRaw(w, http.StatusCreated, vol)
	})
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, r *http.Request) {
		h.pass(w, r, target, func(w http.ResponseWriter) { writeRaw(w, http.StatusOK, []byte("[]\n")) })
	})
	missing := func(w http.ResponseWriter) {
		httpjson.Write(w, http.StatusNotFound, map[string]string{"error": "volume not found"})
	}
	for _, route := range []string{
		"GET /volumes/{handle}", "DELETE /volumes/{handle}",
		"PUT /volumes/{handle}/properties/{property}",
		"GET /volumes/{handle}/privileged", "PUT /volumes/{handle}/privileged",
	} {
		mux.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) { h.pass(w, r, target, missing) })
	}
	// What reads or writes a volume's files finds them in the holder.
	settled := func(w http.ResponseWriter, r *http.Request) bool {
		err := h.settle(r.Context(), target, r.PathValue("handle"))
		if err != nil {
			httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(err))
		}
		return err == nil
	}
	mux.HandleFunc("PUT /volumes/{handle}/stream-in", func(w http.ResponseWriter, r *http.Request) {
		if settled(w, r) {
			h.pass(w, r, target, missing)
		}
	})
	mux.HandleFunc("PUT /volumes/{handle}/stream-out", func(w http.ResponseWriter, r *http.Request) {
		if !settled(w, r) {
			return
		}
		resp, ok := h.forward(w, r, target, missing)
		if !ok {
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound && path.Clean(r.URL.Query().Get("path")) == imageMetadataFile &&
			h.layerFreeImage(r.Context(), target, r.PathValue("handle")) {
			writeImageMetadata(w, r.Header.Get("Accept-Encoding"))
			return
		}
		answerWith(w, resp)
	})
	h.serveP2P(mux, target)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusNotFound, map[string]string{"error": "the volume API has no " + r.Method + " " + r.URL.Path})
	})
	return mux
}

// imageMetadataFile is the file of an image's volume the web node reads
// the image's environment and user from before it runs it.
const imageMetadataFile = "metadata.json"

// layerFreeImage reports, for target's volume handle that has no
// metadata.json, whether it is an image fetched without its layers: a
// registry-image get with skip_download writes its repository and digest
// files and no metadata.json, which the web node reads before it runs
// the image as a task's (jetway runs repository@digest, and the kubelet
// applies the image's own environment and user).
func (h *Holder) layerFreeImage(ctx context.Context, target, handle string) bool {
	_, err := h.ReadFile(ctx, target, handle, "digest", imageFileLimit)
	return err == nil
}

// writeImageMetadata answers a stream-out of metadata.json, in the
// encoding asked for, with metadata that adds nothing to the image's own.
func writeImageMetadata(w http.ResponseWriter, encoding string) {
	body := []byte(`{"env":[],"user":""}` + "\n")
	var buf bytes.Buffer
	enc, err := volumes.Encoder(encoding, &buf)
	if err != nil {
		httpjson.Write(w, http.StatusBadRequest, httpjson.Error(err))
		return
	}
	tw := tar.NewWriter(enc)
	err = tw.WriteHeader(&tar.Header{Name: imageMetadataFile, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: time.Now()})
	if err == nil {
		_, err = tw.Write(body)
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = enc.Close()
	}
	if err != nil {
		httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(err))
		return
	}
	w.Header().Set("Content-Encoding", cmp.Or(encoding, volumes.Raw))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
}

// createBody reads a create request's body and its handle, or answers 400.
func createBody(w http.ResponseWriter, r *http.Request) ([]byte, string, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxCreate+1))
	var req struct {
		Handle string `json:"handle"`
	}
	switch {
	case err != nil:
		httpjson.Write(w, http.StatusBadRequest, httpjson.Error(err))
	case len(body) > maxCreate:
		httpjson.Write(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("a volume's create request is at most %d bytes", maxCreate)})
	case json.Unmarshal(body, &req) != nil || req.Handle == "":
		httpjson.Write(w, http.StatusBadRequest, map[string]string{"error": `body must be a volume request: {"handle": "...", "strategy": {...}, "properties": {...}}`})
	default:
		return body, req.Handle, true
	}
	return nil, "", false
}

// pass passes the request on to target's holder, as it came (method, path,
// query, the headers that say how the body is encoded, the body), and its
// answer back. Without a holder there is no volume: none answers.
func (h *Holder) pass(w http.ResponseWriter, r *http.Request, target string, none func(http.ResponseWriter)) {
	if resp, ok := h.forward(w, r, target, none); ok {
		defer resp.Body.Close()
		answerWith(w, resp)
	}
}

// forward passes the request on to target's holder as pass does, and
// returns its answer for the caller to close; or it answers w itself
// (none without a holder, an error) and returns false.
func (h *Holder) forward(w http.ResponseWriter, r *http.Request, target string, none func(http.ResponseWriter)) (*http.Response, bool) {
	send, err := h.volumes(target)
	if errors.Is(err, errNoHolder) {
		none(w)
		return nil, false
	}
	if err != nil {
		httpjson.Write(w, http.StatusInternalServerError, httpjson.Error(err))
		return nil, false
	}
	hdr := http.Header{}
	for _, k := range []string{"Content-Type", "Content-Encoding", "Accept-Encoding"} {
		if v := r.Header.Get(k); v != "" {
			hdr.Set(k, v)
		}
	}
	var body io.Reader
	if r.ContentLength != 0 {
		body = r.Body
	}
	resp, err := send(r.Context(), r.Method, r.URL.Path, r.URL.Query(), hdr, body)
	if err != nil {
		httpjson.Write(w, http.StatusBadGateway, map[string]string{"error": fmt.Sprintf("volume holder of %s: %v", target, err)})
		return nil, false
	}
	return resp, true
}

// answerWith answers w with the holder's resp: its status, the headers
// that say what the body is, the body. A body that fails (the holder cut
// its stream-out: a file it may not read) cuts w's too, so that a partial
// volume never looks whole.
func answerWith(w http.ResponseWriter, resp *http.Response) {
	for _, k := range []string{"Content-Type", "Content-Encoding"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		panic(http.ErrAbortHandler)
	}
}

func writeRaw(w http.ResponseWriter, code int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// errVolumeNotFound: the holder has no such volume.
var errVolumeNotFound = errors.New("no such volume")

// Volume is target's volume handle as its holder describes it.
func (h *Holder) Volume(ctx context.Context, target, handle string) (volumes.Volume, error) {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	var v volumes.Volume
	send, err := h.volumes(target)
	if errors.Is(err, errNoHolder) {
		return v, fmt.Errorf("volume %s: %w", handle, errVolumeNotFound)
	}
	if err != nil {
		return v, err
	}
	resp, err := send(ctx, http.MethodGet, "/volumes/"+url.PathEscape(handle), nil, nil, nil)
	if err != nil {
		return v, fmt.Errorf("volume %s: %w", handle, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case err != nil:
		return v, fmt.Errorf("volume %s: %w", handle, err)
	case resp.StatusCode == http.StatusNotFound:
		return v, fmt.Errorf("volume %s: %w", handle, errVolumeNotFound)
	case resp.StatusCode == http.StatusGone: // lost with the pod that held it
		return v, fmt.Errorf("%s: %w", answerError(resp.StatusCode, b), errVolumeLost)
	case resp.StatusCode != http.StatusOK:
		return v, fmt.Errorf("volume %s: %s", handle, answerError(resp.StatusCode, b))
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("volume %s: %w", handle, err)
	}
	return v, nil
}

// ReadFile reads the file at path in target's volume handle, of at most
// limit bytes: errVolumeNotFound-wrapped if the volume or the file is
// missing.
func (h *Holder) ReadFile(ctx context.Context, target, handle, path string, limit int64) ([]byte, error) {
	if err := h.settle(ctx, target, handle); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	send, err := h.volumes(target)
	if errors.Is(err, errNoHolder) {
		return nil, fmt.Errorf("volume %s: %w", handle, errVolumeNotFound)
	}
	if err != nil {
		return nil, err
	}
	resp, err := send(ctx, http.MethodPut, "/volumes/"+url.PathEscape(handle)+"/stream-out",
		url.Values{"path": {path}}, http.Header{"Accept-Encoding": {volumes.Raw}}, nil)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %s: %w", handle, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("volume %s has no %s: %w", handle, path, errVolumeNotFound)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("volume %s: %s: %s", handle, path, answerError(resp.StatusCode, b))
	}
	// A single file streams out as a tar of it alone.
	tr := tar.NewReader(resp.Body)
	if _, err := tr.Next(); err != nil {
		return nil, fmt.Errorf("volume %s: %s: %w", handle, path, err)
	}
	b, err := io.ReadAll(io.LimitReader(tr, limit+1))
	if err != nil {
		return nil, fmt.Errorf("volume %s: %s: %w", handle, path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("volume %s: %s is over %d bytes", handle, path, limit)
	}
	return b, nil
}
