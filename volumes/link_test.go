package volumes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// holderLike makes s serve as a volume holder's sidecar does: files with
// their owners, devices and FIFOs, cow volumes of hard links.
func holderLike(t *testing.T, s *Server) {
	t.Helper()
	require.Zero(t, os.Geteuid(), "a holder's sidecar runs as root: these tests give files other owners")
	s.SetLimits(tarsafe.Limits{Owners: true, Devices: true})
	s.SetLinkCopies(true)
}

// streamedOut is volume handle as its stream-out carries it: each entry
// of the tar, in order, as a line saying all it carries.
func streamedOut(t *testing.T, base, handle string) []string {
	t.Helper()
	resp, body := do(t, http.MethodPut, base+"/volumes/"+handle+"/stream-out", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var got []string
	tr := tar.NewReader(bytes.NewReader(body))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		require.NoError(t, err)
		content, err := io.ReadAll(tr)
		require.NoError(t, err)
		got = append(got, fmt.Sprintf("%s type=%c mode=%o owner=%d:%d mtime=%s link=%q dev=%d,%d content=%q",
			h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime.UTC().Format(time.RFC3339), h.Linkname, h.Devmajor, h.Devminor, content))
	}
}

// inodeAt is the inode number of what is at path (not followed).
func inodeAt(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestLinkCopyCarriesEveryEntry: a cow volume made of links streams out
// entry for entry as its parent does (types, modes with setuid, setgid
// and sticky, owners, times, links as written, empty folders, the FIFO,
// the file with two names as one file and a hard link), shares each of
// the parent's files, and says it copied no byte.
func TestLinkCopyCarriesEveryEntry(t *testing.T) {
	s, base := start(t)
	holderLike(t, s)
	made(t, base, `{"handle":"p","strategy":{"type":"empty"}}`)
	tarsafetest.WriteTree(t, s.Path("p"))

	resp, body := create(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.Equal(t, "0", resp.Header.Get(CopiedBytesHeader), "no byte copied")
	assert.Equal(t, "9", resp.Header.Get(LinkedEntriesHeader), "seven files, a file's second name, the FIFO")

	want := streamedOut(t, base, "p")
	assert.Equal(t, want, streamedOut(t, base, "c"))
	links := 0
	for _, e := range want {
		if bytes.Contains([]byte(e), []byte("type=1")) {
			links++
		}
	}
	assert.Equal(t, 1, links, "hard/b is a link to hard/a, in both, and no other file is a link: %q", want)
	for _, name := range []string{"owned", "suid", "hard/a", "hard/b", "ro/file", "fifo"} {
		assert.Equal(t, inodeAt(t, filepath.Join(s.Path("p"), name)), inodeAt(t, filepath.Join(s.Path("c"), name)), "%s is shared", name)
	}
	for _, name := range []string{".", "d700", "inside", "empty"} {
		assert.NotEqual(t, inodeAt(t, filepath.Join(s.Path("p"), name)), inodeAt(t, filepath.Join(s.Path("c"), name)), "%s is the child's own", name)
	}
	fi, err := os.Lstat(s.Path("c"))
	require.NoError(t, err)
	assert.Equal(t, fs.ModeDir|0o777, fi.Mode(), "the volume's own folder takes its parent's mode")

	// An import of the volume's path is such a copy too.
	imp, err := json.Marshal(CreateRequest{Handle: "kept", Strategy: &Strategy{Type: StrategyImport, Path: s.Path("p")}})
	require.NoError(t, err)
	resp, body = create(t, base, string(imp))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.Equal(t, "0", resp.Header.Get(CopiedBytesHeader))
	assert.Equal(t, want, streamedOut(t, base, "kept"))
}

// TestLinkCopiesStayApart: whatever a stream-in does to a cow volume of
// links (a file written over, a file's mode, owner and time changed by
// its header, a file replaced by a folder, a folder by a file, a link by
// a file), its parent streams out as before, and the files neither
// changed stay shared; and the same done to the parent leaves the child
// as it was. A server writing a file in place, or changing the
// attributes of a file another volume shares, fails it.
func TestLinkCopiesStayApart(t *testing.T) {
	s, base := start(t)
	holderLike(t, s)
	made(t, base, `{"handle":"p","strategy":{"type":"empty"}}`)
	tarsafetest.WriteTree(t, s.Path("p"))
	made(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"}}`)

	later := tarsafetest.When.Add(24 * time.Hour)
	changes := func(who string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		file := func(name string, mode int64, uid int, content string) {
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Uid: uid, Gid: uid,
				ModTime: later, Size: int64(len(content))}))
			_, err := tw.Write([]byte(content))
			require.NoError(t, err)
		}
		file("owned", 0o644, 1000, "written over by "+who)                                                                 // new content, same attributes
		file("suid", 0o700, 2000, "content of suid")                                                                       // same content, new mode, owner, time
		file("hard/a", 0o640, 0, "content of hard/a, by "+who)                                                             // one name of two
		file("inside", 0o644, 0, "a file where a link was")                                                                // a link replaced
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "empty", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: later})) // a folder replaced
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "sgid/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: later})) // a file replaced
		file("sgid/new", 0o644, 0, "new")
		require.NoError(t, tw.Close())
		return buf.Bytes()
	}
	for _, tc := range []struct{ changed, other string }{{"c", "p"}, {"p", "c"}} {
		t.Run("into "+tc.changed, func(t *testing.T) {
			before, changedBefore := streamedOut(t, base, tc.other), streamedOut(t, base, tc.changed)
			resp, body := streamInto(t, base, tc.changed, ".", changes(tc.changed))
			require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
			// A stream-in at a file's path makes it a folder of what it
			// holds.
			resp, body = streamInto(t, base, tc.changed, "d700/f600", archiveOf(t, "f600", 3))
			require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)

			assert.Equal(t, before, streamedOut(t, base, tc.other), "%s is as it was", tc.other)
			assert.NotEqual(t, changedBefore, streamedOut(t, base, tc.changed), "%s changed", tc.changed)
			b, err := os.ReadFile(filepath.Join(s.Path(tc.changed), "owned"))
			require.NoError(t, err)
			assert.Equal(t, "written over by "+tc.changed, string(b))
			fi, err := os.Lstat(filepath.Join(s.Path(tc.changed), "suid"))
			require.NoError(t, err)
			assert.Equal(t, fs.FileMode(0o700), fi.Mode())
			assert.EqualValues(t, 2000, fi.Sys().(*syscall.Stat_t).Uid)
			for _, name := range []string{"ro/file", "fifo", "sgid"} {
				p, c := filepath.Join(s.Path(tc.other), name), filepath.Join(s.Path(tc.changed), name)
				if name == "sgid" {
					assert.NotEqual(t, inodeAt(t, p), inodeAt(t, c), "%s was replaced", name)
					continue
				}
				assert.Equal(t, inodeAt(t, p), inodeAt(t, c), "%s, unchanged, is still shared", name)
			}
		})
	}
}

