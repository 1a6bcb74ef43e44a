package targets

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func write(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func TestScanLayouts(t *testing.T) {
	dir := t.TempDir()
	kc := kubeconfig("", "", "")
	write(t, filepath.Join(dir, "plain"), kc)
	write(t, filepath.Join(dir, "suffixed.kubeconfig"), kc)
	write(t, filepath.Join(dir, "folder", "kubeconfig"), kc)
	write(t, filepath.Join(dir, "folder", "target.yaml"), "team: main\n")
	write(t, filepath.Join(dir, "empty-folder", "README"), "no kubeconfig here")
	write(t, filepath.Join(dir, "twice"), kc)
	write(t, filepath.Join(dir, "twice.kubeconfig"), kc)
	write(t, filepath.Join(dir, ".hidden"), "not a target")
	write(t, filepath.Join(dir, "..2026_11_22", "x"), "Secret internals")
	require.NoError(t, os.Symlink("..2026_11_22", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink("absent", filepath.Join(dir, "dangling")))

	results, folders, err := NewSource(SourceOptions{Dir: dir}, nil).Read()
	require.NoError(t, err)
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	assert.ElementsMatch(t, []string{"plain", "suffixed", "folder", "empty-folder", "twice", "dangling"}, names)
	for _, ok := range []string{"plain", "suffixed", "folder"} {
		assert.NoError(t, results[ok].Err, ok)
	}
	assert.Equal(t, "main", results["folder"].Config.Meta.Team)
	assert.ErrorContains(t, results["empty-folder"].Err, "folder empty-folder has no readable kubeconfig")
	assert.ErrorContains(t, results["twice"].Err, `target "twice" is defined twice`)
	assert.ErrorContains(t, results["dangling"].Err, "dangling: no such file or directory")
	assert.ElementsMatch(t, []string{filepath.Join(dir, "folder"), filepath.Join(dir, "empty-folder")}, folders)
}

func TestReadUnreadableDirIsAnError(t *testing.T) {
	_, _, err := NewSource(SourceOptions{Dir: filepath.Join(t.TempDir(), "gone")}, nil).Read()
	require.ErrorContains(t, err, "read targets directory")
}

// secretMount lays out dir as the kubelet does for a Secret: the files live
// in a timestamped folder, ..data points at it, and each visible name is a
// symlink through ..data. swap replaces the contents atomically.
type secretMount struct {
	dir string
	gen int
}

func (m *secretMount) swap(t *testing.T, files map[string]string) {
	t.Helper()
	m.gen++
	ts := filepath.Join(m.dir, "..gen"+strings.Repeat("x", m.gen))
	for name, content := range files {
		write(t, filepath.Join(ts, name), content)
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	require.NoError(t, os.Symlink(filepath.Base(ts), tmp))
	require.NoError(t, os.Rename(tmp, filepath.Join(m.dir, "..data")))
	for name := range files {
		link := filepath.Join(m.dir, name)
		if _, err := os.Lstat(link); err != nil {
			require.NoError(t, os.Symlink(filepath.Join("..data", name), link))
		}
	}
	// Visible names whose file is gone from the new generation go too.
	des, _ := os.ReadDir(m.dir)
	for _, de := range des {
		if _, ok := files[de.Name()]; !ok && !strings.HasPrefix(de.Name(), ".") {
			require.NoError(t, os.Remove(filepath.Join(m.dir, de.Name())))
		}
	}
}

// sink records what a Source hands over.
type sink struct {
	mu   sync.Mutex
	last map[string]Result
	n    int
}

func (s *sink) apply(r map[string]Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.n = r, s.n+1
}

func (s *sink) get() map[string]Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func TestSourceSeesSecretSwapQuickly(t *testing.T) {
	m := &secretMount{dir: t.TempDir()}
	m.swap(t, map[string]string{"a.kubeconfig": kubeconfig("", "", ""), "b.kubeconfig": kubeconfig("", "", "")})

	var got sink
	// A resync far beyond the test: only file events can explain a quick update.
	src := NewSource(SourceOptions{Dir: m.dir, Resync: time.Hour}, got.apply)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Start(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	require.Eventually(t, func() bool { return len(got.get()) == 2 }, 2*time.Second, 10*time.Millisecond)
	tokenOf := func(name string) string {
		r := got.get()[name]
		if r.Config == nil {
			return ""
		}
		return r.Config.REST.BearerToken
	}
	require.Equal(t, secretToken, tokenOf("a"))

	start := time.Now()
	m.swap(t, map[string]string{
		"a.kubeconfig": kubeconfig("", "    token: rotated-token\n", ""), // rotated
		"c.kubeconfig": kubeconfig("", "", ""),                           // added; b removed
	})
	require.Eventually(t, func() bool {
		r := got.get()
		_, hasB := r["b"]
		_, hasC := r["c"]
		return !hasB && hasC && tokenOf("a") == "rotated-token"
	}, 2*time.Second, 10*time.Millisecond, "swap not seen within 2s")
	t.Logf("swap seen after %s", time.Since(start))
}

func TestSourceResyncBacksUpEvents(t *testing.T) {
	dir := t.TempDir()
	var got sink
	src := NewSource(SourceOptions{Dir: dir, Resync: 50 * time.Millisecond}, got.apply)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Start(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	require.Eventually(t, func() bool {
		got.mu.Lock()
		defer got.mu.Unlock()
		return got.n >= 3
	}, 2*time.Second, 10*time.Millisecond, "periodic re-reads")
}

func TestSourceWatchesTargetFolders(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "f", "kubeconfig"), kubeconfig("", "", ""))
	var got sink
	src := NewSource(SourceOptions{Dir: dir, Resync: time.Hour}, got.apply)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Start(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	require.Eventually(t, func() bool { return got.get()["f"].Config != nil }, 2*time.Second, 10*time.Millisecond)

	write(t, filepath.Join(dir, "f", "target.yaml"), "team: late\n")
	require.Eventually(t, func() bool {
		c := got.get()["f"].Config
		return c != nil && c.Meta.Team == "late"
	}, 2*time.Second, 10*time.Millisecond)
}
