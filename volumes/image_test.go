package volumes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// registerImage asks s (at base) to serve handle's rootfs as an image to
// secret until expires, and is its answer's status and body.
func registerImage(t *testing.T, base, handle, secret string, expires time.Time) (int, ImageAnswer, string) {
	t.Helper()
	sum := sha256.Sum256([]byte(secret))
	body, _ := json.Marshal(ImageRequest{Path: "rootfs", TicketSHA256: hex.EncodeToString(sum[:]), Expires: expires})
	resp, b := do(t, http.MethodPost, base+"/volumes/"+handle+"/image", nil, bytes.NewReader(body))
	var a ImageAnswer
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(b, &a))
	}
	return resp.StatusCode, a, string(b)
}

// pull GETs (or HEADs) path of the image API with secret ("": none).
func pull(t *testing.T, images, method, path, secret string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, images+path, nil)
	require.NoError(t, err)
	if secret != "" {
		req.SetBasicAuth("jetway", secret)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// rootfsTree writes a rootfs as real images have it under dir: a root-only
// file, a file of another owner, a setuid program, a symlink, a hard
// link, an empty folder and a FIFO, and metadata.json beside it.
func rootfsTree(t *testing.T, dir string) {
	t.Helper()
	r := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "etc", "empty", "home"} {
		require.NoError(t, os.MkdirAll(filepath.Join(r, d), 0o755))
	}
	write := func(name, content string, mode os.FileMode) {
		require.NoError(t, os.WriteFile(filepath.Join(r, name), []byte(content), mode))
		require.NoError(t, os.Chmod(filepath.Join(r, name), mode))
	}
	write("bin/hello", "#!/bin/sh\necho hello\n", 0o755)
	write("bin/su", "setuid\n", 0o755)
	write("etc/shadow", "root:*:\n", 0o600)
	write("home/theirs", "theirs\n", 0o644)
	require.NoError(t, os.Lchown(filepath.Join(r, "home/theirs"), 1234, 1234))
	require.NoError(t, syscall.Chmod(filepath.Join(r, "bin/su"), 0o4755))
	require.NoError(t, os.Symlink("/bin/hello", filepath.Join(r, "bin/greet")))
	require.NoError(t, os.Link(filepath.Join(r, "bin/hello"), filepath.Join(r, "bin/hello-again")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(r, "fifo"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "metadata.json"), []byte(`{"env":["GREETING=hi","PATH=/bin"],"user":"1234"}`), 0o644))
}

