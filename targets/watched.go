package targets

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// watched is a reflector's store that keeps, besides the objects, a view
// of them recomputed on every change (counts, a decoded record), so that
// readers never walk the objects and the view can never drift from them:
// after a relist it is computed from the new list alone.
type watched struct {
	store   cache.Store
	compute func(items []any) any

	mu      sync.Mutex
	current any
	listed  bool
	err     error         // the last list or watch failure, until a list succeeds
	changed chan struct{} // closed and replaced on every change
	// onChange, if set, is called after every change (the registry's
	// broadcast), with w.mu held.
	onChange func()
}

func newWatched(compute func([]any) any) *watched {
	return &watched{store: cache.NewStore(cache.MetaNamespaceKeyFunc), compute: compute,
		current: compute(nil), changed: make(chan struct{})}
}

// run fills the store from lw until ctx ends; list and watch failures
// are kept for synced to report.
func (w *watched) run(ctx context.Context, name string, lw *cache.ListWatch, expected runtime.Object) {
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := list(ctx, o)
		w.failed(err)
		return obj, err
	}
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		wi, err := watchFn(ctx, o)
		w.failed(err)
		return wi, err
	}
	cache.NewReflectorWithOptions(lw, expected, w, cache.ReflectorOptions{Name: name}).RunWithContext(ctx)
}

func (w *watched) failed(err error) {
	if err != nil {
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}
}

func (w *watched) view() any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

func (w *watched) synced() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.listed, w.err
}

// changes returns a channel closed at the next change.
func (w *watched) changes() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// await waits until done holds for the stored objects, or ctx ends.
func (w *watched) await(ctx context.Context, done func(items []any) bool) error {
	for {
		w.mu.Lock()
		ok, changed := done(w.store.List()), w.changed
		w.mu.Unlock()
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

// update applies one change to the store and recomputes the view.
func (w *watched) update(change func() error, listed bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := change(); err != nil {
		return err
	}
	if listed {
		w.listed, w.err = true, nil
	}
	w.current = w.compute(w.store.List())
	close(w.changed)
	w.changed = make(chan struct{})
	if w.onChange != nil {
		w.onChange()
	}
	return nil
}

// slim drops what the cache never reads, to keep it small.
func slim(obj any) any {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj
}

// The cache.ReflectorStore methods.

func (w *watched) Add(obj any) error {
	return w.update(func() error { return w.store.Add(slim(obj)) }, false)
}

func (w *watched) Update(obj any) error {
	return w.update(func() error { return w.store.Update(slim(obj)) }, false)
}

func (w *watched) Delete(obj any) error {
	return w.update(func() error { return w.store.Delete(obj) }, false)
}

func (w *watched) Replace(items []any, rv string) error {
	for i := range items {
		items[i] = slim(items[i])
	}
	return w.update(func() error { return w.store.Replace(items, rv) }, true)
}

func (w *watched) Resync() error { return nil }

// broadcast tells waiters that something changed: Wait's channel is closed
// at the next Notify. It allocates only while someone waits.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
