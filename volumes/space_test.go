package volumes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testOrigin stands for where a capacity is set, in the tests' errors.
const testOrigin = "the test's capacity"

// startWith starts a server over root with a capacity of capacity bytes.
func startWith(t *testing.T, root string, capacity int64) (*Server, string) {
	t.Helper()
	sum := sha256.Sum256([]byte(testToken))
	s, err := Listen("127.0.0.1:0", root, hex.EncodeToString(sum[:]), Capacity{Bytes: capacity, Origin: testOrigin})
	require.NoError(t, err)
	t.Cleanup(func() { s.Kill() })
	return s, fmt.Sprintf("http://127.0.0.1:%d", s.Port())
}

// onDisk is what root takes on its disk as the kubelet counts an
// emptyDir.
func onDisk(t *testing.T, root string) int64 {
	t.Helper()
	n, err := DiskUsage(root)
	require.NoError(t, err)
	return n
}

// accountHolds: the server's account is never below what its root takes
// on disk (a write it let through is on disk within the account), and
// over it by no more than slack.
func accountHolds(t *testing.T, s *Server, slack int64) {
	t.Helper()
	used, disk := s.space.usedBytes(), onDisk(t, s.root)
	assert.GreaterOrEqual(t, used, disk, "the account (%d) covers the disk (%d)", used, disk)
	assert.LessOrEqual(t, used-disk, slack, "the account (%d) is near the disk (%d)", used, disk)
}

// archiveOf is a tar of regular files of the sizes given, named as given,
// in order.
func archiveOf(t *testing.T, files ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		name, size := files[i].(string), files[i+1].(int)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(size)}))
		_, err := tw.Write(bytes.Repeat([]byte{'x'}, size))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func streamInto(t *testing.T, base, handle, path string, archive []byte) (*http.Response, []byte) {
	t.Helper()
	return do(t, http.MethodPut, base+"/volumes/"+handle+"/stream-in?path="+path, nil, bytes.NewReader(archive))
}

// landedIn lists what volume handle holds, by path, with each file's
// contents' length: what a refused write must leave as it was.
func landedIn(t *testing.T, s *Server, handle string) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	require.NoError(t, filepath.WalkDir(s.Path(handle), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.Path(handle), p)
		got[rel] = info.Size()
		if d.IsDir() {
			got[rel] = -1
		}
		return nil
	}))
	return got
}

