package client

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steps"
)

// tree writes a folder with nested dirs, an empty dir, an executable, a
// link and a 1 MiB file.
func tree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "empty"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a", "b", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a", "note"), []byte("note"), 0o600))
	require.NoError(t, os.Symlink("b/run.sh", filepath.Join(dir, "a", "link")))
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "big"), big, 0o644))
	return dir
}

func sameTree(t *testing.T, want, got string) {
	t.Helper()
	require.NoError(t, filepath.Walk(want, func(p string, fi os.FileInfo, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(want, p)
		gi, err := os.Lstat(filepath.Join(got, rel))
		require.NoError(t, err, rel)
		assert.Equal(t, fi.Mode(), gi.Mode(), rel)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(filepath.Join(got, rel))
			assert.Equal(t, a, b, rel)
		case fi.Mode().IsRegular():
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(filepath.Join(got, rel))
			assert.True(t, bytes.Equal(a, b), rel)
		}
		return nil
	}))
}

func TestUploadAndDownloadKeepTheTree(t *testing.T) {
	st := &scripted{view: steps.View{Handle: "s"}, dir: t.TempDir()}
	c := serve(t, st, nil)
	src := tree(t)
	got, err := c.UploadInput(context.Background(), "", "s", "src", src)
	require.NoError(t, err)
	assert.Positive(t, got.Bytes)
	sameTree(t, src, filepath.Join(st.dir, "src"))

	out := filepath.Join(t.TempDir(), "out")
	n, err := c.DownloadOutput(context.Background(), "", "s", "src", out)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	sameTree(t, src, out)

	_, err = c.DownloadOutput(context.Background(), "", "s", "missing", out)
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = c.UploadInput(context.Background(), "", "s", "src", filepath.Join(src, "nope"))
	assert.ErrorContains(t, err, "nope is not a directory")
}

func TestPackNamesWhatItCannotCarry(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644))
	r := packDir(dir)
	defer r.Close()
	_, err := io.ReadAll(r)
	assert.ErrorContains(t, err, filepath.Join(dir, "pipe")+": a named pipe cannot be uploaded")
}

func TestPackStopsWhenClosed(t *testing.T) {
	r := packDir(tree(t))
	buf := make([]byte, 10)
	_, err := r.Read(buf)
	require.NoError(t, err)
	require.NoError(t, r.Close()) // goleak in TestMain: the packer ended
}

// hostile builds a gzip-compressed tar of hdrs, each file holding "x".
func hostile(t *testing.T, hdrs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		require.NoError(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write([]byte("x"))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	return &buf
}

func TestUnpackRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	for name, hdrs := range map[string][]*tar.Header{
		`"../x" would land outside`:   {{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644}},
		`"/abs" would land outside`:   {{Name: "/abs", Typeflag: tar.TypeReg, Mode: 0o644}},
		`links to "../../etc"`:        {{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}},
		`links to "` + outside + `"`:  {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}},
		`is a symbolic link`:          {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "l/f", Typeflag: tar.TypeReg, Mode: 0o644}},
		`is not a file, a directory`:  {{Name: "dev", Typeflag: tar.TypeChar}},
		`"h": type '1' is not a file`: {{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := unpack(hostile(t, hdrs...), t.TempDir())
			assert.ErrorContains(t, err, name)
			entries, _ := os.ReadDir(outside)
			assert.Empty(t, entries)
		})
	}
	// A link in the archive replaced by a file of the same name: the file
	// is written in dir, not through the link.
	dir := t.TempDir()
	target := filepath.Join(dir, "kept")
	require.NoError(t, os.WriteFile(target, []byte("keep"), 0o644))
	_, err := unpack(hostile(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "kept"},
		&tar.Header{Name: "l", Typeflag: tar.TypeReg, Mode: 0o644}), dir)
	require.NoError(t, err)
	b, _ := os.ReadFile(target)
	assert.Equal(t, "keep", string(b))
}