// TestAVolumesRootfsIsAnImage: a volume's rootfs is served as a one-layer
// OCI image, by digest, to a pull with its ticket alone: the manifest,
// config (metadata.json's env) and layer check against their
// digests, and the layer holds every file as on disk (owners, modes,
// setuid, a symlink, a hard link as a link, a FIFO). The digest is made
// once while the volume stays as it is; a stream-in into it makes a new
// image and voids its tickets. Without a ticket, with a wrong, expired or
// another volume's one, the pull gets 401.
func TestAVolumesRootfsIsAnImage(t *testing.T) {
	s, base := start(t)
	volume(t, base, "img")
	volume(t, base, "other")
	rootfsTree(t, s.Path("img"))
	rootfsTree(t, s.Path("other"))
	addr, err := s.ServeImages("127.0.0.1:0")
	require.NoError(t, err)
	images := "http://" + addr.String()
	now := time.Now()
	s.now = func() time.Time { return now }

	code, img, body := registerImage(t, base, "img", "secret-1", now.Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)
	assert.True(t, strings.HasPrefix(img.Manifest, "sha256:"), img.Manifest)

	// The manifest, by digest, with the ticket.
	resp, _ := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, `Basic realm="jetway images"`, resp.Header.Get("WWW-Authenticate"))
	resp, b := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "secret-1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, ManifestType, resp.Header.Get("Content-Type"))
	assert.Equal(t, img.Manifest, resp.Header.Get("Docker-Content-Digest"))
	assert.Equal(t, img.Manifest, digestOf(b))
	var m struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Config        descriptor   `json:"config"`
		Layers        []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, 2, m.SchemaVersion)
	assert.Equal(t, ManifestType, m.MediaType)
	require.Len(t, m.Layers, 1)
	assert.Equal(t, LayerType, m.Layers[0].MediaType)
	head, hb := pull(t, images, http.MethodHead, "/v2/jetway/img/manifests/"+img.Manifest, "secret-1")
	assert.Equal(t, http.StatusOK, head.StatusCode)
	assert.Empty(t, hb)
	assert.Equal(t, int64(len(b)), head.ContentLength)

	// The config: metadata.json's env.
	resp, cfgb := pull(t, images, http.MethodGet, "/v2/jetway/img/blobs/"+m.Config.Digest, "secret-1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", cfgb)
	assert.Equal(t, m.Config.Digest, digestOf(cfgb))
	var cfg struct {
		OS     string `json:"os"`
		Config struct {
			Env  []string
			User string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	require.NoError(t, json.Unmarshal(cfgb, &cfg))
	assert.Equal(t, "linux", cfg.OS)
	assert.Equal(t, []string{"GREETING=hi", "PATH=/bin"}, cfg.Config.Env)
	assert.Empty(t, cfg.Config.User, "the web node runs each process as metadata.json's user: no user for the container's pid 1")
	assert.Equal(t, []string{m.Layers[0].Digest}, cfg.RootFS.DiffIDs, "uncompressed: the diff ID is the layer's digest")

	// The layer: every file as on disk.
	resp, layer := pull(t, images, http.MethodGet, "/v2/jetway/img/blobs/"+m.Layers[0].Digest, "secret-1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", layer)
	assert.Equal(t, m.Layers[0].Digest, digestOf(layer))
	assert.Equal(t, m.Layers[0].Size, int64(len(layer)))
	entries := map[string]*tar.Header{}
	for _, h := range tarHeaders(t, layer) {
		entries[h.Name] = h
	}
	require.Contains(t, entries, "etc/shadow")
	assert.Equal(t, int64(0o600), entries["etc/shadow"].Mode&0o7777)
	assert.Equal(t, 0, entries["etc/shadow"].Uid)
	assert.Equal(t, 1234, entries["home/theirs"].Uid)
	assert.Equal(t, 1234, entries["home/theirs"].Gid)
	assert.Equal(t, int64(0o4755), entries["bin/su"].Mode&0o7777, "setuid kept")
	assert.Equal(t, byte(tar.TypeSymlink), entries["bin/greet"].Typeflag)
	assert.Equal(t, "/bin/hello", entries["bin/greet"].Linkname)
	assert.Equal(t, byte(tar.TypeLink), entries["bin/hello-again"].Typeflag, "a hard link stays one")
	assert.Equal(t, "bin/hello", entries["bin/hello-again"].Linkname)
	assert.Equal(t, byte(tar.TypeFifo), entries["fifo"].Typeflag)
	assert.Equal(t, byte(tar.TypeDir), entries["empty/"].Typeflag)
	assert.NotContains(t, entries, "metadata.json", "the layer is the rootfs alone")

	// Made once: a second container's ticket gets the same image.
	code, again, body := registerImage(t, base, "img", "secret-2", now.Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, img.Manifest, again.Manifest)
	assert.Equal(t, 1, s.images.walks, "one reading pass for the digest")

	// Tickets: wrong, another volume's, expired: 401.
	code, otherImg, body := registerImage(t, base, "other", "secret-other", now.Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)
	for _, tt := range []struct{ name, path, secret string }{
		{"a wrong secret", "/v2/jetway/img/manifests/" + img.Manifest, "not-the-secret"},
		{"another volume's ticket", "/v2/jetway/img/manifests/" + img.Manifest, "secret-other"},
		{"another volume's ticket, its layer", "/v2/jetway/img/blobs/" + m.Layers[0].Digest, "secret-other"},
		{"no ticket, the API's root", "/v2/", ""},
	} {
		resp, b := pull(t, images, http.MethodGet, tt.path, tt.secret)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: %s", tt.name, b)
		assert.Contains(t, string(b), `"code":"UNAUTHORIZED"`, tt.name)
	}
	resp, _ = pull(t, images, http.MethodGet, "/v2/", "secret-1")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the API's root, with a ticket")
	resp, b = pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/latest", "secret-1")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, string(b), `"code":"MANIFEST_UNKNOWN"`, "no tags: by digest only")
	resp, b = pull(t, images, http.MethodGet, "/v2/jetway/img/blobs/"+otherImg.Manifest, "secret-1")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, string(b), `"code":"BLOB_UNKNOWN"`)
	resp, _ = pull(t, images, http.MethodGet, "/volumes", "secret-1")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the volume API is not on the image listener")
	now = now.Add(2 * time.Hour)
	resp, _ = pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "secret-1")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an expired ticket")
	code, _, body = registerImage(t, base, "img", "secret-3", now.Add(-time.Minute))
	assert.Equal(t, http.StatusBadRequest, code, body)

	// A stream-in changes the files: a new image, the old tickets void.
	code, _, body = registerImage(t, base, "img", "secret-4", now.Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)
	resp, b = do(t, http.MethodPut, base+"/volumes/img/stream-in?path=rootfs", nil, bytes.NewReader(tarsafetest.Tar(t, &tar.Header{Name: "new", Typeflag: tar.TypeReg, Mode: 0o644})))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", b)
	resp, _ = pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "secret-4")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a ticket of the files before")
	code, changed, body := registerImage(t, base, "img", "secret-5", now.Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)
	assert.NotEqual(t, img.Manifest, changed.Manifest)
	assert.Equal(t, 3, s.images.walks, "img twice, other once")
}

