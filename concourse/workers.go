package concourse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"

	"code.cloudfoundry.org/garden"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// A worker is where one of the web node's workers keeps its containers
// and volumes: a cluster target, whose containers are sealed pods and
// whose volumes its volume holder pod keeps (clusterWorker), or an agent
// joined to this gateway, whose containers are folders on its machine
// linked to the volumes it keeps, served by its agent.LocalWorker
// (agentWorker). What differs between the two is a method here;
// Containers, Pods and Holder find a target's worker and ask it.
type worker interface {
	// newContainer checks that the worker takes spec and returns its
	// container, to be recorded and then made.
	newContainer(ctx context.Context, spec garden.ContainerSpec) (*Container, error)
	// makeContainer makes the recorded ct: its pod, its folder.
	makeContainer(ctx context.Context, ct *Container) error
	// destroyContainer removes the pods or the folder of container
	// handle; ErrNotOurs for a pod of that handle jetway did not seal.
	destroyContainer(ctx context.Context, handle string) error
	// containers lists the handles of the containers it holds, recorded
	// or not.
	containers(ctx context.Context) ([]string, error)
	// process is ct's process id, reached where it runs.
	process(ct *Container, id string) steppod.RunIn
	// await waits until ct can run a process, saying on progress what it
	// waits for.
	await(ctx context.Context, ct *Container, progress io.Writer) error
	// user is the user a process of Garden's user runs as.
	user(gardenUser string) string
	// moveVolumes copies the volumes ct's bind mounts name to where its
	// processes see them (in), or its writable mounts back (out).
	moveVolumes(ctx context.Context, ct *Container, in bool) error
	// volumes is where the worker's volumes are served, which h keeps:
	// errNoHolder if there is none yet.
	volumes(h *Holder) (volumeSender, error)
	// makeVolumes is volumes, made first if there are none.
	makeVolumes(ctx context.Context, h *Holder) (volumeSender, error)
}

// errNoWorker: a worker that is neither a cluster target nor an agent
// joined to this gateway.
var errNoWorker = errors.New("neither a cluster target nor an agent joined to this gateway")

// errUnknownWorker names such a worker.
func errUnknownWorker(target string) error {
	return fmt.Errorf("worker %s is %w: jetway runs no container for it here", target, errNoWorker)
}

// findWorker is target's worker: a cluster target once its pods are
// listed (with the pod options, whose key must be read), or an agent
// joined to this gateway now. c is set where the worker makes and runs
// containers (Containers), nil where it only lists and removes them
// (Pods) or reaches its volumes (Holder).
func findWorker(ts PodTargets, agents *Agents, opts func() steppod.Options, c *Containers, target string) (worker, error) {
	t, err := listed(ts, target)
	switch {
	case err != nil:
		return nil, err
	case t == nil && agents.Has(target):
		return agentWorker{agents: agents, name: target}, nil
	case t == nil:
		return nil, errUnknownWorker(target)
	}
	o := opts()
	if o.Key.IsZero() {
		return nil, fmt.Errorf("worker %s: the installation's pod key is not read yet: jetway makes and tells no pod before", target)
	}
	return clusterWorker{c: c, t: t, opts: o}, nil
}

// clusterWorker is a cluster target's: a container is a step pod
// (steppod.Build) labelled ContainerLabel, sealed and bound.
type clusterWorker struct {
	c    *Containers
	t    *targets.Target
	opts steppod.Options
}

func (w clusterWorker) newContainer(ctx context.Context, spec garden.ContainerSpec) (*Container, error) {
	if spec.Privileged && !w.t.Config.Meta.Steps.AllowPrivileged {
		return nil, fmt.Errorf("worker %s does not run privileged containers: its target's policy does not allow them (%s in its target.yaml)",
			w.t.Name(), targets.PrivilegedKey)
	}
	image, pull, err := w.c.image(ctx, w.t.Name(), spec)
	if err != nil {
		return nil, err
	}
	if _, err := podMounts(spec.BindMounts); err != nil {
		return nil, err
	}
	ct := newContainer(w.t.Name(), spec)
	ct.Pod, ct.Image, ct.pull = steppod.Name(w.t.Config.Meta.Team, "concourse-"+spec.Handle), image, pull
	return ct, nil
}

// isCheck says whether spec is a check's container: the web node mounts
// a scratch volume at /scratch in every container, a working directory
// in every one but a check's (a get's at /tmp/build/get, a put's and a
// task's at /tmp/build/<id>), and a check's own inputs, outputs or
// caches it has none; what else a check's may get is the worker's CA
// certificates (gardenruntime's createVolumes and CertsBindMount).
func isCheck(spec garden.ContainerSpec) bool {
	scratch := false
	for _, bm := range spec.BindMounts {
		switch path.Clean(bm.DstPath) {
		case "/scratch":
			scratch = true
		case "/etc/ssl/certs":
		default:
			return false
		}
	}
	return scratch
}

