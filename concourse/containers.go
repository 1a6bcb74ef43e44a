package concourse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"code.cloudfoundry.org/garden"
	"golang.org/x/sync/errgroup"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// A web node's container on a cluster target is a pod: a step pod whose
// step container waits in the container's image (steppod.Build),
// sealed, labelled ContainerLabel with its handle, with its bind mounts
// as folders of the pod's emptyDir. What the web node gave and set (the
// spec, the environment, the properties) is kept in the state namespace
// (ContainerRecords), never in the pod. The record is made before the pod
// and forgotten after it, so a pod never lacks one for long: the sweeps
// report both, and the web node names what it no longer knows.

// Containers are the web node's containers on cluster targets.
type Containers struct {
	Targets PodTargets
	Records *ContainerRecords
	// Pod are the step pods' options (the agent image, the installation,
	// the pod key); read at each use, since the key is read after start.
	Pod func() steppod.Options
	// Holder keeps the volumes the containers' images and mounts are.
	Holder *Holder
	// Agents make the containers of the agents' workers (nil: none).
	Agents *Agents
	// ResourceTypes are the base resource types the workers offer: an
	// import of one of their images runs as that image.
	ResourceTypes []wire.ResourceType
	Metrics       *Metrics
	Logger        *slog.Logger

	served served // the processes the web node follows through this gateway
}

// served counts the processes whose Garden streams this gateway serves,
// for a stop to wait for (Drain).
type served struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0
}

// following counts a process the web node follows until done is called.
func (c *Containers) following() (done func()) {
	c.served.mu.Lock()
	defer c.served.mu.Unlock()
	if c.served.n == 0 {
		c.served.zero = make(chan struct{})
	}
	c.served.n++
	return sync.OnceFunc(func() {
		c.served.mu.Lock()
		defer c.served.mu.Unlock()
		if c.served.n--; c.served.n == 0 {
			close(c.served.zero)
		}
	})
}

// Following is how many processes the web node follows through this
// gateway now.
func (c *Containers) Following() int {
	c.served.mu.Lock()
	defer c.served.mu.Unlock()
	return c.served.n
}

// Drain waits until the web node follows no process through this gateway
// (each ends, or the web node's connection does) or ctx ends, and returns
// how many it still follows.
func (c *Containers) Drain(ctx context.Context) int {
	c.served.mu.Lock()
	n, zero := c.served.n, c.served.zero
	c.served.mu.Unlock()
	if n == 0 {
		return 0
	}
	select {
	case <-zero:
	case <-ctx.Done():
	}
	c.served.mu.Lock()
	defer c.served.mu.Unlock()
	return c.served.n
}

// scratchPath is where the web node mounts a new empty volume in each
// container, which it never reads again.
const scratchPath = "/scratch"

// moveParallel bounds the volumes one container moves at once.
const moveParallel = 4

// Bounds of a container's create: the image's files read from a volume.
const (
	imageFileLimit = 4 << 10
	createTimeout  = 2 * time.Minute
)

