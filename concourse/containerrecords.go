package concourse

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"code.cloudfoundry.org/garden"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/watchcache"
)

// ContainerRecords keep the web node's containers on cluster targets as
// Secrets in the installation's state namespace, one per container: what
// Create was given (its environment too, which never goes into a pod's
// spec, where anyone who may read pods in the target namespace would see
// it) and the properties the web node sets. They make a container
// durable: a restarted gateway, or another replica, answers from them.
//
// Start watches them: once the watch has listed them, List and Cached
// read what it shows (what this process writes is shown at once, other
// replicas' writes a moment later) instead of asking the API server each
// call, so that the web node's Lookups, heartbeats and sweeps cost the
// API server nothing per container. The watch keeps each record without
// its environment, the one part of a container as large as a user makes
// it: Get reads a whole record.
type ContainerRecords struct {
	Secrets      corev1client.SecretInterface
	Installation string

	cacheOnce sync.Once
	cache     *watchcache.Cache
}

const (
	// containerRecordLabel marks a container's record, with its
	// installation as the value; the target is ownership.WorkerLabel's.
	containerRecordLabel = "jetway-ci.dev/concourse-container-of"
	containerRecordType  = "jetway-ci.dev/concourse-container"
	specKey              = "spec"
	propertiesKey        = "properties"
	processesKey         = "processes"
	stateKey             = "state"
	// maxProcesses bounds the processes kept of one container.
	maxProcesses = 1024
	// maxRecordData bounds a record's spec and properties together: a
	// Secret must fit etcd's 1.5 MiB request limit.
	maxRecordData = 1 << 20
	// recordTimeout bounds one call to the state namespace's API server.
	recordTimeout = 15 * time.Second
)

// ErrPropertyNotFound: the container has no such property.
var ErrPropertyNotFound = errors.New("property does not exist")

// Container is a web node's container as jetway keeps it.
type Container struct {
	Target string `json:"target"`
	// Pod is the container's pod in the target's namespace: none on an
	// agent's machine (Agent), where it is a folder.
	Pod string `json:"pod"`
	// Agent: the container is on an agent's machine (Containers.Agents).
	Agent bool `json:"agent,omitempty"`
	// Image is what the pod runs, resolved from the spec's rootfs.
	Image string `json:"image"`
	// Spec is what the web node's Create gave, as it gave it.
	Spec    garden.ContainerSpec `json:"spec"`
	Created time.Time            `json:"created"`

	properties garden.Properties
	// processes are the IDs of the processes run in it, in order.
	processes []string
	state     containerState
	// pull is the credential its image is pulled with, between Create's
	// resolving the image and making the pod: never recorded (the pod's
	// own pull secret holds it, and goes with the pod).
	pull *pullCredential
}

// containerState is what jetway did to a container.
type containerState struct {
	// MovedIn: the volumes its bind mounts name were moved into its pod.
	MovedIn bool `json:"moved_in,omitempty"`
	// Holds: its pod holds volumes its processes wrote (held.go).
	Holds bool `json:"holds,omitempty"`
	// Kept: when the web node destroyed it while its pod held volumes;
	// gone to the web node since, its pod kept until Pods.Release.
	Kept time.Time `json:"kept,omitzero"`
	// Lost: when its pod was found gone for good (lost.go), and why.
	Lost    time.Time `json:"lost,omitzero"`
	LostWhy string    `json:"lost_why,omitempty"`
}

// HasProcess reports whether a process of id was run in the container.
func (c *Container) HasProcess(id string) bool { return slices.Contains(c.processes, id) }

// Processes are the IDs of the processes run in the container.
func (c *Container) Processes() []string { return slices.Clone(c.processes) }

// Properties are the container's properties (a copy).
func (c *Container) Properties() garden.Properties {
	out := make(garden.Properties, len(c.properties))
	for k, v := range c.properties {
		out[k] = v
	}
	return out
}

// Handle is the container's Garden handle.
func (c *Container) Handle() string { return c.Spec.Handle }

// name is the record of target's container handle.
func (s *ContainerRecords) name(target, handle string) string {
	sum := sha256.Sum256([]byte(s.Installation + "\x00" + target + "\x00" + handle))
	return "jetway-container-" + hex.EncodeToString(sum[:])[:20]
}

// Create keeps a new container; an existing one of its handle is an
// error naming it.
func (s *ContainerRecords) Create(ctx context.Context, c *Container) error {
	obj, err := s.encode(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	made, err := s.Secrets.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("a container with handle %s already exists on worker %s", c.Handle(), c.Target)
	}
	if err != nil {
		return fmt.Errorf("keep container %s in the state namespace: %w", c.Handle(), err)
	}
	s.show(made)
	return nil
}

// Start watches the records until ctx ends.
func (s *ContainerRecords) Start(ctx context.Context) error {
	c := s.watch()
	c.Run(ctx, "concourse container records", watchcache.ListWatch(s.Secrets,
		watchcache.Labelled(containerRecordLabel+"="+s.Installation)), &corev1.Secret{})
	return nil
}