// hermetic says whether spec is a hermetic step's container, which may
// reach no network: the web node gives every other container a NetOut
// rule to everywhere, and a hermetic one none (gardenruntime's
// Worker.createGardenContainer), as a stock worker reads it.
func hermetic(spec garden.ContainerSpec) bool { return len(spec.NetOut) == 0 }

func (w clusterWorker) makeContainer(ctx context.Context, ct *Container) error {
	mounts, _ := podMounts(ct.Spec.BindMounts) // checked by newContainer
	spec := steppod.Spec{
		Name: ct.Pod, Type: "concourse", Team: w.t.Config.Meta.Team, Image: ct.Image,
		Labels:    map[string]string{ContainerLabel: ct.Handle()},
		Resources: resources(ct.Spec.Limits), CPUWeight: true, Check: isCheck(ct.Spec), Privileged: ct.Spec.Privileged,
		Mounts: mounts, Hermetic: hermetic(ct.Spec),
	}
	if ct.pull != nil {
		spec.PullSecrets = []string{ct.Pod} // makePullSecret's
	}
	pod := steppod.Build(w.t, spec, w.opts)
	pods := w.t.Core.Pods(w.t.Namespace())
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("make the pod %s/%s of container %s: %w", w.t.Namespace(), ct.Pod, ct.Handle(), err)
	}
	if ct.pull != nil {
		if err := makePullSecret(ctx, w.t, created, *ct.pull); err != nil {
			_ = deletePod(context.WithoutCancel(ctx), w.t, created)
			return fmt.Errorf("container %s: %w", ct.Handle(), err)
		}
		w.c.Metrics.pullCredential("used")
	}
	if _, err := ownership.Bind(ctx, pods, w.opts.Key, w.t.Name(), created); err != nil {
		_ = deletePod(context.WithoutCancel(ctx), w.t, created) // never used: unbound, it would get nothing
		return fmt.Errorf("container %s: %w", ct.Handle(), err)
	}
	return nil
}

func (w clusterWorker) destroyContainer(ctx context.Context, handle string) error {
	return destroyPods(ctx, w.t, w.opts.Key, handle)
}

func (w clusterWorker) containers(context.Context) ([]string, error) {
	var handles []string
	for _, p := range w.t.Pods() {
		if handle := p.Labels[ContainerLabel]; handle != "" && p.DeletionTimestamp == nil && w.opts.Key.Bound(w.t.Name(), p) {
			handles = append(handles, handle)
		}
	}
	return handles, nil
}

func (w clusterWorker) process(ct *Container, id string) steppod.RunIn {
	return steppod.RunIn{Pod: ct.Pod, Run: id, Target: func(ctx context.Context) (*targets.Target, error) { return w.c.trustedPod(ctx, ct) }}
}

func (w clusterWorker) await(ctx context.Context, ct *Container, progress io.Writer) error {
	return w.c.awaitPod(ctx, w.t, w.opts, ct, progress)
}

func (clusterWorker) user(u string) string {
	if u == "root" {
		return "0:0" // by number: an image need not have an /etc/passwd
	}
	return u
}

// moveVolumes copies the volumes from the target's volume holder into the
// pod's mounts (in), and leaves them held by the pod after a process
// (out).
func (w clusterWorker) moveVolumes(ctx context.Context, ct *Container, in bool) error {
	if in {
		return w.c.movePod(ctx, ct)
	}
	return w.c.hold(ctx, w.t, ct)
}

// volumes are kept by the target's volume holder pod. One on an emptyDir
// whose sidecar never ran (made a moment ago, or again after a lost one,
// and not started yet) holds none: the worker's volume API says so (an
// empty list, not found) rather than fail, so its heartbeat and sweeps go
// on while it starts; a create waits for it (makeVolumes).
func (w clusterWorker) volumes(h *Holder) (volumeSender, error) {
	pod, err := h.holderPod(w.t, w.opts)
	if err != nil {
		return nil, err
	}
	if p := w.t.CachedPod(pod); neverServed(p) {
		return nil, fmt.Errorf("the volume holder pod %s/%s has not started yet: %w", w.t.Namespace(), pod, errNoHolder)
	}
	return h.podSender(w.t.Name(), pod), nil
}

// neverServed reports whether holder pod p, on an emptyDir, has never
// run its sidecar: not scheduled, or its sidecar waiting for its first
// start. A sidecar that ran and stopped (killed, restarting) is not: its
// emptyDir keeps the volumes for its next start. A claim's holder is not
// either: its volumes are on the claim.
func neverServed(p *corev1.Pod) bool {
	if p == nil || p.DeletionTimestamp != nil || steppod.HolderClaimName(p) != "" {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == steppod.SidecarContainer {
			return cs.State.Running == nil && cs.State.Terminated == nil && cs.RestartCount == 0 && cs.LastTerminationState.Terminated == nil
		}
	}
	return p.Status.Phase == corev1.PodPending
}