// TestLinkCopyCopiesWhatItCannotLink: a parent on another filesystem
// (a step's volume linking a tmpfs folder) cannot be linked: each file is
// copied, with its attributes, a file's two names stay one file, and the
// answer says the bytes copied; a file with too many links is copied
// alone. Without Devices a FIFO is refused, naming it, as a stream of it
// would be; without Owners every file is copied, as the extractor would
// write it.
func TestLinkCopyCopiesWhatItCannotLink(t *testing.T) {
	s, base := start(t)
	holderLike(t, s)

	t.Run("another filesystem", func(t *testing.T) {
		shm, err := os.MkdirTemp("/dev/shm", "jetway-link-test-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(shm) })
		var a, b unix.Statfs_t
		require.NoError(t, unix.Statfs(shm, &a))
		require.NoError(t, unix.Statfs(s.root, &b))
		require.NotEqual(t, a.Fsid, b.Fsid, "/dev/shm is another filesystem than the test's folder")
		tarsafetest.WriteTree(t, shm)
		require.NoError(t, os.MkdirAll(filepath.Dir(s.Path("elsewhere")), 0o755))
		require.NoError(t, os.Symlink(shm, s.Path("elsewhere")))

		resp, body := create(t, base, `{"handle":"copied","strategy":{"type":"cow","volume":"elsewhere"}}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
		var size int64
		for _, name := range []string{"d700/f600", "owned", "suid", "sgid", "suid-1000", "hard/a", "ro/file"} {
			size += int64(len("content of " + name))
		}
		assert.Equal(t, strconv.FormatInt(size, 10), resp.Header.Get(CopiedBytesHeader))
		assert.Equal(t, "0", resp.Header.Get(LinkedEntriesHeader))
		assert.Equal(t, streamedOut(t, base, "elsewhere"), streamedOut(t, base, "copied"))
		assert.Equal(t, inodeAt(t, filepath.Join(s.Path("copied"), "hard", "a")), inodeAt(t, filepath.Join(s.Path("copied"), "hard", "b")))
	})

	t.Run("too many links", func(t *testing.T) {
		made(t, base, `{"handle":"p","strategy":{"type":"empty"}}`)
		tarsafetest.WriteTree(t, s.Path("p"))
		defer func(l func(int, string, int, string, int) error) { linkat = l }(linkat)
		linkat = func(olddirfd int, oldpath string, newdirfd int, newpath string, flags int) error {
			if oldpath == "owned" {
				return syscall.EMLINK
			}
			return unix.Linkat(olddirfd, oldpath, newdirfd, newpath, flags)
		}
		resp, body := create(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"}}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
		assert.Equal(t, strconv.Itoa(len("content of owned")), resp.Header.Get(CopiedBytesHeader))
		assert.Equal(t, "8", resp.Header.Get(LinkedEntriesHeader), "all but owned")
		assert.Equal(t, streamedOut(t, base, "p"), streamedOut(t, base, "c"))
		assert.NotEqual(t, inodeAt(t, filepath.Join(s.Path("p"), "owned")), inodeAt(t, filepath.Join(s.Path("c"), "owned")))
	})

	t.Run("without devices", func(t *testing.T) {
		s.SetLimits(tarsafe.Limits{Owners: true})
		defer s.SetLimits(tarsafe.Limits{Owners: true, Devices: true})
		resp, body := create(t, base, `{"handle":"refused","strategy":{"type":"cow","volume":"p"}}`)
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", body)
		assert.Contains(t, string(body), `copy volume \"p\": tar entry \"fifo\": a FIFO, and this folder takes no devices or FIFOs`)
		assert.False(t, s.exists("refused"))
		leftovers, _ := filepath.Glob(filepath.Join(s.root, "volumes", ".*"))
		assert.Empty(t, leftovers)
	})

	t.Run("without owners", func(t *testing.T) {
		s.SetLimits(tarsafe.Limits{Devices: true})
		defer s.SetLimits(tarsafe.Limits{Owners: true, Devices: true})
		resp, body := create(t, base, `{"handle":"mine","strategy":{"type":"cow","volume":"p"}}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
		assert.Equal(t, "0", resp.Header.Get(LinkedEntriesHeader))
		fi, err := os.Lstat(filepath.Join(s.Path("mine"), "owned"))
		require.NoError(t, err)
		assert.EqualValues(t, 0, fi.Sys().(*syscall.Stat_t).Uid, "the extractor's")
		fi, err = os.Lstat(filepath.Join(s.Path("mine"), "suid"))
		require.NoError(t, err)
		assert.Equal(t, fs.FileMode(0o755), fi.Mode(), "without setuid")
	})
}

// TestLinkCopyTakesNoSpaceTwice: a cow volume of links is charged its
// folders and names, not its parent's 8 MiB; destroying the parent
// while the child links its files frees none of them, as the disk keeps
// them; destroying the child then frees them. Volumes sharing files
// destroyed at once, and a server restarted over them, keep the account
// with the disk.
func TestLinkCopyTakesNoSpaceTwice(t *testing.T) {
	const mib = 1 << 20
	s, base := startWith(t, t.TempDir(), 64*mib)
	holderLike(t, s)
	empty := s.space.usedBytes()
	volume(t, base, "p")
	resp, body := streamInto(t, base, "p", ".", archiveOf(t, "a", 4*mib, "d/b", 3*mib, "d/e/c", mib))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	parent := s.space.usedBytes()
	require.Greater(t, parent-empty, int64(8*mib))

	made(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"}}`)
	assert.Less(t, s.space.usedBytes()-parent, int64(64<<10), "the child's folders and names")
	accountHolds(t, s, 64<<10)

	resp, _ = do(t, http.MethodDelete, base+"/volumes/p", nil, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Greater(t, s.space.usedBytes()-empty, int64(8*mib), "the files stay, linked by the child")
	accountHolds(t, s, 64<<10)
	resp, _ = do(t, http.MethodDelete, base+"/volumes/c", nil, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, empty, s.space.usedBytes(), "the last link gone, so are the files")

	// Many volumes sharing files, and files of their own, destroyed at
	// once.
	volume(t, base, "p")
	resp, body = streamInto(t, base, "p", ".", archiveOf(t, "a", 4*mib, "d/b", 4*mib))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	handles := []string{"p"}
	for i := range 4 {
		h := fmt.Sprintf("c%d", i)
		made(t, base, `{"handle":"`+h+`","strategy":{"type":"cow","volume":"p"}}`)
		resp, body = streamInto(t, base, h, "d", archiveOf(t, "own", mib))
		require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
		handles = append(handles, h)
	}
	// A stream-in replacing a shared file frees none of it.
	resp, body = streamInto(t, base, "c0", ".", archiveOf(t, "a", 1))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	accountHolds(t, s, 64<<10)

	// A server started over them counts each file once, and gives each
	// back once, when volumes sharing files are destroyed at once.
	require.NoError(t, s.Kill())
	s, base = startWith(t, s.root, 64*mib)
	accountHolds(t, s, 0)
	var wg sync.WaitGroup
	for _, h := range handles {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodDelete, base+"/volumes/"+h, nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			if resp, err := http.DefaultClient.Do(req); assert.NoError(t, err) {
				resp.Body.Close()
				assert.Equal(t, http.StatusNoContent, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, onDisk(t, s.root), s.space.usedBytes(), "everything given back, each file once")
}

// BenchmarkCopyVolume makes a cow volume of a parent of 2,000 files, 64
// MiB in 40 folders, as a full copy (tar through the extractor, as
// before SetLinkCopies) and of hard links, alternately in one loop, and
// reports the time ratio.
func BenchmarkCopyVolume(b *testing.B) {
	sum := sha256.Sum256([]byte(testToken))
	s, err := Start(b.TempDir(), hex.EncodeToString(sum[:]))
	require.NoError(b, err)
	defer s.Kill()
	s.SetLimits(tarsafe.Limits{Owners: os.Geteuid() == 0})
	parent := filepath.Join(b.TempDir(), "parent")
	content := bytes.Repeat([]byte("0123456789abcdef"), 2<<10) // 32 KiB
	for i := range 2000 {
		dir := filepath.Join(parent, fmt.Sprintf("d%02d", i%40))
		require.NoError(b, os.MkdirAll(dir, 0o755))
		require.NoError(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), content, 0o644))
	}
	run := func(make func(to string) error) time.Duration {
		to, err := os.MkdirTemp(filepath.Join(s.root), "copy-")
		require.NoError(b, err)
		start := time.Now()
		require.NoError(b, make(to))
		took := time.Since(start)
		require.NoError(b, os.RemoveAll(to))
		return took
	}
	full := func(to string) error { _, err := s.copyTree(b.Context(), parent, to, nil); return err }
	links := func(to string) error { _, err := s.linkTree(b.Context(), parent, to, nil); return err }
	var copying, linking time.Duration
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			copying += run(full)
			linking += run(links)
		} else {
			linking += run(links)
			copying += run(full)
		}
	}
	b.ReportMetric(float64(copying)/float64(b.N)/1e6, "ms/copy")
	b.ReportMetric(float64(linking)/float64(b.N)/1e6, "ms/links")
	b.ReportMetric(float64(copying)/float64(linking), "copy/links")
}

// TestSettlingALinkCopyFreesOnlyItsOwnFiles: a cow volume of links that
// a pod held and then settled loses its old files: those it shared with
// its parent stay on the disk and in the account, its own file goes from
// both; once all is destroyed, the account is back where it began.
func TestSettlingALinkCopyFreesOnlyItsOwnFiles(t *testing.T) {
	const mib = 1 << 20
	s, base := startWith(t, t.TempDir(), 64*mib)
	holderLike(t, s)
	empty := s.space.usedBytes()
	volume(t, base, "p")
	resp, body := streamInto(t, base, "p", ".", archiveOf(t, "shared", 4*mib))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	made(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"}}`)
	resp, body = streamInto(t, base, "c", ".", archiveOf(t, "own", 2*mib))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	resp, body = do(t, http.MethodPut, base+"/volumes/c/held", nil, strings.NewReader(`{"pod":"p","uid":"u","mount":"m"}`))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)

	made(t, base, `{"handle":"copy","strategy":{"type":"empty"}}`)
	resp, body = streamInto(t, base, "copy", ".", archiveOf(t, "written", mib))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	resp, body = do(t, http.MethodPost, base+"/volumes/c/settle", nil, strings.NewReader(`{"from":"copy","uid":"u"}`))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	assert.Equal(t, map[string]int64{".": -1, "written": mib}, landedIn(t, s, "c"))
	accountHolds(t, s, 64<<10)

	for _, h := range []string{"p", "c"} {
		resp, _ = do(t, http.MethodDelete, base+"/volumes/"+h, nil, nil)
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
	}
	assert.Equal(t, empty, s.space.usedBytes())
}
