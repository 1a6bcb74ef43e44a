package volumes

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
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
	s, base, images := imageServer(t)
	require.NoError(t, os.MkdirAll(filepath.Join(s.Path("img"), "other", "rootfs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("img"), "other", "rootfs", "f"), []byte("other"), 0o644))
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
	s, base, images := imageServer(t)
	volume(t, base, "busy")
	hook, streamedIn := streamInOnce(base, "busy", "", tarsafetest.Tar(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}))
	s.images.onWalk(hook)
	exp := time.Now().Add(time.Hour)
	code, img, body := registerPath(t, base, "img", "rootfs", "a", exp)
	require.Equal(t, http.StatusOK, code, body)
	s.images.onWalk(nil)
	assert.Equal(t, int32(http.StatusNoContent), streamedIn.Load(), "the other volume was written during the walk")
	resp, b := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "a")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the ticket pulls its image: %s", b)
	code, again, body := registerPath(t, base, "img", "rootfs", "b", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, img.Manifest, again.Manifest)
	assert.Equal(t, 1, s.images.walks, "kept: no second walk")
}

// TestAnImageMadeWhileItsVolumeIsWrittenIsMadeAgain: a stream-in into
// the volume whose image is being made voids that walk: the request
// makes the image again, of the files as the stream-in left them, and
// its ticket pulls a layer that checks against its digest.
func TestAnImageMadeWhileItsVolumeIsWrittenIsMadeAgain(t *testing.T) {
	s, base, images := imageServer(t)
	hook, streamedIn := streamInOnce(base, "img", "rootfs", tarsafetest.Tar(t, &tar.Header{Name: "new", Typeflag: tar.TypeReg, Mode: 0o644}))
	s.images.onWalk(hook)
	code, img, body := registerPath(t, base, "img", "rootfs", "a", time.Now().Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)
	s.images.onWalk(nil)
	require.Equal(t, int32(http.StatusNoContent), streamedIn.Load())
	assert.Equal(t, 2, s.images.walks, "the walk the stream-in met, and one after it")

	layer := pullLayer(t, images, "img", img.Manifest, "a")
	names := []string{}
	for _, h := range tarHeaders(t, layer) {
		names = append(names, h.Name)
	}
	assert.Contains(t, names, "new", "the image is of the files as the stream-in left them")
}

// TestFirstRequestsForAnImageShareOneWalk: requests for an image not
// made yet, at once, wait for one walk and get its image.
func TestFirstRequestsForAnImageShareOneWalk(t *testing.T) {
	s, base := start(t)
	volume(t, base, "img")
	rootfsTree(t, s.Path("img"))
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s.images.onWalk(func() { <-release })
		const n = 8
		got := make([]*image, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { got[i], errs[i] = s.image("img", s.Path("img"), "rootfs") })
		}
		synctest.Wait() // one in its walk, the others waiting for it
		close(release)
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			assert.Truef(t, got[i] == got[0], "request %d got the one image", i)
		}
		assert.Equal(t, 1, s.images.walks)
	})
}

// TestAKilledServerEndsAnImagesWalk: the walk of a rootfs, however
// large, stops once the server is killed.
func TestAKilledServerEndsAnImagesWalk(t *testing.T) {
	s, base := start(t)
	volume(t, base, "img")
	rootfsTree(t, s.Path("img"))
	require.NoError(t, s.Kill())
	_, err := s.image("img", s.Path("img"), "rootfs")
	require.ErrorIs(t, err, errStopping)
	assert.Equal(t, http.StatusServiceUnavailable, imageStatus(err))
	assert.Zero(t, s.images.walks)
}

// tarHeaders are the headers of a tar's entries.
func tarHeaders(t *testing.T, b []byte) []*tar.Header {
	t.Helper()
	var hs []*tar.Header
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs
		}
		require.NoError(t, err)
		hs = append(hs, h)
	}
}

// streamInOnce is a walked hook that streams archive into path of
// volume handle the first time it runs, and the status that answered
// it (0: not yet).
func streamInOnce(base, handle, path string, archive []byte) (func(), *atomic.Int32) {
	var status atomic.Int32
	return func() {
		if !status.CompareAndSwap(0, -1) {
			return
		}
		// In the handler's goroutine: no require here.
		req, _ := http.NewRequest(http.MethodPut, base+"/volumes/"+handle+"/stream-in?path="+path, bytes.NewReader(archive))
		req.Header.Set("Authorization", "Bearer "+testToken)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			status.Store(int32(resp.StatusCode))
			resp.Body.Close()
		}
	}, &status
}

// pullLayer pulls the layer of volume handle's image manifest with
// secret, and checks it against its digest.
func pullLayer(t *testing.T, images, handle, manifest, secret string) []byte {
	t.Helper()
	resp, mb := pull(t, images, http.MethodGet, "/v2/jetway/"+handle+"/manifests/"+manifest, secret)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", mb)
	var m struct {
		Layers []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(mb, &m))
	require.Len(t, m.Layers, 1)
	resp, layer := pull(t, images, http.MethodGet, "/v2/jetway/"+handle+"/blobs/"+m.Layers[0].Digest, secret)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", layer)
	assert.Equal(t, m.Layers[0].Digest, digestOf(layer), "the layer checks against its digest")
	return layer
}

// TestAVolumeMadeAgainHasItsOwnImage: a volume destroyed and made again
// under its handle, with other files, is served as an image of those;
// a ticket for the one before opens nothing.
func TestAVolumeMadeAgainHasItsOwnImage(t *testing.T) {
	s, base, images := imageServer(t)
	exp := time.Now().Add(time.Hour)
	code, before, body := registerPath(t, base, "img", "rootfs", "a", exp)
	require.Equal(t, http.StatusOK, code, body)

	resp, b := do(t, http.MethodDelete, base+"/volumes/img", nil, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", b)
	volume(t, base, "img")
	require.NoError(t, os.MkdirAll(filepath.Join(s.Path("img"), "rootfs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("img"), "rootfs", "f"), []byte("after"), 0o644))
	code, after, body := registerPath(t, base, "img", "rootfs", "b", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.NotEqual(t, before.Manifest, after.Manifest)
	assert.Equal(t, 2, s.images.walks)
	resp, _ = pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+before.Manifest, "a")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the ticket of the volume before")
	resp, b = pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+after.Manifest, "b")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
}

// imageServer starts a server with volume img holding rootfsTree, and
// its image API; it is the server, its volume API and its image API.
func imageServer(t *testing.T) (*Server, string, string) {
	t.Helper()
	s, base := start(t)
	volume(t, base, "img")
	rootfsTree(t, s.Path("img"))
	addr, err := s.ServeImages("127.0.0.1:0")
	require.NoError(t, err)
	return s, base, "http://" + addr.String()
}

// onWalk has f run after each walk, before its image is kept (nil: nothing).
func (im *images) onWalk(f func()) {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.walked = f
}
