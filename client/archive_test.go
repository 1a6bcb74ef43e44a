package client

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// archiveTree writes nested folders, an empty one, an executable, links
// and a 1 MiB file of random bytes.
func archiveTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "empty"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a", "b", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a", "note"), []byte("note"), 0o600))
	require.NoError(t, os.Symlink("b/run.sh", filepath.Join(dir, "a", "run")))
	require.NoError(t, os.Symlink("../note", filepath.Join(dir, "a", "b", "note")))
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "big"), big, 0o644))
	return dir
}

// requireSameTree checks that got holds what want holds: same names,
// modes, link targets and contents.
func requireSameTree(t *testing.T, want, got string) {
	t.Helper()
	names := func(dir string) []string {
		var all []string
		require.NoError(t, filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			rel, _ := filepath.Rel(dir, p)
			all = append(all, rel)
			return err
		}))
		return all
	}
	require.Equal(t, names(want), names(got))
	for _, rel := range names(want) {
		w, g := filepath.Join(want, rel), filepath.Join(got, rel)
		wi, err := os.Lstat(w)
		require.NoError(t, err)
		gi, err := os.Lstat(g)
		require.NoError(t, err)
		require.Equal(t, wi.Mode(), gi.Mode(), rel)
		switch {
		case wi.Mode()&fs.ModeSymlink != 0:
			wl, _ := os.Readlink(w)
			gl, _ := os.Readlink(g)
			require.Equal(t, wl, gl, rel)
		case wi.Mode().IsRegular():
			wb, _ := os.ReadFile(w)
			gb, _ := os.ReadFile(g)
			require.True(t, bytes.Equal(wb, gb), rel)
		}
	}
}

func TestTarDirUntarRoundTrip(t *testing.T) {
	src := archiveTree(t)
	out := filepath.Join(t.TempDir(), "new", "out")
	r := TarDir(src)
	n, err := Untar(r, out)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	assert.Equal(t, 3, n)
	requireSameTree(t, src, out)
}

func TestTarDirHeaders(t *testing.T) {
	src := archiveTree(t)
	when := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	require.NoError(t, os.Chtimes(filepath.Join(src, "a", "note"), when, when))
	// A dir given as a link is the folder it points to.
	link := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.Symlink(src, link))

	r := TarDir(link)
	defer r.Close()
	zr, err := gzip.NewReader(r)
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	var names []string
	headers := map[string]*tar.Header{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, hdr.Name)
		headers[hdr.Name] = hdr
	}
	assert.Equal(t, []string{"a/", "a/b/", "a/b/note", "a/b/run.sh", "a/note", "a/run", "big", "empty/"}, names)
	assert.Equal(t, "../note", headers["a/b/note"].Linkname)
	assert.Equal(t, int64(0o755), headers["a/b/run.sh"].Mode)
	assert.Equal(t, int64(0o700), headers["empty/"].Mode)
	assert.True(t, when.Equal(headers["a/note"].ModTime), headers["a/note"].ModTime)
}

func TestTarDirNamesWhatItCannotRead(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	r := TarDir(missing)
	_, err := io.ReadAll(r)
	assert.ErrorContains(t, err, missing)
	require.NoError(t, r.Close())
}

// TestTarDirCarriesAFIFOThatUntarRefuses: a FIFO is written as one (the
// writer carries what is there); a user's Untar refuses it, naming it.
func TestTarDirCarriesAFIFOThatUntarRefuses(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644))
	r := TarDir(dir)
	defer r.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	hdr, err := tar.NewReader(zr).Next()
	require.NoError(t, err)
	assert.Equal(t, byte(tar.TypeFifo), hdr.Typeflag)
	_, err = Untar(bytes.NewReader(b), t.TempDir())
	assert.ErrorContains(t, err, `tar entry "pipe": a FIFO, and this folder takes no devices or FIFOs`)
}

func TestTarDirCloseStopsTheWriter(t *testing.T) {
	r := TarDir(archiveTree(t))
	_, err := r.Read(make([]byte, 10))
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	goleak.VerifyNone(t)
}

// TestUntarRefusesWhatLeavesTheFolder: the hostile archives every
// extractor refuses (tarsafetest), refused the same way here.
func TestUntarRefusesWhatLeavesTheFolder(t *testing.T) {
	tarsafetest.RefuseAll(t, tarsafetest.GzipTar, func(archive []byte, dir string) error {
		_, err := Untar(bytes.NewReader(archive), dir)
		return err
	})
}

// TestUntarStopsAtItsLimit: a gzip bomb stops at the byte limit, naming
// the limit and the entry.
func TestUntarStopsAtItsLimit(t *testing.T) {
	bomb := tarsafetest.Bomb(10<<10, 1<<20)
	defer bomb.Close()
	_, err := UntarLimited(bomb, t.TempDir(), Limits{Bytes: 8 << 20})
	assert.ErrorContains(t, err, `tar entry "zeros/8" goes past the limit of 8388608 bytes an archive may write`)
}

func TestUntarReplacesALinkWithoutWritingThroughIt(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep"), 0o644))
	dir := t.TempDir()
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, "l")))

	n, err := Untar(bytes.NewReader(tarsafetest.GzipTar(t, &tar.Header{Name: "l", Typeflag: tar.TypeReg, Mode: 0o644})), dir)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	b, _ := os.ReadFile(victim)
	assert.Equal(t, "keep", string(b))
	b, _ = os.ReadFile(filepath.Join(dir, "l"))
	assert.Equal(t, "x", string(b))
}

func TestUntarRefusesATruncatedStream(t *testing.T) {
	whole := tarsafetest.GzipTar(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644})
	_, err := Untar(bytes.NewReader(whole[:len(whole)-4]), t.TempDir())
	assert.ErrorContains(t, err, "unexpected EOF")
}