// Create makes target's container of spec: its record, then its pod. It
// returns once the pod is made, not once its image is pulled: a process
// run in it waits for that, saying so.
func (c *Containers) Create(ctx context.Context, target string, spec garden.ContainerSpec) (*Container, error) {
	ctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	if spec.Handle == "" {
		return nil, errors.New("a container needs a handle: the web node always gives one")
	}
	if !wire.IsContainerHandle(spec.Handle) {
		return nil, fmt.Errorf("container handle %q: jetway takes handles of at most 63 letters, digits, '.', '_' and '-'", spec.Handle)
	}
	awaitListed(ctx, c.Targets, target)
	w, err := c.worker(target)
	if err != nil {
		return nil, err
	}
	ct, err := w.newContainer(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := c.recordAndMake(ctx, ct, func() error { return w.makeContainer(ctx, ct) }); err != nil {
		return nil, err
	}
	c.logger().Info("container made", "target", target, "handle", spec.Handle, "agent", ct.Agent, "pod", ct.Pod, "image", ct.Image,
		"privileged", spec.Privileged)
	return ct, nil
}

// newContainer is target's container of spec, before it is recorded.
func newContainer(target string, spec garden.ContainerSpec) *Container {
	ct := &Container{Target: target, Spec: spec, Created: time.Now().UTC(), properties: spec.Properties}
	ct.Spec.Properties = nil // kept once, as the properties
	if ct.properties == nil {
		ct.properties = garden.Properties{}
	}
	return ct
}

// recordAndMake records ct, then makes it (its pod, its folder on an
// agent): a container never lacks its record. If making it fails, the
// record is forgotten again.
func (c *Containers) recordAndMake(ctx context.Context, ct *Container, build func() error) error {
	if err := c.Records.Create(ctx, ct); err != nil {
		return err
	}
	if err := build(); err != nil {
		if ferr := c.Records.Delete(context.WithoutCancel(ctx), ct.Target, ct.Handle()); ferr != nil {
			err = fmt.Errorf("%w (and its record stays: %v)", err, ferr)
		}
		return err
	}
	c.Metrics.container("created")
	return nil
}

// Lookup is target's container handle as the records' watch shows it
// (ContainerRecords.Cached: without its environment):
// garden.ContainerNotFoundError if the web node made none of that handle
// (or destroyed it).
func (c *Containers) Lookup(ctx context.Context, target, handle string) (*Container, error) {
	return notKept(c.Records.Cached(ctx, target, handle))
}

// whole is target's container handle as Lookup finds it, with its
// environment: read from the API server.
func (c *Containers) whole(ctx context.Context, target, handle string) (*Container, error) {
	return notKept(c.Records.Get(ctx, target, handle))
}

// notKept is ct, or garden.ContainerNotFoundError if the web node
// destroyed it.
func notKept(ct *Container, err error) (*Container, error) {
	if err == nil && !ct.state.Kept.IsZero() {
		return nil, garden.ContainerNotFoundError{Handle: ct.Handle()} // destroyed; its pod kept for its volumes
	}
	return ct, err
}

// Info is target's container handle as Garden's Info says one: active,
// or stopped once it is lost (lost.go); the pod's IP and its node's; the
// IDs of the processes run in it (Garden lists those running; jetway
// keeps no such list); its properties.
func (c *Containers) Info(ctx context.Context, target, handle string) (garden.ContainerInfo, error) {
	ct, err := c.Lookup(ctx, target, handle)
	if err != nil {
		return garden.ContainerInfo{}, err
	}
	info := garden.ContainerInfo{State: "active", Events: []string{}, ProcessIDs: ct.Processes(), Properties: ct.Properties(),
		MappedPorts: []garden.PortMapping{}}
	if ct.lostError() != nil {
		info.State = "stopped"
	}
	if !ct.Agent {
		if t, err := listed(c.Targets, ct.Target); err == nil && t != nil {
			if p := t.CachedPod(ct.Pod); p != nil {
				info.ContainerIP, info.HostIP = p.Status.PodIP, p.Status.HostIP
			}
		}
	}
	return info, nil
}

// List is the handles of target's containers whose properties include
// all of filter's.
func (c *Containers) List(ctx context.Context, target string, filter garden.Properties) ([]string, error) {
	all, err := c.Records.List(ctx, target)
	if err != nil {
		return nil, err
	}
	handles := []string{}
next:
	for _, ct := range all {
		if !ct.state.Kept.IsZero() {
			continue
		}
		for k, v := range filter {
			if have, ok := ct.properties[k]; !ok || have != v {
				continue next
			}
		}
		handles = append(handles, ct.Handle())
	}
	return handles, nil
}

// SetProperty sets a property of target's container handle.
func (c *Containers) SetProperty(ctx context.Context, target, handle, key, value string) error {
	return c.Records.Change(ctx, target, handle, func(ct *Container) error {
		ct.properties[key] = value
		return nil
	})
}

// RemoveProperty removes a property of target's container handle.
func (c *Containers) RemoveProperty(ctx context.Context, target, handle, key string) error {
	return c.Records.Change(ctx, target, handle, func(ct *Container) error {
		if _, ok := ct.properties[key]; !ok {
			return fmt.Errorf("%w: %s", ErrPropertyNotFound, key)
		}
		delete(ct.properties, key)
		return nil
	})
}

// Destroy deletes target's container handle: its pods jetway sealed, then
// its record. A pod of that handle jetway did not seal is left alone.
func (c *Containers) Destroy(ctx context.Context, target, handle string) error {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	ct, err := c.Records.Get(ctx, target, handle)
	if err != nil {
		return err
	}
	if kept, err := c.Records.keep(ctx, ct); kept || err != nil {
		if err == nil {
			c.Metrics.container("destroyed")
		}
		return err
	}
	w, err := c.workerOf(ct)
	if err == nil {
		err = w.destroyContainer(ctx, handle)
	}
	if err != nil && !errors.Is(err, ErrNotOurs) {
		return err
	}
	if err := c.Records.Delete(ctx, target, handle); err != nil {
		return err
	}
	c.Metrics.container("destroyed")
	return nil
}

// target is a cluster target whose pods are listed, and the pod options
// with the pod key read.
func (c *Containers) target(target string) (*targets.Target, steppod.Options, error) {
	t, err := listed(c.Targets, target)
	if err != nil {
		return nil, steppod.Options{}, err
	}
	if t == nil {
		return nil, steppod.Options{}, errUnknownWorker(target)
	}
	opts := c.Pod()
	if opts.Key.IsZero() {
		return nil, opts, errors.New("the installation's pod key is not read yet: jetway makes no pod before")
	}
	return t, opts, nil
}

// image is the image the pod of spec runs: what its rootfs names, read as
// docs/concourse.md says; and the credentials to pull it with, if a
// registry-image get's source gave them (pullcreds.go).
func (c *Containers) image(ctx context.Context, target string, spec garden.ContainerSpec) (string, *pullCredential, error) {
	rootfs := spec.Image.URI
	if rootfs == "" {
		rootfs = spec.RootFSPath
	}
	if spec.Image.Username != "" || spec.Image.Password != "" {
		return "", nil, fmt.Errorf("image %s: jetway does not take a registry's credentials from the web node: "+
			"give the target's namespace an image pull secret (imagePullSecrets in its target.yaml)", rootfs)
	}
	scheme, rest, _ := strings.Cut(rootfs, "://")
	switch scheme {
	case "docker":
		ref, err := dockerImage(rootfs, rest)
		return ref, nil, err
	case "raw":
		return c.rawImage(ctx, target, rootfs, rest)
	}
	return "", nil, fmt.Errorf("image %q: jetway runs docker:///REPOSITORY#TAG, an image_resource or image: from a registry-image get, "+
		"or a base resource type; not this", rootfs)
}

// dockerImage is docker://[HOST]/REPOSITORY[#TAG] as a reference.
func dockerImage(rootfs, rest string) (string, error) {
	ref, tag, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "#")
	if ref == "" {
		return "", fmt.Errorf("image %q names no repository", rootfs)
	}
	if tag != "" {
		ref += ":" + tag
	}
	return ref, nil
}