// TestAnImageOfWhatIsNoRootfs: a volume or folder that is not there, a
// file, a metadata.json that is no JSON: each refused, naming it.
func TestAnImageOfWhatIsNoRootfs(t *testing.T) {
	s, base := start(t)
	exp := time.Now().Add(time.Hour)
	code, _, body := registerImage(t, base, "missing", "s", exp)
	assert.Equal(t, http.StatusNotFound, code, body)
	volume(t, base, "empty")
	code, _, body = registerImage(t, base, "empty", "s", exp)
	assert.Equal(t, http.StatusNotFound, code, body)
	assert.Contains(t, body, "rootfs")
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("empty"), "rootfs"), []byte("x"), 0o644))
	code, _, body = registerImage(t, base, "empty", "s", exp)
	assert.Equal(t, http.StatusNotFound, code, body)
	assert.Contains(t, body, "rootfs is no folder")
	volume(t, base, "bad-meta")
	require.NoError(t, os.MkdirAll(filepath.Join(s.Path("bad-meta"), "rootfs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("bad-meta"), "metadata.json"), []byte("{env"), 0o644))
	code, _, body = registerImage(t, base, "bad-meta", "s", exp)
	assert.Equal(t, http.StatusUnprocessableEntity, code, body)
	assert.Contains(t, body, "metadata.json: invalid character")
	resp, b := do(t, http.MethodPost, base+"/volumes/empty/image", nil, strings.NewReader(`{"path":"rootfs","ticket_sha256":"abc"}`))
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(b), "ticket_sha256 must be a SHA-256")
}

// TestACowOfAnImagesVolumeHasItsImage: the web node makes a cow of an
// image's volume for each container; on a holder's server (link copies,
// owners kept) the cow has its parent's image without a reading pass,
// and its layer, tarred from the cow's own files, checks against that
// digest. A cow made by a server that keeps no owners makes its own.
func TestACowOfAnImagesVolumeHasItsImage(t *testing.T) {
	s, base := start(t)
	s.SetLimits(tarsafe.Limits{Owners: true})
	s.SetLinkCopies(true)
	volume(t, base, "img")
	rootfsTree(t, s.Path("img"))
	require.NoError(t, os.Remove(filepath.Join(s.Path("img"), "rootfs", "fifo")), "a holder without devices takes no FIFO")
	addr, err := s.ServeImages("127.0.0.1:0")
	require.NoError(t, err)
	exp := time.Now().Add(time.Hour)
	code, parent, body := registerImage(t, base, "img", "p", exp)
	require.Equal(t, http.StatusOK, code, body)
	resp, b := do(t, http.MethodPost, base+"/volumes", nil, strings.NewReader(`{"handle":"cow","strategy":{"type":"cow","volume":"img"}}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	code, cow, body := registerImage(t, base, "cow", "c", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, parent.Manifest, cow.Manifest)
	assert.Equal(t, 1, s.images.walks, "the cow made no pass of its own")
	images := "http://" + addr.String()
	pullLayer(t, images, "cow", cow.Manifest, "c") // the cow's own files make the digest it inherited

	s.SetLimits(tarsafe.Limits{})
	resp, b = do(t, http.MethodPost, base+"/volumes", nil, strings.NewReader(`{"handle":"cow2","strategy":{"type":"cow","volume":"img"}}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	code, _, body = registerImage(t, base, "cow2", "c2", exp)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 2, s.images.walks, "a copy without its owners is read for itself")
}

// TestAnImageIsWhatTheOCISpecSays: the manifest and config decode,
// strictly, as image-spec's own types (what containerd reads them as),
// with its media types and valid digests; HEAD answers each blob's size
// and digest; the layer is the same bytes at each pull, with no user or
// group names, no access or change times, mtimes as on disk, and a
// device node as it is; any other method is an error in the spec's JSON.
func TestAnImageIsWhatTheOCISpecSays(t *testing.T) {
	s, base, images := imageServer(t)
	dev := filepath.Join(s.Path("img"), "rootfs", "null")
	require.NoError(t, syscall.Mknod(dev, syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	code, img, body := registerImage(t, base, "img", "secret", time.Now().Add(time.Hour))
	require.Equal(t, http.StatusOK, code, body)

	strict := func(b []byte, v any) {
		t.Helper()
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		require.NoError(t, d.Decode(v), "%s", b)
	}
	resp, mb := pull(t, images, http.MethodGet, "/v2/jetway/img/manifests/"+img.Manifest, "secret")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", mb)
	var m ocispec.Manifest
	strict(mb, &m)
	assert.Equal(t, 2, m.SchemaVersion)
	assert.Equal(t, ocispec.MediaTypeImageManifest, m.MediaType)
	assert.Equal(t, ocispec.MediaTypeImageConfig, m.Config.MediaType)
	require.Len(t, m.Layers, 1)
	assert.Equal(t, ocispec.MediaTypeImageLayer, m.Layers[0].MediaType)
	for _, d := range []digest.Digest{digest.Digest(img.Manifest), m.Config.Digest, m.Layers[0].Digest} {
		require.NoError(t, d.Validate(), d)
	}

	resp, cb := pull(t, images, http.MethodGet, "/v2/jetway/img/blobs/"+m.Config.Digest.String(), "secret")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", cb)
	assert.Equal(t, m.Config.Size, int64(len(cb)))
	assert.Equal(t, m.Config.Digest, digest.FromBytes(cb))
	var cfg ocispec.Image
	strict(cb, &cfg)
	assert.Equal(t, runtime.GOARCH, cfg.Architecture)
	assert.Equal(t, "linux", cfg.OS)
	assert.Equal(t, "layers", cfg.RootFS.Type)
	assert.Equal(t, []digest.Digest{m.Layers[0].Digest}, cfg.RootFS.DiffIDs)
	assert.Equal(t, []string{"GREETING=hi", "PATH=/bin"}, cfg.Config.Env)

	for _, blob := range []ocispec.Descriptor{m.Config, m.Layers[0]} {
		head, hb := pull(t, images, http.MethodHead, "/v2/jetway/img/blobs/"+blob.Digest.String(), "secret")
		assert.Equal(t, http.StatusOK, head.StatusCode)
		assert.Empty(t, hb)
		assert.Equal(t, blob.Size, head.ContentLength)
		assert.Equal(t, blob.Digest.String(), head.Header.Get("Docker-Content-Digest"))
	}

	_, layer := pull(t, images, http.MethodGet, "/v2/jetway/img/blobs/"+m.Layers[0].Digest.String(), "secret")
	_, again := pull(t, images, http.MethodGet, "/v2/jetway/img/blobs/"+m.Layers[0].Digest.String(), "secret")
	assert.Equal(t, digest.FromBytes(layer), m.Layers[0].Digest)
	assert.True(t, bytes.Equal(layer, again), "the same bytes at each pull")
	sawDevice := false
	for _, h := range tarHeaders(t, layer) {
		assert.Empty(t, h.Uname+h.Gname, h.Name)
		assert.True(t, h.AccessTime.IsZero() && h.ChangeTime.IsZero(), h.Name)
		info, err := os.Lstat(filepath.Join(s.Path("img"), "rootfs", h.Name))
		require.NoError(t, err)
		assert.Equal(t, info.ModTime().Unix(), h.ModTime.Unix(), h.Name)
		if h.Name == "null" {
			sawDevice = true
			assert.Equal(t, byte(tar.TypeChar), h.Typeflag)
			assert.Equal(t, [2]int64{1, 3}, [2]int64{h.Devmajor, h.Devminor})
		}
	}
	assert.True(t, sawDevice, "the device node is in the layer")

	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, path := range []string{"/v2/jetway/img/manifests/" + img.Manifest, "/v2/jetway/img/blobs/" + m.Layers[0].Digest.String(), "/v2/jetway/img/blobs/uploads/"} {
			resp, b := pull(t, images, method, path, "secret")
			assert.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, resp.StatusCode, "%s %s", method, path)
			var e struct {
				Errors []struct{ Code string } `json:"errors"`
			}
			require.NoError(t, json.Unmarshal(b, &e), "%s %s: %s", method, path, b)
			require.Len(t, e.Errors, 1)
			assert.NotEmpty(t, e.Errors[0].Code)
		}
	}
}
