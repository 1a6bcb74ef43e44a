// Package watchcache keeps what a Kubernetes watch shows of some objects:
// a reflector's store that also keeps a view of its objects recomputed on
// every change (counts, a decoded record, an index), so that readers
// never walk the objects and the view can never drift from them: after a
// relist it is computed from the new list alone. Targets keep their step
// pods and lifecycle record in one each; the steps keep their records in
// one. Broadcast tells waiters that something changed.
package watchcache

import (
	"context"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Cache is a reflector's store with a computed view. Its zero value is
// not usable: make one with New.
type Cache struct {
	store     cache.Store
	compute   func(items []any) any
	transform func(obj any) (any, error)

	mu      sync.Mutex
	current any
	listed  bool
	err     error         // the last list or watch failure, until a list succeeds
	changed chan struct{} // closed and replaced on every change
	// onChange, if set, is called after every change, with mu held.
	onChange func()
}

// New makes a Cache whose view is compute of its objects (nil before the
// first list).
func New(compute func(items []any) any) *Cache {
	return &Cache{store: cache.NewStore(cache.MetaNamespaceKeyFunc), compute: compute,
		current: compute(nil), changed: make(chan struct{})}
}

// Transform makes every object pass through f before it is stored (a
// decode done once per change instead of once per read). Set it before
// Run. An object f fails on is dropped, as if it did not exist.
func (c *Cache) Transform(f func(obj any) (any, error)) { c.transform = f }

// OnChange makes f run after every change, while the cache's lock is
// held: f must not call back into the cache. Set it before Run.
func (c *Cache) OnChange(f func()) { c.onChange = f }

// Run fills the cache from lw until ctx ends; list and watch failures are
// kept for Synced to report. A broken watch resumes, or relists when its
// place is gone.
func (c *Cache) Run(ctx context.Context, name string, lw *cache.ListWatch, expected runtime.Object) {
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := list(ctx, o)
		c.Failed(err)
		return obj, err
	}
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		wi, err := watchFn(ctx, o)
		c.Failed(err)
		return wi, err
	}
	cache.NewReflectorWithOptions(lw, expected, c, cache.ReflectorOptions{Name: name}).RunWithContext(ctx)
}

// Failed records a list or watch failure (nil: none), as Run does, for
// Synced to report until the next list.
func (c *Cache) Failed(err error) {
	if err != nil {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}
}

// View returns the view of the objects as last seen.
func (c *Cache) View() any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Get returns the stored object of key (namespace/name), as transformed.
func (c *Cache) Get(key string) (any, bool) {
	obj, ok, _ := c.store.GetByKey(key)
	return obj, ok
}

// List returns the stored objects, as transformed, in no order.
func (c *Cache) List() []any { return c.store.List() }

// Synced reports whether the objects were listed once and, if not, the
// last list or watch failure.
func (c *Cache) Synced() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.listed, c.err
}

// Changes returns a channel closed at the next change.
func (c *Cache) Changes() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Await waits until done holds for the stored objects, or ctx ends.
func (c *Cache) Await(ctx context.Context, done func(items []any) bool) error {
	for {
		c.mu.Lock()
		ok, changed := done(c.store.List()), c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Apply stores obj, which this process has just written, unless the
// cache holds a newer version of it: a writer sees its own write at once,
// before the watch brings it.
func (c *Cache) Apply(obj any) {
	_ = c.Update(obj)
}

// Forget drops obj, which this process has just deleted.
func (c *Cache) Forget(obj any) {
	_ = c.update(func() error { return c.store.Delete(obj) }, false)
}

type staleError struct{}

func (staleError) Error() string { return "stale" }

var errStale error = staleError{}

// update applies one change to the store and recomputes the view.
func (c *Cache) update(change func() error, listed bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := change(); err != nil {
		if err == errStale {
			return nil
		}
		return err
	}
	if listed {
		c.listed, c.err = true, nil
	}
	c.current = c.compute(c.store.List())
	close(c.changed)
	c.changed = make(chan struct{})
	if c.onChange != nil {
		c.onChange()
	}
	return nil
}

// Newer reports whether a's resource version is known to be later than
// b's: both numbers, as etcd's are, and a's the greater. Versions that are
// not numbers cannot be ordered, and are not.
func Newer(a, b any) bool {
	ma, err1 := meta.Accessor(a)
	mb, err2 := meta.Accessor(b)
	if err1 != nil || err2 != nil {
		return false
	}
	x, err1 := strconv.ParseUint(ma.GetResourceVersion(), 10, 64)
	y, err2 := strconv.ParseUint(mb.GetResourceVersion(), 10, 64)
	return err1 == nil && err2 == nil && x > y
}

// NotOlder compares resource versions: equal, or both numbers (as etcd's
// are) and have not older than want.
func NotOlder(have, want string) bool {
	if have == want {
		return true
	}
	h, err1 := strconv.ParseUint(have, 10, 64)
	w, err2 := strconv.ParseUint(want, 10, 64)
	return err1 == nil && err2 == nil && h >= w
}

// Slim drops what the cache never reads (managed fields), to keep it small.
func Slim(obj any) any {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj
}

// The cache.ReflectorStore methods.

// Add stores an object the watch shows.
func (c *Cache) Add(obj any) error { return c.Update(obj) }

// Update stores a changed object the watch shows, unless the cache holds
// a newer version (one this process wrote and applied): the watch brings
// the writes before it first.
func (c *Cache) Update(obj any) error {
	t, err := c.transformed(obj)
	if err != nil {
		return c.Delete(obj) // keyed by namespace and name, as its transform would be
	}
	return c.update(func() error {
		if old, ok, _ := c.store.Get(t); ok && Newer(old, t) {
			return errStale
		}
		return c.store.Update(Slim(t))
	}, false)
}

// Delete drops an object the watch shows gone.
func (c *Cache) Delete(obj any) error {
	return c.update(func() error { return c.store.Delete(obj) }, false)
}

// Replace stores a new list.
func (c *Cache) Replace(items []any, rv string) error {
	kept := items[:0]
	for _, it := range items {
		if it, err := c.transformed(it); err == nil {
			kept = append(kept, Slim(it))
		}
	}
	items = kept
	return c.update(func() error { return c.store.Replace(items, rv) }, true)
}

// transformed is obj after the transform, if any.
func (c *Cache) transformed(obj any) (any, error) {
	if c.transform == nil {
		return obj, nil
	}
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d, nil
	}
	return c.transform(obj)
}

// Resync does nothing: the cache has no handlers to resync.
func (c *Cache) Resync() error { return nil }

// Lister is what a typed client of one kind (or a metadata client of one
// resource) offers a watch.
type Lister[L runtime.Object] interface {
	List(ctx context.Context, o metav1.ListOptions) (L, error)
	Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

// ListWatch lists and watches c's objects that narrow selects (a label or
// field selector), for Run.
func ListWatch[L runtime.Object](c Lister[L], narrow func(*metav1.ListOptions)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			narrow(&o)
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			narrow(&o)
			return c.Watch(ctx, o)
		},
	}
}

// Labelled narrows a list to the objects selector selects.
func Labelled(selector string) func(*metav1.ListOptions) {
	return func(o *metav1.ListOptions) { o.LabelSelector = selector }
}

// Broadcast tells waiters that something changed: Wait's channel is
// closed at the next Notify. It allocates only while someone waits. The
// zero value is ready to use.
type Broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// Wait returns a channel closed at the next Notify.
func (b *Broadcast) Wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Notify wakes every waiter.
func (b *Broadcast) Notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