// watch is the records' cache, made on first use.
func (s *ContainerRecords) watch() *watchcache.Cache {
	s.cacheOnce.Do(func() {
		s.cache = watchcache.New(viewRecords)
		s.cache.Transform(s.slim)
	})
	return s.cache
}

// Synced reports whether the watch has listed the records, and if not,
// its last failure.
func (s *ContainerRecords) Synced() (bool, error) { return s.watch().Synced() }

// cached is the cache once it has listed the records, else nil: then
// reads go to the API server.
func (s *ContainerRecords) cached() *watchcache.Cache {
	c := s.watch()
	if ok, _ := c.Synced(); !ok {
		return nil
	}
	return c
}

// slim decodes a record the watch or a write brings, without its
// environment; a record that is not a container's is dropped.
func (s *ContainerRecords) slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *cachedContainer:
		return o, nil
	case *corev1.Secret:
		c, err := s.decode(o, o.Labels[ownership.WorkerLabel], "")
		if err != nil {
			return nil, err
		}
		c.Spec.Env = nil
		return &cachedContainer{ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace,
			ResourceVersion: o.ResourceVersion}, c: c}, nil
	default:
		return nil, fmt.Errorf("container records: unexpected %T", obj)
	}
}

// cachedContainer is a record as the cache keeps it.
type cachedContainer struct {
	metav1.ObjectMeta
	c *Container
}

// recordsView is the cache's view: the records by name, and the
// containers of each target.
type recordsView struct {
	byName   map[string]*cachedContainer
	byTarget map[string][]*Container
}

func viewRecords(items []any) any {
	v := recordsView{byName: map[string]*cachedContainer{}, byTarget: map[string][]*Container{}}
	for _, it := range items {
		cc := it.(*cachedContainer)
		v.byName[cc.Name] = cc
		v.byTarget[cc.c.Target] = append(v.byTarget[cc.c.Target], cc.c)
	}
	return v
}

// show shows a record this process wrote in the cache at once.
func (s *ContainerRecords) show(obj *corev1.Secret) {
	s.watch().Apply(obj)
}

// forgetCached drops a record this process deleted from the cache.
func (s *ContainerRecords) forgetCached(name string) {
	c := s.watch()
	if cc, ok := c.View().(recordsView).byName[name]; ok {
		c.Forget(cc)
	}
}

// copied is a copy of a cached container, its own to change.
func copied(c *Container) *Container {
	out := *c
	out.properties = c.Properties()
	out.processes = slices.Clone(c.processes)
	return &out
}

// Cached is target's container handle as the watch last saw it, without
// its environment (Spec.Env): what Lookup needs. A record the watch does
// not show yet (another replica's a moment ago), or every one before the
// watch has listed them, is read from the API server.
func (s *ContainerRecords) Cached(ctx context.Context, target, handle string) (*Container, error) {
	if c := s.cached(); c != nil {
		if cc, ok := c.View().(recordsView).byName[s.name(target, handle)]; ok && cc.c.Target == target && cc.c.Handle() == handle {
			return copied(cc.c), nil
		}
	}
	return s.Get(ctx, target, handle)
}

// Get is target's container handle: garden.ContainerNotFoundError if
// there is none.
func (s *ContainerRecords) Get(ctx context.Context, target, handle string) (*Container, error) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	obj, err := s.Secrets.Get(ctx, s.name(target, handle), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, garden.ContainerNotFoundError{Handle: handle}
	}
	if err != nil {
		return nil, fmt.Errorf("read container %s from the state namespace: %w", handle, err)
	}
	c, err := s.decode(obj, target, handle)
	if err == nil {
		s.show(obj)
	}
	return c, err
}

// List is target's containers: as the watch shows them (without their
// environment) once it has listed them, else from the API server.
func (s *ContainerRecords) List(ctx context.Context, target string) ([]*Container, error) {
	if c := s.cached(); c != nil {
		cts := c.View().(recordsView).byTarget[target]
		out := make([]*Container, len(cts))
		for i, ct := range cts {
			out[i] = copied(ct)
		}
		return out, nil
	}
	return s.list(ctx, target)
}