// rawImage is the image of a volume: raw://P/rootfs, a copy of a
// registry-image get's volume, runs the repository and digest that get
// wrote beside rootfs/; any other raw://P/rootfs runs that rootfs, served
// by the target's volume holder (images.go); raw://P, a copy of a base
// type's import, runs the image the operator mapped the type to.
func (c *Containers) rawImage(ctx context.Context, target, rootfs, p string) (string, *pullCredential, error) {
	if c.Holder == nil {
		return "", nil, fmt.Errorf("image %s: this gateway keeps no volumes (no state namespace)", rootfs)
	}
	dir, imageDir := strings.CutSuffix(p, "/rootfs")
	handle := path.Base(dir)
	v, err := c.Holder.Volume(ctx, target, handle)
	if errors.Is(err, errVolumeNotFound) || (err == nil && v.Path != dir) {
		return "", nil, fmt.Errorf("image %s: worker %s has no volume at %s", rootfs, target, dir)
	}
	if err != nil {
		return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
	}
	if !imageDir {
		for _, rt := range c.ResourceTypes {
			if v.ImportPath == rt.Image {
				return rt.Image, nil, nil
			}
		}
		return "", nil, fmt.Errorf("image %s: volume %s is no base resource type's import (imported from %q): "+
			"jetway runs a volume as an image only if it is a registry-image get's (image_resource, or image: from a get)", rootfs, handle, v.ImportPath)
	}
	read := func(name string) (string, error) {
		b, err := c.Holder.ReadFile(ctx, target, handle, name, imageFileLimit)
		return strings.TrimSpace(string(b)), err
	}
	repo, err := read("repository")
	if err == nil {
		var digest string
		if digest, err = read("digest"); err == nil && repo != "" && strings.HasPrefix(digest, "sha256:") {
			if ref, cred, ok := c.unpackedGet(ctx, target, rootfs, handle); ok {
				return ref, cred, nil
			}
			cred, err := c.volumeCredential(ctx, target, handle, repo, digest)
			if err != nil {
				return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
			}
			return repo + "@" + digest, cred, nil
		}
	}
	if err != nil && !errors.Is(err, errVolumeNotFound) {
		return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
	}
	// No registry-image get's: a rootfs of its own (a task built it, a
	// get mirrored it), which the target's holder serves (images.go).
	t, err := listed(c.Holder.Targets, target)
	if err != nil {
		return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
	}
	if t == nil {
		return "", nil, fmt.Errorf("image %s: worker %s is no cluster target: only a cluster target's volume holder serves a rootfs as an image", rootfs, target)
	}
	return c.servedImage(ctx, t, rootfs, handle)
}