// makeVolumes makes the volume holder pod if there is none and waits for
// it to run, then looks at it again: still the pod jetway made.
func (w clusterWorker) makeVolumes(ctx context.Context, h *Holder) (volumeSender, error) {
	if err := h.ensure(ctx, w.t, w.opts); err != nil {
		return nil, err
	}
	return h.volumes(w.t.Name())
}

// agentWorker is an agent's: a container is a folder on the agent's
// machine whose mounts link to the agent's volumes. The image is not
// used: the agent runs processes on its machine, as its user, as
// Concourse's Houdini does on a Mac. Each call checks that the agent is
// still joined: one that rejoins a moment later is found again.
type agentWorker struct {
	agents *Agents
	name   string
}

func (w agentWorker) joined(handle string) error {
	if !w.agents.Has(w.name) {
		return fmt.Errorf("container %s: agent %s is %w", handle, w.name, errNotJoined)
	}
	return nil
}

func (w agentWorker) newContainer(_ context.Context, spec garden.ContainerSpec) (*Container, error) {
	if spec.Privileged {
		return nil, fmt.Errorf("worker %s is an agent: it runs processes as its own user, never privileged: "+
			"run privileged steps on a cluster target that allows them", w.name)
	}
	if hermetic(spec) {
		return nil, fmt.Errorf("worker %s is an agent: it cannot cut a process off the network, as a hermetic step wants: "+
			"run hermetic steps on a cluster target", w.name)
	}
	if _, err := podMounts(spec.BindMounts); err != nil {
		return nil, err
	}
	ct := newContainer(w.name, spec)
	ct.Agent = true
	return ct, nil
}

func (w agentWorker) makeContainer(ctx context.Context, ct *Container) error {
	mounts := make([]wire.LocalMount, 0, len(ct.Spec.BindMounts))
	for _, bm := range ct.Spec.BindMounts {
		mounts = append(mounts, wire.LocalMount{Path: path.Clean(bm.DstPath), Source: bm.SrcPath})
	}
	if err := w.agents.makeContainer(ctx, w.name, ct.Handle(), mounts); err != nil {
		return fmt.Errorf("make container %s: %w", ct.Handle(), err)
	}
	return nil
}

func (w agentWorker) destroyContainer(ctx context.Context, handle string) error {
	if err := w.joined(handle); err != nil {
		return err
	}
	return w.agents.destroyContainer(ctx, w.name, handle)
}

// containers are the agent's folders, each made after its record.
func (w agentWorker) containers(ctx context.Context) ([]string, error) {
	return w.agents.containers(ctx, w.name)
}

func (w agentWorker) process(ct *Container, id string) steppod.RunIn {
	return steppod.RunIn{Pod: ct.Handle(), Run: id,
		Target: func(context.Context) (*targets.Target, error) { return nil, w.joined(ct.Handle()) },
		Exec:   w.agents.exec(w.name, ct.Handle())}
}

func (agentWorker) await(context.Context, *Container, io.Writer) error { return nil } // a folder, there at once

func (agentWorker) user(string) string { return "" } // the agent's own: it runs processes as its user only

// moveVolumes moves nothing: a container's folder links to the agent's
// volumes, so a process writes straight into them.
func (agentWorker) moveVolumes(context.Context, *Container, bool) error { return nil }

// volumes are kept by the agent's volume server.
func (w agentWorker) volumes(*Holder) (volumeSender, error) {
	return func(ctx context.Context, method, path string, q url.Values, hdr http.Header, body io.Reader) (*http.Response, error) {
		return w.agents.volumes(ctx, w.name, method, path, q, hdr, body)
	}, nil
}

// makeVolumes has nothing to make: the agent keeps its volumes.
func (w agentWorker) makeVolumes(context.Context, *Holder) (volumeSender, error) {
	return w.volumes(nil)
}

// workerOf is the worker of the recorded container ct: an agent's is
// found by its record, so that a process on an agent that rejoins a
// moment later is followed on.
func (c *Containers) workerOf(ct *Container) (worker, error) {
	if ct.Agent {
		return agentWorker{agents: c.Agents, name: ct.Target}, nil
	}
	return c.worker(ct.Target)
}

// worker is target's worker, to make and run containers on.
func (c *Containers) worker(target string) (worker, error) {
	return findWorker(c.Targets, c.Agents, c.Pod, c, target)
}

// sortedHandles is handles sorted, without repeats.
func sortedHandles(handles []string) []string {
	slices.Sort(handles)
	return slices.Compact(handles)
}