// TestStreamInPastTheCapacityIsRefused: a stream-in that would take the
// volumes past their capacity is refused at the header of the first file
// that does not fit, with a 507 naming the capacity and where it is set;
// the volume is as it was, the account as before, and the disk below the
// capacity. A stream-in that fits lands.
func TestStreamInPastTheCapacityIsRefused(t *testing.T) {
	s, base := startWith(t, t.TempDir(), 16<<20)
	volume(t, base, "v")
	resp, body := streamInto(t, base, "v", "kept", archiveOf(t, "f", 1<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	before, used := landedIn(t, s, "v"), s.space.usedBytes()

	resp, body = streamInto(t, base, "v", "in", archiveOf(t, "a", 4<<20, "big", 12<<20, "after", 1))
	assert.Equal(t, http.StatusInsufficientStorage, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), `stream-in: tar entry \"big\": no room for 12.0 MiB more`)
	assert.Contains(t, string(body), "their capacity of 16.0 MiB (16777216 bytes), 1.0 MiB of which stays free")
	assert.Contains(t, string(body), "the capacity is "+testOrigin)
	assert.Equal(t, before, landedIn(t, s, "v"), "the volume is as it was")
	assert.Equal(t, used, s.space.usedBytes(), "what it took is given back")
	assert.Less(t, onDisk(t, s.root), int64(16<<20))

	resp, body = streamInto(t, base, "v", "in", archiveOf(t, "a", 4<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	accountHolds(t, s, 64<<10)
}

// TestCopyPastTheCapacityIsRefused: a cow copy that would take the
// volumes past their capacity stops at the file that does not fit, with
// a 507 naming the capacity; no volume is made, nothing is left behind,
// and the account is as before.
func TestCopyPastTheCapacityIsRefused(t *testing.T) {
	s, base := startWith(t, t.TempDir(), 16<<20)
	volume(t, base, "src")
	resp, body := streamInto(t, base, "src", ".", archiveOf(t, "a", 2<<20, "b", 7<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	used := s.space.usedBytes()

	resp, body = create(t, base, `{"handle":"copy","strategy":{"type":"cow","volume":"src"}}`)
	assert.Equal(t, http.StatusInsufficientStorage, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), `copy volume \"src\": tar entry \"b\": no room for 7.0 MiB more`)
	assert.Contains(t, string(body), "capacity of 16.0 MiB (16777216 bytes)")
	resp, _ = do(t, http.MethodGet, base+"/volumes/copy", nil, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "no volume made")
	leftovers, _ := filepath.Glob(filepath.Join(s.root, "volumes", ".*"))
	assert.Empty(t, leftovers)
	assert.Equal(t, used, s.space.usedBytes())
	accountHolds(t, s, 64<<10)
}

// TestDestroyGivesBackWhatAVolumeTook: once a volume is destroyed, what
// it took fits again; a volume replaced file by file takes what its files
// take, not what was ever written into it.
func TestDestroyGivesBackWhatAVolumeTook(t *testing.T) {
	s, base := startWith(t, t.TempDir(), 16<<20)
	empty := s.space.usedBytes()
	volume(t, base, "a")
	for range 5 {
		resp, body := streamInto(t, base, "a", ".", archiveOf(t, "dir/f", 4<<20))
		require.Equal(t, http.StatusNoContent, resp.StatusCode, "the file it replaces is given back: %s", body)
	}
	accountHolds(t, s, 64<<10)
	made(t, base, `{"handle":"b","strategy":{"type":"empty"}}`)
	resp, body := streamInto(t, base, "b", ".", archiveOf(t, "f", 12<<20))
	require.Equal(t, http.StatusInsufficientStorage, resp.StatusCode, "%s", body)

	resp, _ = do(t, http.MethodDelete, base+"/volumes/a", nil, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, body = streamInto(t, base, "b", ".", archiveOf(t, "f", 12<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	made(t, base, `{"handle":"c","strategy":{"type":"empty"}}`)
	accountHolds(t, s, 64<<10)
	for _, h := range []string{"b", "c"} {
		resp, _ = do(t, http.MethodDelete, base+"/volumes/"+h, nil, nil)
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
	}
	assert.Equal(t, empty, s.space.usedBytes(), "everything given back")
}

// blockingBody is a request body that hands out b, then waits for more
// until release is closed.
type blockingBody struct {
	r       io.Reader
	release chan struct{}
}

func (b *blockingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		<-b.release
	}
	return n, err
}

// TestStreamInsShareOneCapacity: what a stream-in under way has taken
// counts for every other: while one holds 10 MiB of 15, another asking as
// much is refused; once the first is done, it is the volume's.
func TestStreamInsShareOneCapacity(t *testing.T) {
	s, base := startWith(t, t.TempDir(), 16<<20)
	volume(t, base, "a")
	volume(t, base, "b")
	archive := archiveOf(t, "f", 10<<20)
	before := s.space.usedBytes()
	// The first stream sends all but the archive's end, and waits.
	first := &blockingBody{r: bytes.NewReader(archive[:len(archive)-1024]), release: make(chan struct{})}
	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPut, base+"/volumes/a/stream-in?path=.", io.MultiReader(first, bytes.NewReader(archive[len(archive)-1024:])))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- resp
	}()
	require.Eventually(t, func() bool { return s.space.usedBytes() >= before+10<<20 }, 10*time.Second, 5*time.Millisecond,
		"the first stream took its file's room")
	resp, body := streamInto(t, base, "b", ".", archive)
	assert.Equal(t, http.StatusInsufficientStorage, resp.StatusCode, "%s", body)
	close(first.release)
	resp = <-done
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	accountHolds(t, s, 64<<10)

	// Many at once: as many land as fit, and the account holds.
	for _, h := range []string{"c", "d", "e", "f"} {
		volume(t, base, h)
	}
	resp, _ = do(t, http.MethodDelete, base+"/volumes/a", nil, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	var wg sync.WaitGroup
	codes := make(chan int, 4)
	for _, h := range []string{"c", "d", "e", "f"} {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPut, base+"/volumes/"+h+"/stream-in?path=.", bytes.NewReader(archiveOf(t, "f", 6<<20)))
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				codes <- resp.StatusCode
			}
		})
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	assert.Equal(t, map[int]int{http.StatusNoContent: 2, http.StatusInsufficientStorage: 2}, count, "two of 6 MiB fit in 15")
	accountHolds(t, s, 64<<10)
}

// TestTheCapacityCountsWhatIsThere: a server started over volumes counts
// them, as the disk does; folders an archive leaves out are charged as
// extraction makes them.
func TestTheCapacityCountsWhatIsThere(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "volumes", "old", "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "volumes", "old", "d", "f"), make([]byte, 4<<20), 0o644))
	s, base := startWith(t, root, 8<<20)
	accountHolds(t, s, 0)
	resp, body := streamInto(t, base, "old", "more", archiveOf(t, "f", 4<<20))
	assert.Equal(t, http.StatusInsufficientStorage, resp.StatusCode, "%s", body)

	volume(t, base, "v")
	// 1,000 folders of one empty file each, none named in the archive:
	// 4 MiB of folders, past the 3 MiB left; 400 fit.
	var names []any
	for i := range 1000 {
		names = append(names, fmt.Sprintf("d%04d/f", i), 0)
	}
	resp, body = streamInto(t, base, "v", ".", archiveOf(t, names...))
	assert.Equal(t, http.StatusInsufficientStorage, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "no room for")
	resp, body = streamInto(t, base, "v", ".", archiveOf(t, names[:800]...))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	accountHolds(t, s, 256<<10)
}

// TestWithoutACapacityNothingIsCounted: a server without a capacity (a
// step pod's sidecar) takes any archive and keeps no account.
func TestWithoutACapacityNothingIsCounted(t *testing.T) {
	s, base := start(t)
	volume(t, base, "v")
	resp, body := streamInto(t, base, "v", ".", archiveOf(t, "f", 4<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	assert.Nil(t, s.space)
	assert.Zero(t, s.space.usedBytes())
}

func TestMarginOf(t *testing.T) {
	for capacity, want := range map[int64]int64{
		10 << 30: 160 << 20, // 1/64
		16 << 20: 1 << 20,   // at least 1 MiB
		1 << 20:  512 << 10, // at most half
	} {
		assert.Equal(t, want, marginOf(capacity), "%d", capacity)
	}
	assert.Equal(t, int64(2*(4096+24)), newFolders("a/b", "a/c/d", 4096), "c and d")
	assert.Zero(t, newFolders("a/b/c", "a/b", 4096))
	assert.Equal(t, int64(4096+24), newFolders(".", "x", 4096))
	assert.True(t, strings.HasPrefix(sizeText(1536), "1.5 KiB"))
}

// BenchmarkStreamInCapacity extracts one archive of 32 MiB (512 files of
// 64 KiB in 16 folders) through a server with a capacity and one
// without, alternately within one loop so the machine's drift hits both
// alike, and reports the time ratio: the price of the account, once per
// entry, never per write.
func BenchmarkStreamInCapacity(b *testing.B) {
	sum := sha256.Sum256([]byte(testToken))
	counted, err := Listen("127.0.0.1:0", b.TempDir(), hex.EncodeToString(sum[:]), Capacity{Bytes: 1 << 40})
	require.NoError(b, err)
	defer counted.Kill()
	plain, err := Start(b.TempDir(), hex.EncodeToString(sum[:]))
	require.NoError(b, err)
	defer plain.Kill()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := bytes.Repeat([]byte("0123456789abcdef"), 4<<10)
	for i := range 512 {
		require.NoError(b, tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%02d/f%03d", i%16, i), Typeflag: tar.TypeReg,
			Mode: 0o644, Size: int64(len(content))}))
		_, err := tw.Write(content)
		require.NoError(b, err)
	}
	require.NoError(b, tw.Close())
	archive := buf.Bytes()
	send := func(s *Server) time.Duration {
		base := fmt.Sprintf("http://127.0.0.1:%d", s.Port())
		call := func(method, path string, body []byte) int {
			req, _ := http.NewRequest(method, base+path, bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := call(http.MethodPost, "/volumes", []byte(`{"handle":"v","strategy":{"type":"empty"}}`)); code != http.StatusCreated {
			b.Fatal("create:", code)
		}
		start := time.Now()
		if code := call(http.MethodPut, "/volumes/v/stream-in?path=.", archive); code != http.StatusNoContent {
			b.Fatal("stream-in:", code)
		}
		took := time.Since(start)
		if code := call(http.MethodDelete, "/volumes/v", nil); code != http.StatusNoContent {
			b.Fatal("destroy:", code)
		}
		return took
	}
	var with, without time.Duration
	b.SetBytes(int64(2 * len(archive)))
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			with += send(counted)
			without += send(plain)
		} else {
			without += send(plain)
			with += send(counted)
		}
	}
	b.ReportMetric(float64(without)/float64(with), "throughput-counted/uncounted")
}
