package volumes

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// registerPath is registerImage for folder path of the volume.
func registerPath(t *testing.T, base, handle, path, secret string, expires time.Time) (int, ImageAnswer, string) {
	t.Helper()
	body, _ := json.Marshal(ImageRequest{Path: path, TicketSHA256: digestOf([]byte(secret))[len("sha256:"):], Expires: expires})
	resp, b := do(t, http.MethodPost, base+"/volumes/"+handle+"/image", nil, bytes.NewReader(body))
	var a ImageAnswer
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(b, &a))
	}
	return resp.StatusCode, a, string(b)
}

// TestAnImageRequestThatIsNoJSON: a body that is no ImageRequest is a
// 400 saying what the body must be, not an empty 200.
func TestAnImageRequestThatIsNoJSON(t *testing.T) {
	s, base := start(t)
	volume(t, base, "img")
	rootfsTree(t, s.Path("img"))
	for _, body := range []string{`{"path":`, `[]`, ``} {
		resp, b := do(t, http.MethodPost, base+"/volumes/img/image", nil, bytes.NewReader([]byte(body)))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "body %q: %s", body, b)
		assert.Contains(t, string(b), "ticket_sha256", "body %q", body)
	}
	assert.Zero(t, s.images.walks)
}

// TestTwoFoldersOfOneVolumeAreTwoImages: each folder of a volume served
// as an image keeps its own image and its tickets open theirs: asking
// for one never takes the other away.
func TestTwoFoldersOfOneVolumeAreTwoImages(t *testing.T) {
	s, base := start(t)
	volume(t, base, "img")
	rootfsTree(t, s.Path("img"))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Path("img"), "other", "rootfs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("img"), "other", "rootfs", "f"), []byte("other"), 0o644))
	addr, err := s.ServeImages("127.0.0.1:0")
	require.NoError(t, err)
	images := "http://" + addr.String()
	exp := time.Now().Add(time.Hour)

	code, first, body := registerPath(t, base, "img", "rootfs", "a", exp)
	require.Equal(t, http.StatusOK, code, body)
	code, second, body := registerPath(t, base, "img", "other/rootfs", "b", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.NotEqual(t, first.Manifest, second.Manifest)
	code, again, body := registerPath(t, base, "img", "rootfs", "c", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, first.Manifest, again.Manifest)
	assert.Equal(t, 2, s.images.walks, "each folder read once")

	for _, p := range []struct{ secret, manifest string }{{"a", first.Manifest}, {"b", second.Manifest}, {"c", first.Manifest}} {
		resp, b := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+p.manifest, p.secret)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "ticket %s: %s", p.secret, b)
	}
	resp, b := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+second.Manifest, "a")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a ticket opens its own folder's image: %s", b)
}

// TestAnImageMadeWhileAnotherVolumeIsWrittenIsKept: a stream-in into
// one volume while another's image is made (a busy holder: every step's
// outputs come in) leaves that image as it is: kept, and its ticket
// pulls it.
func TestAnImageMadeWhileAnotherVolumeIsWrittenIsKept(t *testing.T) {
	s, base := start(t)
	volume(t, base, "img")
	volume(t, base, "busy")
	rootfsTree(t, s.Path("img"))
	addr, err := s.ServeImages("127.0.0.1:0")
	require.NoError(t, err)
	images := "http://" + addr.String()
	var streamedIn atomic.Int32
	in := tarsafetest.Tar(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644})
	s.images.walked = func() {
		// In the handler's goroutine: no require here.
		req, _ := http.NewRequest(http.MethodPut, base+"/volumes/busy/stream-in", bytes.NewReader(in))
		req.Header.Set("Authorization", "Bearer "+testToken)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			streamedIn.Store(int32(resp.StatusCode))
			resp.Body.Close()
		}
	}
	exp := time.Now().Add(time.Hour)
	code, img, body := registerPath(t, base, "img", "rootfs", "a", exp)
	require.Equal(t, http.StatusOK, code, body)
	s.images.walked = nil
	assert.Equal(t, int32(http.StatusNoContent), streamedIn.Load(), "the other volume was written during the walk")
	resp, b := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "a")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the ticket pulls its image: %s", b)
	code, again, body := registerPath(t, base, "img", "rootfs", "b", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, img.Manifest, again.Manifest)
	assert.Equal(t, 1, s.images.walks, "kept: no second walk")
}
