package tarsafe

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriterRemembersAtMostMaxLinkedFiles: files with more links (here,
// each linked from outside the tree, as a cow volume's are) are written
// whole the first time and as links after; past maxLinked remembered
// files, a file with more links is written whole each time, so the
// archive stays right and the Writer's memory bounded.
func TestWriterRemembersAtMostMaxLinkedFiles(t *testing.T) {
	defer func(n int) { maxLinked = n }(maxLinked)
	maxLinked = 2
	tree, outside := t.TempDir(), t.TempDir()
	for _, name := range []string{"a", "b", "c"} {
		require.NoError(t, os.WriteFile(filepath.Join(tree, name), []byte(name), 0o644))
		require.NoError(t, os.Link(filepath.Join(tree, name), filepath.Join(outside, name)))
		require.NoError(t, os.Link(filepath.Join(tree, name), filepath.Join(tree, name+"2")))
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	require.NoError(t, filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == tree {
			return err
		}
		info, err := d.Info()
		if err == nil {
			err = w.Add(Host{}, p, d.Name(), info)
		}
		return err
	}))
	require.NoError(t, w.Close())
	assert.Len(t, w.first, 2)

	got := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		got[hdr.Name] = string(body)
		if hdr.Typeflag == tar.TypeLink {
			got[hdr.Name] = "-> " + hdr.Linkname
		}
	}
	assert.Equal(t, map[string]string{"a": "a", "a2": "-> a", "b": "b", "b2": "-> b", "c": "c", "c2": "c"}, got)
}

// TestWriterTakesAFileAtItsSize: a file's content is the size its Lstat
// said, read through buffers of copyBufferSize: one that grew since is
// cut there, one that shrank is an error naming it.
func TestWriterTakesAFileAtItsSize(t *testing.T) {
	dir := t.TempDir()
	size := int64(2*copyBufferSize + 100)
	content := bytes.Repeat([]byte("0123456789abcdef"), int(size/16)+1)[:size]
	for name, change := range map[string]int64{"grew": 4096, "shrank": -copyBufferSize} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(p, content, 0o644))
			info, err := os.Lstat(p)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(p, size+change))
			var buf bytes.Buffer
			w := NewWriter(&buf)
			err = w.Add(Host{}, p, name, info)
			if change < 0 {
				require.ErrorIs(t, err, io.ErrUnexpectedEOF)
				assert.Contains(t, err.Error(), p)
				return
			}
			require.NoError(t, err)
			require.NoError(t, w.Close())
			tr := tar.NewReader(&buf)
			hdr, err := tr.Next()
			require.NoError(t, err)
			got, err := io.ReadAll(tr)
			require.NoError(t, err)
			assert.Equal(t, size, hdr.Size)
			assert.Equal(t, content, got)
		})
	}
}
