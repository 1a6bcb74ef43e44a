package tarsafe_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// everything extracts all a tree may hold: owners, devices, foreign links.
var everything = tarsafe.Limits{Owners: true, Devices: true, ForeignLinks: true}

// TestArchiveCarriesEveryFileAsWritten: a tree of what a task leaves in a
// volume arrives unchanged (type, mode bits, owner, hard links, link
// targets, empty folders, times) from Writer to Extract, from GNU tar
// (a stock worker's writer) to Extract, and from Writer to GNU tar.
func TestArchiveCarriesEveryFileAsWritten(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	makeTree(t, src)
	want := snapshot(t, src)
	gnuTar := lookGNUTar(t)

	for _, tc := range []struct {
		name    string
		archive func(t *testing.T) []byte
		extract func(t *testing.T, archive []byte, dir string)
	}{
		{"writer to Extract", writerArchive, extractAll},
		{"GNU tar to Extract", func(t *testing.T) []byte {
			out, err := exec.Command(gnuTar, "--numeric-owner", "-cpf", "-", "-C", src, ".").Output()
			require.NoError(t, err)
			return out
		}, extractAll},
		{"writer to GNU tar", writerArchive, func(t *testing.T, archive []byte, dir string) {
			cmd := exec.Command(gnuTar, "--numeric-owner", "--same-owner", "-xpf", "-", "-C", dir)
			cmd.Stdin = bytes.NewReader(archive)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := t.TempDir()
			tc.extract(t, tc.archive(t), dst)
			assert.Equal(t, want, snapshot(t, dst))
		})
	}
	t.Run("hard links share an inode", func(t *testing.T) {
		dst := t.TempDir()
		extractAll(t, writerArchive(t), dst)
		a, b := lstat(t, filepath.Join(dst, "hard", "a")), lstat(t, filepath.Join(dst, "hard", "b"))
		assert.Equal(t, a.Ino, b.Ino)
		assert.Equal(t, uint64(2), uint64(a.Nlink))
	})

	t.Run("a FIFO is refused without Devices, naming it", func(t *testing.T) {
		lim := everything
		lim.Devices = false
		_, err := tarsafe.Extract(bytes.NewReader(writerArchive(t)), t.TempDir(), lim)
		assert.EqualError(t, err, `tar entry "fifo": a FIFO, and this folder takes no devices or FIFOs`)
	})

	t.Run("without Owners everything is the extractor's, without setuid or setgid", func(t *testing.T) {
		dst := t.TempDir()
		lim := everything
		lim.Owners = false
		_, err := tarsafe.Extract(bytes.NewReader(writerArchive(t)), dst, lim)
		require.NoError(t, err)
		got := snapshot(t, dst)
		assert.Equal(t, "-rwxr-xr-x 0:0", got["suid"].modeOwner())
		assert.Equal(t, "-rwxr-xr-x 0:0", got["sgid"].modeOwner())
		assert.Equal(t, "-rw-r--r-- 0:0", got["owned"].modeOwner())
		assert.Equal(t, "dtrwxrwxrwx 0:0", got["sticky"].modeOwner(), "sticky kept")
	})
}

// TestExtractCountsHardLinksAsEntriesOfNoBytes: a hard link counts
// against the entry limit, adds no bytes, is reserved (with no size),
// and replaces what was at its name without
// writing through it.
func TestExtractCountsHardLinksAsEntriesOfNoBytes(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep"), 0o644))
	archive := func() *bytes.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}))
		_, err := tw.Write([]byte("x"))
		require.NoError(t, err)
		for _, name := range []string{"h1", "h2", "h3"} {
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: "x", Size: 0}))
		}
		require.NoError(t, tw.Close())
		return bytes.NewReader(buf.Bytes())
	}
	t.Run("within the limits", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Symlink(victim, filepath.Join(dir, "h2")))
		var reserved []int64
		done, err := tarsafe.Extract(archive(), dir, tarsafe.Limits{Bytes: 1, Entries: 4, Reserve: func(h *tar.Header) error {
			reserved = append(reserved, h.Size)
			return nil
		}})
		require.NoError(t, err)
		assert.Equal(t, tarsafe.Extracted{Files: 4, Entries: 4, Bytes: 1}, done)
		assert.Equal(t, []int64{1, 0, 0, 0}, reserved)
		b, _ := os.ReadFile(victim)
		assert.Equal(t, "keep", string(b), "not written through the link")
		assert.Equal(t, lstat(t, filepath.Join(dir, "x")).Ino, lstat(t, filepath.Join(dir, "h2")).Ino)
	})
	t.Run("past the entries", func(t *testing.T) {
		_, err := tarsafe.Extract(archive(), t.TempDir(), tarsafe.Limits{Entries: 3})
		assert.EqualError(t, err, `tar entry "h3" goes past the limit of 3 entries an archive may write`)
	})
}

func writerArchive(t *testing.T) []byte {
	t.Helper()
	src := t.TempDir()
	makeTree(t, src)
	var buf bytes.Buffer
	w := tarsafe.NewWriter(&buf)
	root := src + "/"
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		return w.Add(tarsafe.Host{}, p, filepath.ToSlash(rel), fi)
	}))
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func extractAll(t *testing.T, archive []byte, dir string) {
	t.Helper()
	_, err := tarsafe.Extract(bytes.NewReader(archive), dir, everything)
	require.NoError(t, err)
}

