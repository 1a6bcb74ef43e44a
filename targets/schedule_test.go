package targets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeProbe answers checks per target name as a test says, and counts them.
type fakeProbe struct {
	mu      sync.Mutex
	answer  map[string]func(ctx context.Context, known string) Health
	calls   map[string]int
	version string // what a version read returns
}

func newFakeProbe() *fakeProbe {
	return &fakeProbe{answer: map[string]func(context.Context, string) Health{}, calls: map[string]int{}, version: "v1.36.3"}
}

// install makes r check through f, with caches that list nothing; a
// target's namespace is its name in tests.
func (f *fakeProbe) install(r *Registry) {
	r.watch = emptyWatch
	r.probe = func(ctx context.Context, tg *Target, known string) Health {
		ns := tg.Namespace()
		f.mu.Lock()
		f.calls[ns]++
		answer, version := f.answer[ns], f.version
		f.mu.Unlock()
		h := Health{At: time.Now(), ServerVersion: known}
		if known == "" {
			h.ServerVersion = version
		}
		if answer != nil {
			a := answer(ctx, known)
			a.At, a.ServerVersion = h.At, h.ServerVersion
			return a
		}
		return h
	}
}

func (f *fakeProbe) set(name string, answer func(context.Context, string) Health) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer[name] = answer
}

func (f *fakeProbe) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

// testConfig is a parsed target whose namespace is its name.
func testConfig(t *testing.T, name string) *Config {
	t.Helper()
	cfg, err := parse(entry{name: name, kubeconfig: []byte(kubeconfig("    server: https://127.0.0.1:1\n", "", ""))}, t.TempDir(), Policy{})
	require.NoError(t, err)
	cfg.Meta.Namespace = name
	return cfg
}

// startRegistry runs r in the test's bubble until the returned stop.
func startRegistry(t *testing.T, r *Registry) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	return func() { cancel(); require.NoError(t, <-done) }
}

var down = func(context.Context, string) Health {
	return Health{Err: errors.New("connection refused"), Reason: ReasonUnreachable}
}

func TestChecksRunOnlyOnceStarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRegistry(RegistryOptions{Interval: 10 * time.Second, Timeout: time.Second, StallAfter: 3, Concurrency: 4})
		probe := newFakeProbe()
		probe.install(r)
		r.Apply(map[string]Result{"a": {Config: testConfig(t, "a")}})
		synctest.Wait()
		assert.Equal(t, 0, probe.count("a"), "Apply before Start starts no check")

		stop := startRegistry(t, r)
		synctest.Wait()
		assert.Equal(t, 1, probe.count("a"), "checked at once on Start")
		time.Sleep(11 * time.Second)
		synctest.Wait()
		assert.Equal(t, 2, probe.count("a"), "then every interval (±10%)")
		stop()

		// After Start returned, every loop is gone (the bubble would not
		// end otherwise) and Apply changes nothing.
		r.Apply(map[string]Result{"b": {Config: testConfig(t, "b")}})
		synctest.Wait()
		assert.Equal(t, 0, probe.count("b"))
	})
}

func TestStallsAfterConsecutiveFailuresOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRegistry(RegistryOptions{Interval: 10 * time.Second, Timeout: time.Second, StallAfter: 3, Concurrency: 4})
		probe := newFakeProbe()
		probe.install(r)
		r.Apply(map[string]Result{"a": {Config: testConfig(t, "a")}})
		defer startRegistry(t, r)()
		synctest.Wait()
		state := func() State { s, err := r.Get("a"); require.NoError(t, err); return s.State }
		require.Equal(t, StateRunning, state())

		probe.set("a", down)
		for i := 1; i <= 2; i++ {
			time.Sleep(11 * time.Second) // past the longest jittered interval
			synctest.Wait()
			assert.Equal(t, StateRunning, state(), "%d failed checks do not stall", i)
		}
		time.Sleep(11 * time.Second)
		synctest.Wait()
		assert.Equal(t, StateStalled, state(), "the third does")
		assert.Equal(t, 4, probe.count("a"))

		probe.set("a", nil)
		time.Sleep(11 * time.Second)
		synctest.Wait()
		assert.Equal(t, StateRunning, state(), "one success brings it back")
	})
}

func TestSlowTargetDelaysNoOtherCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRegistry(RegistryOptions{Interval: 300 * time.Millisecond, Timeout: 2 * time.Second, StallAfter: 1, Concurrency: 2})
		probe := newFakeProbe()
		probe.install(r)
		probe.set("slow", func(ctx context.Context, _ string) Health {
			<-ctx.Done() // a server that never answers
			return Health{Err: ctx.Err(), Reason: ReasonTimeout}
		})
		r.Apply(map[string]Result{"ok": {Config: testConfig(t, "ok")}, "slow": {Config: testConfig(t, "slow")}})
		defer startRegistry(t, r)()

		time.Sleep(3 * time.Second)
		synctest.Wait()
		// Checks at 0 and then every 270-330 ms: at least 10 in 3 s, while
		// each check of the slow target hangs for its 2 s timeout.
		assert.GreaterOrEqual(t, probe.count("ok"), 10)
		assert.Equal(t, 2, probe.count("slow"))
		s, err := r.Get("slow")
		require.NoError(t, err)
		assert.Equal(t, StateStalled, s.State)
	})
}

func TestServerVersionIsRefreshed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRegistry(RegistryOptions{Interval: 10 * time.Second, Timeout: time.Second, StallAfter: 3,
			Concurrency: 1, VersionRefresh: time.Minute})
		probe := newFakeProbe()
		probe.install(r)
		r.Apply(map[string]Result{"a": {Config: testConfig(t, "a")}})
		defer startRegistry(t, r)()
		synctest.Wait()
		version := func() string { s, err := r.Get("a"); require.NoError(t, err); return s.ServerVersion }
		require.Equal(t, "v1.36.3", version())

		probe.mu.Lock()
		probe.version = "v1.37.0" // the cluster is upgraded
		probe.mu.Unlock()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		assert.Equal(t, "v1.36.3", version(), "not read again on every check")
		// Checks come every 9-11 s (jitter): by 80 s one has run at 69 s or
		// later, past the minute since the version was read at 0 s.
		time.Sleep(50 * time.Second)
		synctest.Wait()
		assert.Equal(t, "v1.37.0", version(), "read again after VersionRefresh")
	})
}

// failing is a reconciler that fails while err is set.
type failing struct {
	mu  sync.Mutex
	err error
}

func (f *failing) Reconcile(context.Context, *Target, Health) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func TestReconcileFailureShowsUntilItSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRegistry(RegistryOptions{Interval: time.Minute, Timeout: time.Second, StallAfter: 1, Concurrency: 1})
		newFakeProbe().install(r)
		rc := &failing{err: errors.New("configmaps is forbidden")}
		r.SetReconciler(rc)
		r.Apply(map[string]Result{"a": {Config: testConfig(t, "a")}})
		stop := startRegistry(t, r)
		defer stop()
		synctest.Wait()
		s, err := r.Get("a")
		require.NoError(t, err)
		assert.Equal(t, StateRunning, s.State, "a lifecycle problem does not stall a healthy target")
		assert.Equal(t, "lifecycle: configmaps is forbidden", s.Error)

		rc.mu.Lock()
		rc.err = nil
		rc.mu.Unlock()
		time.Sleep(time.Minute + time.Minute/10)
		synctest.Wait()
		s, _ = r.Get("a")
		assert.Empty(t, s.Error, "cleared by the next reconcile that succeeds")
	})
}

func TestSourceWithoutWatcherStillRereads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		reads := make(chan map[string]Result, 10)
		src := NewSource(SourceOptions{Dir: dir, Resync: 30 * time.Second,
			NewWatcher: func() (*fsnotify.Watcher, error) { return nil, errors.New("too many open files") }},
			func(m map[string]Result) { reads <- m })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- src.Start(ctx) }()
		synctest.Wait()
		require.Len(t, reads, 1, "read once at start")
		assert.Empty(t, <-reads)

		require.NoError(t, os.WriteFile(filepath.Join(dir, "new.kubeconfig"), []byte(kubeconfig("", "", "")), 0o600))
		time.Sleep(30 * time.Second)
		synctest.Wait()
		require.Len(t, reads, 1, "re-read at resync")
		assert.Contains(t, <-reads, "new")
		cancel()
		assert.NoError(t, <-done, "a missing watcher does not stop the gateway")
	})
}
