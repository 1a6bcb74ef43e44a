package tarsafe_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestExtractRefusesHostileArchives: each hostile archive is refused
// naming its entry, and nothing is written outside the folder.
func TestExtractRefusesHostileArchives(t *testing.T) {
	tarsafetest.RefuseAll(t, tarsafetest.Tar, func(archive []byte, dir string) error {
		_, err := tarsafe.Extract(bytes.NewReader(archive), dir, tarsafe.Limits{})
		return err
	})
}

// TestExtractWritesFilesFoldersAndLinks, with their modes, replacing a
// link at a file's name without writing through it.
func TestExtractWritesFilesFoldersAndLinks(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep"), 0o644))
	dir := t.TempDir()
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, "l")))
	archive := tarsafetest.Tar(t,
		&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o750},
		&tar.Header{Name: "bin/tool", Typeflag: tar.TypeReg, Mode: 0o755},
		&tar.Header{Name: "tool", Typeflag: tar.TypeSymlink, Linkname: "bin/tool"},
		&tar.Header{Name: "l", Typeflag: tar.TypeReg, Mode: 0o600})
	done, err := tarsafe.Extract(bytes.NewReader(archive), dir, tarsafe.Limits{})
	require.NoError(t, err)
	assert.Equal(t, tarsafe.Extracted{Files: 2, Entries: 4, Bytes: 2}, done)
	b, _ := os.ReadFile(victim)
	assert.Equal(t, "keep", string(b), "not written through the link")
	fi, err := os.Lstat(filepath.Join(dir, "l"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode())
	fi, err = os.Stat(filepath.Join(dir, "bin", "tool"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), fi.Mode(), "not narrowed by the umask")
	target, err := os.Readlink(filepath.Join(dir, "tool"))
	require.NoError(t, err)
	assert.Equal(t, "bin/tool", target)
}

// TestExtractStopsAtItsLimits: a gzip bomb (10 GiB of zeros in 1 MiB
// files, a few MiB compressed) stops at the byte limit, an archive of
// many entries at the entry limit, a file larger than the limit at its
// header, each naming the limit and the entry.
func TestExtractStopsAtItsLimits(t *testing.T) {
	t.Run("bytes", func(t *testing.T) {
		bomb := tarsafetest.Bomb(10<<10, 1<<20)
		defer bomb.Close()
		zr, err := gzip.NewReader(bomb)
		require.NoError(t, err)
		dir := t.TempDir()
		done, err := tarsafe.Extract(zr, dir, tarsafe.Limits{Bytes: 64 << 20})
		var limit *tarsafe.LimitError
		require.ErrorAs(t, err, &limit)
		assert.Equal(t, tarsafe.LimitError{Limit: "bytes", Max: 64 << 20, Entry: "zeros/64"}, *limit)
		assert.EqualError(t, err, `tar entry "zeros/64" goes past the limit of 67108864 bytes an archive may write`)
		assert.Equal(t, int64(64<<20), done.Bytes)
	})
	t.Run("one file past the limit", func(t *testing.T) {
		bomb := tarsafetest.Bomb(1, 10<<30)
		defer bomb.Close()
		zr, err := gzip.NewReader(bomb)
		require.NoError(t, err)
		dir := t.TempDir()
		done, err := tarsafe.Extract(zr, dir, tarsafe.Limits{Bytes: 1 << 30})
		var limit *tarsafe.LimitError
		require.ErrorAs(t, err, &limit)
		assert.Equal(t, "zeros/0", limit.Entry)
		assert.Zero(t, done.Bytes, "refused at its header")
		_, err = os.Stat(filepath.Join(dir, "zeros", "0"))
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("entries", func(t *testing.T) {
		var hdrs []*tar.Header
		for i := range 1000 {
			hdrs = append(hdrs, &tar.Header{Name: "f" + string(rune('a'+i%26)) + "/" + string(rune('a'+i/26)), Typeflag: tar.TypeReg, Mode: 0o644})
		}
		_, err := tarsafe.Extract(bytes.NewReader(tarsafetest.Tar(t, hdrs...)), t.TempDir(), tarsafe.Limits{Entries: 100})
		var limit *tarsafe.LimitError
		require.ErrorAs(t, err, &limit)
		assert.Equal(t, tarsafe.LimitError{Limit: "entries", Max: 100, Entry: hdrs[100].Name}, *limit)
	})
}

// TestExtractAsksReserveBeforeEachEntry: Reserve sees each header before
// its entry is written; its error stops the archive there, wrapped with
// the entry's name, and the entry is not written.
func TestExtractAsksReserveBeforeEachEntry(t *testing.T) {
	full := errors.New("no room")
	archive := tarsafetest.Tar(t,
		&tar.Header{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "a/small", Typeflag: tar.TypeReg, Mode: 0o644},
		&tar.Header{Name: "a/big", Typeflag: tar.TypeReg, Mode: 0o644},
		&tar.Header{Name: "a/after", Typeflag: tar.TypeReg, Mode: 0o644})
	dir := t.TempDir()
	var asked []string
	done, err := tarsafe.Extract(bytes.NewReader(archive), dir, tarsafe.Limits{Reserve: func(h *tar.Header) error {
		asked = append(asked, h.Name)
		if h.Name == "a/big" {
			return full
		}
		return nil
	}})
	require.ErrorIs(t, err, full)
	assert.EqualError(t, err, `tar entry "a/big": no room`)
	assert.Equal(t, []string{"a/", "a/small", "a/big"}, asked)
	assert.Equal(t, 1, done.Files)
	assert.FileExists(t, filepath.Join(dir, "a", "small"))
	assert.NoFileExists(t, filepath.Join(dir, "a", "big"), "refused before it was written")
}