// when is the time of the tree's entries.
var when = tarsafetest.When

// makeTree writes what a task may leave in a volume into dir.
func makeTree(t *testing.T, dir string) { tarsafetest.WriteTree(t, dir) }

// entry is what a test compares of a file.
type entry struct {
	Mode     fs.FileMode
	UID, GID uint32
	Mtime    time.Time
	Link     string // a symbolic link's target
	Content  string
	SameAs   string // a file with more links: the first of its names
}

func (e entry) modeOwner() string { return fmt.Sprintf("%s %d:%d", e.Mode, e.UID, e.GID) }

// snapshot is each entry of dir, by its name in it (dir itself left out).
func snapshot(t *testing.T, dir string) map[string]entry {
	t.Helper()
	got := map[string]entry{}
	first := map[uint64]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		e := entry{Mode: fi.Mode(), UID: st.Uid, GID: st.Gid, Mtime: fi.ModTime().UTC()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Link, err = os.Readlink(p)
			require.NoError(t, err)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			e.Content = string(b)
			if st.Nlink > 1 {
				if _, ok := first[st.Ino]; !ok {
					first[st.Ino] = rel
				}
				e.SameAs = first[st.Ino]
			}
		}
		got[filepath.ToSlash(rel)] = e
		return nil
	}))
	return got
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree holds files owned by uid 1000 and setuid files")
	}
}

// lookGNUTar is GNU tar, which every machine the tests run on has (a
// Debian package): its absence is a failure, not a skip.
func lookGNUTar(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tar")
	require.NoError(t, err, "GNU tar (Debian's tar package) is needed to compare with a stock worker's archives")
	out, err := exec.Command(p, "--version").Output()
	require.NoError(t, err)
	require.True(t, strings.Contains(string(out), "GNU tar"), "%s is not GNU tar: %s", p, out)
	return p
}

// TestExtractMakesNoNodeThroughALink: with Devices and ForeignLinks, a
// FIFO under a link out of the folder is refused, and nothing is made
// outside (mknod goes through a folder opened in the root).
func TestExtractMakesNoNodeThroughALink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "a", Typeflag: tar.TypeSymlink, Linkname: outside}))
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "a/p", Typeflag: tar.TypeFifo, Mode: 0o644}))
	require.NoError(t, tw.Close())
	_, err := tarsafe.Extract(&buf, dir, everything)
	assert.ErrorContains(t, err, `tar entry "a/p": `)
	entries, _ := os.ReadDir(outside)
	assert.Empty(t, entries)
}

// TestExtractNeverChangesAFileInPlace: extracting over files that have
// other links (a volume holder's cow volumes share every file with their
// parent) writes new files and links: the other names keep their
// content, mode, owner and time, whether an entry writes a file over,
// changes only its mode, owner and time, or puts a link, a folder or a
// hard link in its place. An extractor that opened an existing file to
// write, or chmod, chown or chtimes'd it, would change them.
func TestExtractNeverChangesAFileInPlace(t *testing.T) {
	needRoot(t)
	dir, other := t.TempDir(), t.TempDir()
	names := []string{"over", "attrs", "link", "folder", "hard", "target"}
	for _, name := range names {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("shared "+name), 0o644))
		require.NoError(t, os.Chtimes(filepath.Join(dir, name), when, when))
		require.NoError(t, os.Link(filepath.Join(dir, name), filepath.Join(other, name)))
	}
	// What each name is, whatever else links it.
	alone := func(dir string) map[string]entry {
		got := snapshot(t, dir)
		for name, e := range got {
			e.SameAs = ""
			got[name] = e
		}
		return got
	}
	before := alone(other)
	later := when.Add(time.Hour)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, content string) {
		h.Size, h.ModTime = int64(len(content)), later
		require.NoError(t, tw.WriteHeader(h))
		_, err := tw.Write([]byte(content))
		require.NoError(t, err)
	}
	add(&tar.Header{Name: "over", Typeflag: tar.TypeReg, Mode: 0o644}, "new content")
	add(&tar.Header{Name: "attrs", Typeflag: tar.TypeReg, Mode: 0o4700, Uid: 1000, Gid: 1000}, "shared attrs")
	add(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "over"}, "")
	add(&tar.Header{Name: "folder", Typeflag: tar.TypeDir, Mode: 0o700}, "")
	add(&tar.Header{Name: "target", Typeflag: tar.TypeReg, Mode: 0o600}, "shared target")
	add(&tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "target"}, "")
	require.NoError(t, tw.Close())
	_, err := tarsafe.Extract(&buf, dir, everything)
	require.NoError(t, err)

	assert.Equal(t, before, alone(other), "the other names are as they were")
	got := snapshot(t, dir)
	assert.Equal(t, "new content", got["over"].Content)
	assert.Equal(t, "urwx------ 1000:1000", got["attrs"].modeOwner())
	assert.Equal(t, "over", got["link"].Link)
	assert.True(t, got["folder"].Mode.IsDir())
	assert.Equal(t, lstat(t, filepath.Join(dir, "target")).Ino, lstat(t, filepath.Join(dir, "hard")).Ino)
	for _, name := range names {
		assert.EqualValues(t, 1, lstat(t, filepath.Join(other, name)).Nlink, "%s: its link in dir went", name)
	}
}