// mountVolume is the pod's volume of the container's bind mount i.
func mountVolume(i int) string { return "m" + strconv.Itoa(i) }

// podMounts are a container's bind mounts as volumes of its pod's
// emptyDir: each its own folder, named by its order.
func podMounts(bms []garden.BindMount) ([]steppod.Mount, error) {
	out := make([]steppod.Mount, 0, len(bms))
	for i, bm := range bms {
		if !path.IsAbs(bm.DstPath) || path.Clean(bm.DstPath) == "/" {
			return nil, fmt.Errorf("bind mount %d: destination %q is not an absolute path below /", i, bm.DstPath)
		}
		out = append(out, steppod.Mount{Path: path.Clean(bm.DstPath), Volume: mountVolume(i),
			ReadOnly: bm.Mode == garden.BindMountModeRO})
	}
	return out, nil
}

// resources are a container's limits as a step's: memory as bytes, CPU
// shares as cores (1024 shares, one core, as the kubelet counts them).
func resources(l garden.Limits) wire.Resources {
	var r wire.Resources
	if shares := max(l.CPU.Weight, l.CPU.LimitInShares); shares > 0 {
		r.CPU = strconv.FormatUint(max(shares*1000/1024, 1), 10) + "m"
	}
	if b := l.Memory.LimitInBytes; b > 0 {
		r.Memory = strconv.FormatUint(b, 10)
	}
	return r
}

func (c *Containers) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// destroyPods deletes the sealed pods of container handle; a pod of that
// handle jetway did not seal stays, and the answer is ErrNotOurs.
func destroyPods(ctx context.Context, t *targets.Target, key ownership.Key, handle string) error {
	var foreign []string
	for _, p := range t.Pods() {
		if p.Labels[ContainerLabel] != handle {
			continue
		}
		if !key.Sealed(t.Name(), p) {
			foreign = append(foreign, p.Name)
			continue
		}
		if err := deletePod(ctx, t, p); err != nil {
			return fmt.Errorf("container %s: delete pod %s/%s: %w", handle, t.Namespace(), p.Name, err)
		}
	}
	if foreign != nil {
		return fmt.Errorf("container %s: pods %v carry its handle but jetway did not make them: %w", handle, foreign, ErrNotOurs)
	}
	return nil
}

// streamRetrying streams req, again for a while after a failure that may
// pass (not a final answer of a volume server): a pod
// just running may not answer on its sidecar's port yet (the sidecar
// starts after the step container, and its first process waits only for
// it to start; kwok forwards a moment later). The first retries come
// quickly, as the sidecar listens milliseconds after it starts. A final
// answer (a holder's full, an entry refused or unreadable) is the same
// the next time: it is tried once. Each failure is logged, a final one
// as a warning.
func (h *Holder) streamRetrying(ctx context.Context, req streams.Request) (wire.StreamResult, error) {
	deadline := time.Now().Add(holderAnswer)
	wait := firstMoveRetry
	for try := 1; ; try++ {
		res, err := h.Stream(ctx, req)
		if err == nil {
			return res, nil
		}
		remote, answered := errors.AsType[*streams.RemoteError](err)
		final := answered && remote.Final()
		level := slog.LevelDebug
		if final {
			level = slog.LevelWarn
		}
		h.logger().Log(ctx, level, "volume move failed", "target", req.From.Target, "from", req.From.Pod, "to", req.To.Pod,
			"try", try, "final", final, "error", err.Error())
		if final || ctx.Err() != nil || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, holderPoll)
	}
}

// firstMoveRetry is the wait before a move's first retry.
const firstMoveRetry = 10 * time.Millisecond

