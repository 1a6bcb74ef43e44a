package cluster

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The registry serves every image again under PrivateRepository, but only
// to a request with PrivateUser and PrivatePassword: without them, or with
// a wrong password, a registry's 401 with a Basic challenge. /v2/ and the
// public repositories stay open.
func TestRegistryPrivateRepository(t *testing.T) {
	r := testRegistry(t)
	digest, layer := digestOf(r.manifests["busybox:1"]), digestOf(testLayer(t))

	get := func(path, user, password string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		return w
	}
	for _, path := range []string{"/v2/", "/v2/busybox/manifests/1", "/v2/busybox/manifests/" + digest} {
		assert.Equal(t, http.StatusOK, get(path, "", "").Code, path)
	}
	for _, path := range []string{"/v2/private/busybox/manifests/" + digest, "/v2/private/busybox/manifests/1",
		"/v2/private/busybox/blobs/" + layer, "/v2/private/none/manifests/1"} {
		for _, creds := range [][2]string{{"", ""}, {PrivateUser, "wrong"}, {"someone", PrivatePassword}} {
			w := get(path, creds[0], creds[1])
			assert.Equal(t, http.StatusUnauthorized, w.Code, "%s as %q", path, creds[0])
			assert.Equal(t, `Basic realm="registry.jetway.test"`, w.Header().Get("WWW-Authenticate"))
			assert.JSONEq(t, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, w.Body.String())
		}
	}
	w := get("/v2/private/busybox/manifests/"+digest, PrivateUser, PrivatePassword)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Equal(t, r.manifests["busybox:1"], w.Body.Bytes(), "busybox's manifest")
	assert.Equal(t, digest, w.Header().Get("Docker-Content-Digest"))
	w = get("/v2/private/busybox/blobs/"+layer, PrivateUser, PrivatePassword)
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, testLayer(t), w.Body.Bytes())
	for path, code := range map[string]int{
		"/v2/private/none/manifests/1":       http.StatusNotFound,
		"/v2/private/busy/image/manifests/1": http.StatusTooManyRequests,
	} {
		assert.Equal(t, code, get(path, PrivateUser, PrivatePassword).Code, path)
	}
}

// testRegistry is a registry that holds one image, jetway.test/busybox:1
// of testLayer, loaded from a `docker save`-style tarball.
func testRegistry(t *testing.T) *registry {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "img.tar"))
	require.NoError(t, err)
	writeTar(t, f, map[string]string{
		"manifest.json": `[{"Config":"config.json","RepoTags":["jetway.test/busybox:1"],"Layers":["layer.tar.gz"]}]`,
		"config.json":   `{"architecture":"amd64","os":"linux","config":{}}`,
		"layer.tar.gz":  string(testLayer(t)),
	})
	require.NoError(t, f.Close())
	r, err := loadRegistry(dir, []string{"img.tar"})
	require.NoError(t, err)
	return r
}

// testLayer is a gzipped layer of one file, etc/hello.
func testLayer(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	writeTar(t, zw, map[string]string{"etc/hello": "hi\n"})
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// writeTar writes a tar of files, by name, to w, in a fixed order.
func writeTar(t *testing.T, w io.Writer, files map[string]string) {
	t.Helper()
	tw := tar.NewWriter(w)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name]))}))
		_, err := tw.Write([]byte(files[name]))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
}
