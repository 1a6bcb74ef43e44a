package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/steppod"
)

// TestRealNodeVolumeHolder: the web node's volume API, served by the
// gateway, on a target on the real node: the first create makes the
// volume holder, a real container (the sidecar as root with four capabilities and a read-only
// root, its emptyDir the only place it writes); an upload streams in
// over the kubelet's port-forward, a cow shares its file by a hard link
// (counted as a linked copy, with no byte copied), a single
// file streams out whole, properties filter the list, and a missing path
// answers the body the web node expects.
func TestRealNodeVolumeHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "rn-holder"
	g := nodeGateway(ctx, t, name, gatewayOptions{})
	api := httptest.NewServer(g.holder.API(name))
	defer api.Close()
	call := func(method, path, body string, hdr ...string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, api.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	code, body := call(http.MethodPost, "/volumes-async", `{"handle":"up","strategy":{"type":"empty"},"properties":{"kind":"upload"}}`)
	require.Equal(t, http.StatusCreated, code, body)
	eventually(t, 2*time.Minute, func() error {
		if code, body := call(http.MethodGet, "/volumes-async/up", ""); code != http.StatusOK {
			return errorf("create: %d %s", code, body)
		}
		return nil
	})
	code, _ = call(http.MethodDelete, "/volumes-async/up", "")
	assert.Equal(t, http.StatusNoContent, code)
	pod, err := startRealNode(t).Client.CoreV1().Pods(name).Get(ctx, steppod.HolderName("jetway"), metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, pod.Status.ContainerStatuses, 1)
	assert.True(t, pod.Status.ContainerStatuses[0].Ready || pod.Status.ContainerStatuses[0].State.Running != nil, "%+v", pod.Status)

	payload := []byte(rand.Text() + strings.Repeat("x", 1<<20))
	var archive bytes.Buffer
	zw := gzip.NewWriter(&archive)
	tw := tar.NewWriter(zw)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "payload", Mode: 0o644, Size: int64(len(payload)), Typeflag: tar.TypeReg}))
	_, err = tw.Write(payload)
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	code, body = call(http.MethodPut, "/volumes/up/stream-in?path=.", archive.String(), "Content-Encoding", "gzip")
	require.Equal(t, http.StatusNoContent, code, body)

	code, body = call(http.MethodPost, "/volumes", `{"handle":"copy","strategy":{"type":"cow","volume":"up"}}`)
	require.Equal(t, http.StatusCreated, code, body)
	assert.Equal(t, 1.0, metricValue(t, g, "jetway_concourse_volume_linked_copies_total"))
	assert.Equal(t, 0.0, metricValue(t, g, "jetway_concourse_volume_copies_total"))
	assert.Equal(t, 0.0, metricValue(t, g, "jetway_concourse_volume_copied_bytes_total"))

	code, body = call(http.MethodPut, "/volumes/copy/stream-out?path=payload", "", "Accept-Encoding", "gzip")
	require.Equal(t, http.StatusOK, code, body)
	zr, err := gzip.NewReader(strings.NewReader(body))
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	h, err := tr.Next()
	require.NoError(t, err)
	assert.Equal(t, "payload", h.Name)
	got, err := io.ReadAll(tr)
	require.NoError(t, err)
	assert.Equal(t, payload, got, "the copy's file, whole")

	code, body = call(http.MethodGet, "/volumes?kind=upload", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"handle":"up"`)
	assert.NotContains(t, body, `"handle":"copy"`)
	code, body = call(http.MethodPut, "/volumes/copy/stream-out?path=metadata.json", "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.JSONEq(t, `{"error":"no such file or directory"}`, body)
	code, _ = call(http.MethodDelete, "/volumes/copy", "")
	assert.Equal(t, http.StatusNoContent, code)
	code, body = call(http.MethodGet, "/volumes", "")
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, `"handle":"copy"`)
}