// list is target's containers, as the API server lists them.
func (s *ContainerRecords) list(ctx context.Context, target string) ([]*Container, error) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	list, err := s.Secrets.List(ctx, metav1.ListOptions{LabelSelector: s.selector(target)})
	if err != nil {
		return nil, fmt.Errorf("list the containers of worker %s in the state namespace: %w", target, err)
	}
	out := make([]*Container, 0, len(list.Items))
	for i := range list.Items {
		c, err := s.decode(&list.Items[i], target, "")
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Change applies change to target's container handle (its properties and
// processes) and writes them, again on a conflict with another writer.
func (s *ContainerRecords) Change(ctx context.Context, target, handle string, change func(*Container) error) error {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := s.Secrets.Get(ctx, s.name(target, handle), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return garden.ContainerNotFoundError{Handle: handle}
		}
		if err != nil {
			return fmt.Errorf("read container %s from the state namespace: %w", handle, err)
		}
		c, err := s.decode(obj, target, handle)
		if err != nil {
			return err
		}
		if err := change(c); err != nil {
			return err
		}
		if len(c.processes) > maxProcesses {
			return fmt.Errorf("container %s: at most %d processes are run in one container", handle, maxProcesses)
		}
		props, _ := json.Marshal(c.properties)
		procs, _ := json.Marshal(c.processes)
		state, _ := json.Marshal(c.state)
		if n := len(props) + len(procs) + len(state) + len(obj.Data[specKey]); n > maxRecordData {
			return fmt.Errorf("container %s: its record would take %d bytes; at most %d are kept", handle, n, maxRecordData)
		}
		// A merge patch with the version read: a conflict if another
		// writer came first (the state Role grants patch, not update).
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": obj.ResourceVersion},
			"data": map[string]string{propertiesKey: base64.StdEncoding.EncodeToString(props),
				processesKey: base64.StdEncoding.EncodeToString(procs), stateKey: base64.StdEncoding.EncodeToString(state)}})
		patched, err := s.Secrets.Patch(ctx, obj.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			s.forgetCached(obj.Name)
			return garden.ContainerNotFoundError{Handle: handle}
		}
		if err == nil {
			s.show(patched)
		}
		return err
	})
}

// Delete forgets target's container handle; nil if it is gone.
func (s *ContainerRecords) Delete(ctx context.Context, target, handle string) error {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	name := s.name(target, handle)
	err := s.Secrets.Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("forget container %s in the state namespace: %w", handle, err)
	}
	s.forgetCached(name)
	return nil
}

// Forget forgets every container of target: the web node no longer has
// its worker (deleted there), so no call will name them again. It
// returns how many it forgot.
func (s *ContainerRecords) Forget(ctx context.Context, target string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	list, err := s.Secrets.List(ctx, metav1.ListOptions{LabelSelector: s.selector(target)})
	if err != nil {
		return 0, fmt.Errorf("list the containers of %s in the state namespace: %w", target, err)
	}
	n := 0
	for _, sec := range list.Items {
		err := s.Secrets.Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sec.UID}})
		switch {
		case err == nil:
			n++
			s.forgetCached(sec.Name)
		case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err): // gone, or made anew since the list
			return n, fmt.Errorf("forget the containers of %s in the state namespace: %w", target, err)
		}
	}
	return n, nil
}

func (s *ContainerRecords) selector(target string) string {
	return labels.SelectorFromSet(s.labels(target)).String()
}

func (s *ContainerRecords) labels(target string) map[string]string {
	return map[string]string{containerRecordLabel: s.Installation, ownership.WorkerLabel: target}
}

func (s *ContainerRecords) encode(c *Container) (*corev1.Secret, error) {
	spec, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	props, _ := json.Marshal(c.properties)
	if len(spec)+len(props) > maxRecordData {
		return nil, fmt.Errorf("container %s: its spec and properties take %d bytes; at most %d are kept", c.Handle(), len(spec)+len(props), maxRecordData)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: s.name(c.Target, c.Handle()), Labels: s.labels(c.Target)},
		Type:       containerRecordType,
		Data:       map[string][]byte{specKey: spec, propertiesKey: props},
	}, nil
}

// decode reads a record; a record that is not of target's container
// handle ("" for any) is an error: nothing is taken from it.
func (s *ContainerRecords) decode(obj *corev1.Secret, target, handle string) (*Container, error) {
	var c Container
	if err := json.Unmarshal(obj.Data[specKey], &c); err != nil {
		return nil, fmt.Errorf("container record %s: %w", obj.Name, err)
	}
	if err := json.Unmarshal(obj.Data[propertiesKey], &c.properties); err != nil {
		return nil, fmt.Errorf("container record %s: properties: %w", obj.Name, err)
	}
	if c.properties == nil {
		c.properties = garden.Properties{}
	}
	if b := obj.Data[processesKey]; len(b) > 0 {
		if err := json.Unmarshal(b, &c.processes); err != nil {
			return nil, fmt.Errorf("container record %s: processes: %w", obj.Name, err)
		}
	}
	if b := obj.Data[stateKey]; len(b) > 0 {
		if err := json.Unmarshal(b, &c.state); err != nil {
			return nil, fmt.Errorf("container record %s: state: %w", obj.Name, err)
		}
	}
	if c.Target != target || (handle != "" && c.Handle() != handle) || obj.Name != s.name(c.Target, c.Handle()) {
		return nil, fmt.Errorf("container record %s is not of container %s on worker %s", obj.Name, handle, target)
	}
	return &c, nil
}
