package targets

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Entry file names.
const (
	kubeconfigSuffix = ".kubeconfig"
	folderKubeconfig = "kubeconfig"
	folderMetadata   = "target.yaml"
)

// SourceOptions configure a Source.
type SourceOptions struct {
	// Dir is the targets directory, usually a Secret mount.
	Dir    string
	Policy Policy
	// Resync re-reads the directory this often even without file events.
	Resync time.Duration
	// Debounce gathers a burst of file events into one re-read.
	Debounce time.Duration
	Logger   *slog.Logger
	// NewWatcher makes the file watcher; default fsnotify.NewWatcher.
	NewWatcher func() (*fsnotify.Watcher, error)
}

// Source watches the targets directory and feeds what it reads to a sink
// (the Registry): at start, on file events (debounced) and every Resync.
type Source struct {
	opts  SourceOptions
	sink  func(map[string]Result)
	cache map[string]cachedResult
}

type cachedResult struct {
	raw [sha256.Size]byte
	res Result
}

// NewSource builds a Source that hands every read of the directory to sink.
func NewSource(opts SourceOptions, sink func(map[string]Result)) *Source {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 100 * time.Millisecond
	}
	if opts.NewWatcher == nil {
		opts.NewWatcher = fsnotify.NewWatcher
	}
	return &Source{opts: opts, sink: sink, cache: make(map[string]cachedResult)}
}

// Start reads the directory, then watches it until ctx ends. When no
// watcher can be had (the inotify limit reached, say) or a folder cannot be
// watched, the directory is still re-read every Resync.
func (s *Source) Start(ctx context.Context) error {
	w, err := s.opts.NewWatcher()
	if err != nil {
		s.opts.Logger.Warn("cannot watch the targets directory; re-reading it every resync",
			"resync", s.opts.Resync.String(), "error", err.Error())
		w = nil
	} else {
		defer w.Close()
	}
	events, errs := watcherChans(w)
	watched := map[string]bool{}
	s.sync(w, watched)

	resync := time.NewTicker(s.opts.Resync)
	defer resync.Stop()
	debounce := time.NewTimer(0)
	<-debounce.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			s.opts.Logger.Debug("targets directory event", "path", ev.Name, "op", ev.Op.String())
			debounce.Reset(s.opts.Debounce)
		case err, ok := <-errs:
			if !ok {
				return nil
			}
			s.opts.Logger.Warn("targets directory watch error", "error", err.Error())
		case <-debounce.C:
			s.sync(w, watched)
		case <-resync.C:
			s.sync(w, watched)
		}
	}
}

// watcherChans returns w's channels, or nil ones (never ready) without w.
func watcherChans(w *fsnotify.Watcher) (chan fsnotify.Event, chan error) {
	if w == nil {
		return nil, nil
	}
	return w.Events, w.Errors
}

// sync reads the directory, hands the result to the sink, and keeps a watch
// on the directory and each target folder in it.
func (s *Source) sync(w *fsnotify.Watcher, watched map[string]bool) {
	results, dirs, err := s.Read()
	if err != nil {
		s.opts.Logger.Error("cannot read targets directory; keeping known targets", "error", err.Error())
		return
	}
	s.sink(results)
	if w == nil {
		return
	}
	dirs = append(dirs, s.opts.Dir)
	want := map[string]bool{}
	for _, d := range dirs {
		want[d] = true
		if !watched[d] {
			if err := w.Add(d); err != nil {
				s.opts.Logger.Warn("cannot watch folder; relying on periodic re-reads", "path", d, "error", err.Error())
				continue
			}
			watched[d] = true
		}
	}
	for d := range watched {
		if !want[d] {
			_ = w.Remove(d)
			delete(watched, d)
		}
	}
}

// Read reads and validates every entry of the directory once. It also
// returns the target folders found, to be watched. An unreadable directory
// is an error: the caller keeps what it had rather than forget every target.
func (s *Source) Read() (map[string]Result, []string, error) {
	entries, folders, errs, err := scan(s.opts.Dir)
	if err != nil {
		return nil, nil, err
	}
	results := make(map[string]Result, len(entries)+len(errs))
	for name, err := range errs {
		results[name] = Result{Err: err}
	}
	next := make(map[string]cachedResult, len(entries))
	for name, e := range entries {
		raw := sha256.Sum256(append(append(append([]byte(nil), e.kubeconfig...), 0), e.targetYAML...))
		// An unchanged entry that references no files parses the same: skip
		// the work. One with files is re-parsed so a rotated file counts.
		if c, ok := s.cache[name]; ok && c.raw == raw && !c.references() {
			results[name], next[name] = c.res, c
			continue
		}
		cfg, err := parse(e, s.opts.Dir, s.opts.Policy)
		res := Result{Config: cfg, Err: err}
		results[name], next[name] = res, cachedResult{raw: raw, res: res}
	}
	s.cache = next
	return results, folders, nil
}

func (c cachedResult) references() bool {
	if c.res.Config == nil {
		return false
	}
	tls := c.res.Config.REST.TLSClientConfig
	return tls.CAFile != "" || tls.CertFile != "" || tls.KeyFile != "" || c.res.Config.REST.BearerTokenFile != ""
}

// scan lists dir's entries: a file <name> or <name>.kubeconfig, or a folder
// <name>/ holding kubeconfig and optional target.yaml. Dot entries (such as
// a Secret mount's ..data) are not targets. Unreadable entries are
// returned as errors under their name.
func scan(dir string) (map[string]entry, []string, map[string]error, error) {
	entries := map[string]entry{}
	errs := map[string]error{}
	var folders []string
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read targets directory: %w", err)
	}
	for _, de := range des {
		fname := de.Name()
		if strings.HasPrefix(fname, ".") {
			continue
		}
		path := filepath.Join(dir, fname)
		info, err := os.Stat(path) // follows the symlinks of Secret mounts
		if err != nil {
			errs[fname] = fmt.Errorf("%w: %s: %v", ErrInvalidEntry, fname, unwrapPath(err))
			continue
		}
		var e entry
		if info.IsDir() {
			folders = append(folders, path)
			e, err = readFolder(fname, path)
		} else {
			e = entry{name: strings.TrimSuffix(fname, kubeconfigSuffix), dir: dir}
			e.kubeconfig, err = os.ReadFile(path)
		}
		if err != nil {
			errs[e.name] = err
			continue
		}
		if _, dup := entries[e.name]; dup || errs[e.name] != nil {
			errs[e.name] = fmt.Errorf("%w: target %q is defined twice (as %s and another entry)", ErrInvalidEntry, e.name, fname)
			delete(entries, e.name)
			continue
		}
		entries[e.name] = e
	}
	return entries, folders, errs, nil
}

func readFolder(name, path string) (entry, error) {
	e := entry{name: name, dir: path}
	var err error
	if e.kubeconfig, err = os.ReadFile(filepath.Join(path, folderKubeconfig)); err != nil {
		return e, fmt.Errorf("%w: folder %s has no readable %s: %v", ErrInvalidEntry, name, folderKubeconfig, unwrapPath(err))
	}
	e.targetYAML, err = os.ReadFile(filepath.Join(path, folderMetadata))
	if errors.Is(err, fs.ErrNotExist) {
		return e, nil
	}
	if err != nil {
		return e, fmt.Errorf("%w: folder %s: %v", ErrInvalidEntry, name, unwrapPath(err))
	}
	return e, nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
