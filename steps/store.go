package steps

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/watchcache"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Records keeps the step records of an installation: the Store, in a
// namespace of a cluster; the package's unit tests use one in memory.
type Records interface {
	// Synced reports whether the records were listed once, and if not the
	// last failure.
	Synced() (bool, error)
	// Changed returns a channel closed at the next change of any record.
	Changed() <-chan struct{}
	// Get and List read the records as last seen (with the writes of this
	// process at once). They are shared: do not modify them.
	Get(name string) (*Record, bool)
	List() []*Record
	// Create makes a step's record, or returns the one of its name and
	// false.
	Create(ctx context.Context, sum Summary, st Status, request []byte) (*Record, bool, error)
	// Update changes a record's status with change, applied to the record
	// as it is (again, if another writer came first). change returns
	// ErrUnchanged to write nothing. A result set with setResult is
	// written with the status.
	Update(ctx context.Context, name string, change func(r *Record) error) (*Record, error)
	// Request and Result read what the records keep out of their
	// metadata: the request (environment and stdin included) and a
	// resource step's answer.
	Request(ctx context.Context, name string) ([]byte, error)
	Result(ctx context.Context, name string) ([]byte, error)
	// Delete forgets a record.
	Delete(ctx context.Context, r *Record) error
	// Refresh reads every record from the source, so what Get and List
	// return is at least as new as every write done before it was called
	// (a new placer reads its predecessor's placements so).
	Refresh(ctx context.Context) error
}

var (
	// ErrUnchanged: a change that has nothing to write (Records.Update
	// writes nothing and returns the record as it is).
	ErrUnchanged = errors.New("nothing to change")
	// ErrRecordGone: the record was deleted.
	ErrRecordGone = errors.New("the step's record is gone")

	errUnchanged  = ErrUnchanged
	errRecordGone = ErrRecordGone
)

// storeTimeout bounds one call to the state namespace's API server.
const storeTimeout = 15 * time.Second

// maxRequest bounds a request as kept: a Secret, and so the request, must
// fit etcd's 1.5 MiB request limit with the answer beside it.
const maxRequest = 512 << 10

// StoreOptions configure a Store.
type StoreOptions struct {
	// Config reaches the cluster of the state namespace.
	Config *rest.Config
	// Namespace is the state namespace.
	Namespace    string
	Installation string
	Logger       *slog.Logger
}

// Store keeps the step records of an installation as Secrets in its state
// namespace. Every gateway of the installation watches their metadata (the
// summary and status annotations, never their data); a write goes out
// with the resource version it changes, so two writers never overwrite
// each other.
type Store struct {
	secrets      corev1client.SecretInterface
	meta         metadata.ResourceInterface
	namespace    string
	installation string
	cache        *watchcache.Cache
	log          *slog.Logger
}

var secretsResource = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// NewStore builds a Store; it does not touch the network. Start runs its
// watch.
func NewStore(o StoreOptions) (*Store, error) {
	rc := rest.CopyConfig(o.Config)
	rc.QPS, rc.Burst = 100, 200
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("step records: %w", err)
	}
	core, err := corev1client.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("step records: %w", err)
	}
	meta, err := metadata.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("step records: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{secrets: core.Secrets(o.Namespace), meta: meta.Resource(secretsResource).Namespace(o.Namespace),
		namespace: o.Namespace, installation: o.Installation, cache: watchcache.New(func([]any) any { return nil }), log: o.Logger}
	s.cache.Transform(s.decode)
	return s, nil
}

// Namespace is the state namespace.
func (s *Store) Namespace() string { return s.namespace }

// Start watches the records until ctx ends.
func (s *Store) Start(ctx context.Context) error {
	lw := watchcache.ListWatch(s.meta, watchcache.Labelled(RecordLabel+"="+s.installation))
	s.cache.Run(ctx, "step records in "+s.namespace, lw, &metav1.PartialObjectMetadata{})
	return nil
}

// decode turns what the watch or a write brings into a *Record.
func (s *Store) decode(obj any) (any, error) {
	var m metav1.ObjectMeta
	switch o := obj.(type) {
	case *Record:
		return o, nil
	case *metav1.PartialObjectMetadata:
		m = o.ObjectMeta
	case *corev1.Secret:
		m = o.ObjectMeta
	default:
		return nil, fmt.Errorf("step records: unexpected %T", obj)
	}
	r, err := decodeRecord(m)
	if err != nil {
		s.log.Warn("step record ignored", "record", m.Name, "error", err.Error())
	}
	return r, err
}

func (s *Store) Synced() (bool, error)    { return s.cache.Synced() }
func (s *Store) Changed() <-chan struct{} { return s.cache.Changes() }

func (s *Store) Get(name string) (*Record, bool) {
	obj, ok := s.cache.Get(s.namespace + "/" + name)
	if !ok {
		return nil, false
	}
	return obj.(*Record), true
}

func (s *Store) List() []*Record {
	items := s.cache.List()
	out := make([]*Record, len(items))
	for i, it := range items {
		out[i] = it.(*Record)
	}
	return out
}