// holdsMounts reports whether another of mounts is nested in bm.
func holdsMounts(mounts []garden.BindMount, bm garden.BindMount) bool {
	dir := path.Clean(bm.DstPath) + "/"
	for _, m := range mounts {
		if strings.HasPrefix(path.Clean(m.DstPath), dir) {
			return true
		}
	}
	return false
}

// moveTimeout bounds moving one container's volumes in or out.
const moveTimeout = 30 * time.Minute

// moveIn copies the volumes the container's bind mounts name from the
// target's volume holder into its pod's mounts, once: before its first
// process.
func (c *Containers) moveIn(ctx context.Context, ct *Container) error {
	if ct.state.MovedIn {
		return nil
	}
	if err := c.move(ctx, ct, true); err != nil {
		return err
	}
	return c.Records.Change(ctx, ct.Target, ct.Handle(), func(rc *Container) error {
		rc.state.MovedIn = true
		return nil
	})
}

// moveOut leaves what the container's process wrote in its pod's
// writable mounts, and records there that their volumes are held by the
// pod (held.go): they are copied back when first read.
func (c *Containers) moveOut(ctx context.Context, ct *Container) error { return c.move(ctx, ct, false) }

// move moves the volumes of ct's bind mounts in or out, as its worker
// keeps them (worker.moveVolumes).
func (c *Containers) move(ctx context.Context, ct *Container, in bool) error {
	if c.Holder == nil || c.Holder.Stream == nil {
		return nil
	}
	w, err := c.workerOf(ct)
	if err != nil {
		return err
	}
	return w.moveVolumes(ctx, ct, in)
}

// movePod copies each bind mount's volume into ct's pod, at most
// moveParallel at once, but the web node's /scratch (a new empty volume
// each time). A volume another pod holds is copied out of it first
// (Holder.settle). A mount whose source is no volume of the holder
// (a path of the web node's worker host) is left empty.
func (c *Containers) movePod(ctx context.Context, ct *Container) error {
	ctx, cancel := context.WithTimeout(ctx, moveTimeout)
	defer cancel()
	holder := steppod.HolderName(c.Pod().Installation)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(moveParallel)
	for i, bm := range ct.Spec.BindMounts {
		if bm.DstPath == scratchPath {
			continue
		}
		g.Go(func() error {
			handle := path.Base(bm.SrcPath)
			if err := c.Holder.settle(gctx, ct.Target, handle); err != nil {
				return fmt.Errorf("container %s: volume %s (%s): %w", ct.Handle(), handle, bm.DstPath, err)
			}
			v, err := c.Holder.Volume(gctx, ct.Target, handle)
			if err := c.wentWithHolder(ct, bm, err); err != nil {
				return err
			}
			if errors.Is(err, errVolumeNotFound) || (err == nil && v.Path != bm.SrcPath) {
				return nil
			}
			if err != nil {
				return err
			}
			req := streams.Request{StreamRequest: wire.StreamRequest{
				From:     wire.Endpoint{Target: ct.Target, Pod: holder, Handle: handle, Path: "."},
				To:       wire.Endpoint{Target: ct.Target, Pod: ct.Pod, Handle: mountVolume(i), Path: "."},
				Encoding: volumes.Raw,
			}, Caller: streams.Caller{Admin: true}}
			start := time.Now()
			res, err := c.Holder.streamRetrying(gctx, req)
			if remote, ok := errors.AsType[*streams.RemoteError](err); ok && remote.Final() {
				// What the user must change: the entry and why, not the
				// way the copy went.
				return fmt.Errorf("container %s: volume %s cannot be copied into its pod (%s): %w", ct.Handle(), handle, bm.DstPath, remote)
			}
			if se, ok := errors.AsType[*streams.Error](err); ok && se.Side == streams.SideSource && errors.Is(err, streams.ErrNotFound) {
				// The holder went during the copy: as if it had gone before.
				if err := c.wentWithHolder(ct, bm, fmt.Errorf("%w: %w", errVolumeNotFound, err)); err != nil {
					return err
				}
			}
			if err != nil {
				return fmt.Errorf("container %s: move volume %s into its pod (%s): %w", ct.Handle(), handle, bm.DstPath, err)
			}
			c.Metrics.moved(true, res.Bytes, time.Since(start))
			c.logger().Debug("volume moved", "container", ct.Handle(), "volume", handle, "into_pod", true, "bytes", res.Bytes, "sha256", res.SHA256)
			return nil
		})
	}
	return g.Wait()
}