func (s *Store) Create(ctx context.Context, sum Summary, st Status, request []byte) (*Record, bool, error) {
	if len(request) > maxRequest {
		return nil, false, &wire.FieldError{Field: "body", Msg: fmt.Sprintf("%d bytes is more than a step may hold (%d, environment and stdin included)", len(request), maxRequest)}
	}
	name := RecordName(s.installation, sum.Team, sum.Handle)
	rawSum, _ := json.Marshal(sum)
	labels := map[string]string{RecordLabel: s.installation, ownership.InstallationLabel: s.installation}
	if sum.Team != "" {
		labels[ownership.TeamLabel] = sum.Team
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace, Labels: labels,
			Annotations: map[string]string{summaryAnnotation: string(rawSum), statusAnnotation: encodeStatus(st)}},
		Type: recordType,
		Data: map[string][]byte{requestKey: request},
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	made, err := s.secrets.Create(ctx, secret, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		cur, err := s.fresh(ctx, name)
		return cur, false, err
	case err != nil:
		return nil, false, fmt.Errorf("create step record %s/%s: %w", s.namespace, name, err)
	}
	return s.keep(made)
}

// keep decodes an object this process wrote and shows it in the cache.
func (s *Store) keep(obj *corev1.Secret) (*Record, bool, error) {
	r, err := s.decode(obj)
	if err != nil {
		return nil, false, err
	}
	s.cache.Apply(r)
	return r.(*Record), true, nil
}

// fresh reads a record from the API server.
func (s *Store) fresh(ctx context.Context, name string) (*Record, error) {
	m, err := s.meta.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, errRecordGone
	}
	if err != nil {
		return nil, fmt.Errorf("read step record %s/%s: %w", s.namespace, name, err)
	}
	r, err := s.decode(m)
	if err != nil {
		return nil, err
	}
	s.cache.Apply(r)
	return r.(*Record), nil
}

// maxConflicts bounds the retries of a write that other writers keep
// beating.
const maxConflicts = 20

func (s *Store) Update(ctx context.Context, name string, change func(r *Record) error) (*Record, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	cur, ok := s.Get(name)
	for attempt := 0; ; attempt++ {
		if !ok {
			var err error
			if cur, err = s.fresh(ctx, name); err != nil {
				return nil, err
			}
		}
		next := cur.Copy()
		if err := change(next); err != nil {
			if errors.Is(err, errUnchanged) {
				return cur, nil
			}
			return cur, err
		}
		patch := map[string]any{"metadata": map[string]any{"resourceVersion": cur.ResourceVersion,
			"annotations": map[string]string{statusAnnotation: encodeStatus(next.Status)}}}
		if next.result != nil {
			patch["data"] = map[string]string{resultKey: base64.StdEncoding.EncodeToString(next.result)}
		}
		raw, _ := json.Marshal(patch)
		out, err := s.secrets.Patch(ctx, name, types.MergePatchType, raw, metav1.PatchOptions{})
		switch {
		case apierrors.IsConflict(err) && attempt < maxConflicts:
			ok = false // read it again, and apply the change to what is there
			continue
		case apierrors.IsNotFound(err):
			return nil, errRecordGone
		case err != nil:
			return cur, fmt.Errorf("update step record %s/%s: %w", s.namespace, name, err)
		}
		r, _, err := s.keep(out)
		return r, err
	}
}

func (s *Store) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	list, err := s.meta.List(ctx, metav1.ListOptions{LabelSelector: RecordLabel + "=" + s.installation})
	if err != nil {
		return fmt.Errorf("list step records in %s: %w", s.namespace, err)
	}
	for i := range list.Items {
		if r, err := s.decode(&list.Items[i]); err == nil {
			s.cache.Apply(r)
		}
	}
	return nil
}

func (s *Store) Request(ctx context.Context, name string) ([]byte, error) {
	return s.data(ctx, name, requestKey)
}
func (s *Store) Result(ctx context.Context, name string) ([]byte, error) {
	return s.data(ctx, name, resultKey)
}

func (s *Store) data(ctx context.Context, name, key string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	sec, err := s.secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, errRecordGone
	}
	if err != nil {
		return nil, fmt.Errorf("read step record %s/%s: %w", s.namespace, name, err)
	}
	return sec.Data[key], nil
}

func (s *Store) Delete(ctx context.Context, r *Record) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	uid := r.UID
	err := s.secrets.Delete(ctx, r.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete step record %s/%s: %w", s.namespace, r.Name, err)
	}
	s.cache.Forget(r)
	return nil
}

// StatePermissions are what a gateway needs in its state namespace: its
// step records (Secrets; their data only the step's owner reads) and the
// gateways' Leases.
var StatePermissions = func() []targets.Permission {
	var out []targets.Permission
	for _, verb := range []string{"get", "list", "watch", "create", "patch", "delete"} {
		out = append(out, targets.Permission{Resource: "secrets", Verb: verb})
	}
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		out = append(out, targets.Permission{Group: "coordination.k8s.io", Resource: "leases", Verb: verb})
	}
	return out
}()
