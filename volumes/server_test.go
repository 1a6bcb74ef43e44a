package volumes

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// A refused stream-in answers before its body ended; net/http then
// lingers on the connection for half a second (closeWriteAndWait) before
// it closes it, after the server is gone.
func TestMain(m *testing.M) {
	if root := os.Getenv(serveAsEnv); root != "" {
		os.Exit(serveForParent(root)) // startUnprivileged's server
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))
}

// testToken is the token of the servers tests start.
const testToken = "test-token-0123456789abcdef"

func start(t *testing.T) (*Server, string) {
	t.Helper()
	return startIn(t, t.TempDir())
}

// testTokenHash is testToken's SHA-256, as a server takes it.
func testTokenHash() string {
	sum := sha256.Sum256([]byte(testToken))
	return hex.EncodeToString(sum[:])
}

// startIn starts a server over root.
func startIn(t *testing.T, root string) (*Server, string) {
	t.Helper()
	s, err := Start(root, testTokenHash())
	require.NoError(t, err)
	t.Cleanup(func() { s.Kill() })
	return s, fmt.Sprintf("http://127.0.0.1:%d", s.Port())
}

func do(t testing.TB, method, url string, hdr map[string]string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	for k, v := range hdr {
		req.Header.Set(k, v) // "Authorization": "" sends none
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func volume(t testing.TB, base, handle string) {
	resp, body := do(t, http.MethodPost, base+"/volumes", nil, strings.NewReader(`{"handle":"`+handle+`"}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
}

func TestStreamOutIntoStreamIn(t *testing.T) {
	src, srcURL := start(t)
	dst, dstURL := start(t)
	volume(t, srcURL, "a")
	require.NoError(t, os.MkdirAll(filepath.Join(src.Path("a"), "out", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src.Path("a"), "out", "sub", "f.txt"), []byte("artifact"), 0o644))
	for _, enc := range []string{Raw, Gzip, Zstd, S2} {
		t.Run(enc, func(t *testing.T) {
			volume(t, dstURL, "b-"+enc)
			resp, tarball := do(t, http.MethodPut, srcURL+"/volumes/a/stream-out?path=out", map[string]string{"Accept-Encoding": enc}, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, enc, resp.Header.Get("Content-Encoding"))
			resp, body := do(t, http.MethodPut, dstURL+"/volumes/b-"+enc+"/stream-in?path=in", map[string]string{"Content-Encoding": enc}, bytes.NewReader(tarball))
			require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
			got, err := os.ReadFile(filepath.Join(dst.Path("b-"+enc), "in", "sub", "f.txt"))
			require.NoError(t, err)
			assert.Equal(t, "artifact", string(got))
		})
	}
}

func TestErrors(t *testing.T) {
	_, base := start(t)
	volume(t, base, "v")
	for _, tc := range []struct {
		method, path string
		hdr          map[string]string
		code         int
		msg          string
	}{
		{http.MethodPut, "/volumes/nope/stream-out", nil, 404, `volume \"nope\" not found`},
		{http.MethodPut, "/volumes/nope/stream-in", nil, 404, `volume \"nope\" not found`},
		{http.MethodPut, "/volumes/v/stream-out?path=missing", nil, 404, `no such file or directory`},
		{http.MethodPut, "/volumes/v/stream-in", map[string]string{"Content-Encoding": "br"}, 400, `unsupported encoding \"br\"`},
		{http.MethodPut, "/volumes/v/stream-in", map[string]string{"Content-Encoding": "gzip"}, 400, "stream-in"},
		{http.MethodPut, "/volumes/v/stream-out?path=../..", nil, 400, "leaves the volume"},
	} {
		resp, body := do(t, tc.method, base+tc.path, tc.hdr, strings.NewReader("not a tar"))
		assert.Equal(t, tc.code, resp.StatusCode, tc.path)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Contains(t, string(body), tc.msg, tc.path)
	}
	// A web node's baggageclaim client tells a missing file from a
	// missing volume by this body, compared whole.
	resp, body := do(t, http.MethodPut, base+"/volumes/v/stream-out?path=metadata.json", nil, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, `{"error":"no such file or directory"}`, string(body))
}

// TestStreamInLimit: stream-in takes baggageclaim's limit query (MB of
// request body, 0 meaning none); a stream past it is refused with a 403
// naming the limit, and nothing lands.
func TestStreamInLimit(t *testing.T) {
	s, base := start(t)
	volume(t, base, "src")
	volume(t, base, "v")
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("src"), "f"), bytes.Repeat([]byte("0123456789"), 1000), 0o644))
	kept := filepath.Join(s.Path("v"), "kept")
	require.NoError(t, os.WriteFile(kept, []byte("before"), 0o644))
	tarballs := map[string][]byte{}
	for _, enc := range []string{Raw, Gzip} {
		resp, b := do(t, http.MethodPut, base+"/volumes/src/stream-out", map[string]string{"Accept-Encoding": enc}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		tarballs[enc] = b
	}
	require.Greater(t, len(tarballs[Gzip]), 104, "the gzip stream is past the limit below")
	for i, tc := range []struct {
		enc, limit string
		code       int
		msg        string
	}{
		{Raw, "", http.StatusNoContent, ""},
		{Raw, "0", http.StatusNoContent, ""},
		{Raw, "0.000000", http.StatusNoContent, ""},
		{Raw, "1.000000", http.StatusNoContent, ""},
		{Raw, "0.000100", http.StatusForbidden, "past its limit of 0.000100 MB (104 bytes)"},
		{Gzip, "0.000100", http.StatusForbidden, "past its limit of 0.000100 MB (104 bytes)"},
		{Raw, "lots", http.StatusBadRequest, `limit \"lots\" is not a number of MB`},
		{Raw, "-1", http.StatusBadRequest, `limit \"-1\" is not a number of MB`},
	} {
		path := fmt.Sprintf("in-%d", i)
		resp, body := do(t, http.MethodPut, base+"/volumes/v/stream-in?path="+path+"&limit="+url.QueryEscape(tc.limit),
			map[string]string{"Content-Encoding": tc.enc}, bytes.NewReader(tarballs[tc.enc]))
		assert.Equal(t, tc.code, resp.StatusCode, "%s %q: %s", tc.enc, tc.limit, body)
		assert.Contains(t, string(body), tc.msg)
		_, err := os.Stat(filepath.Join(s.Path("v"), path, "f"))
		assert.Equal(t, tc.code == http.StatusNoContent, err == nil, "%s %q lands only if accepted", tc.enc, tc.limit)
	}
	b, err := os.ReadFile(kept)
	require.NoError(t, err)
	assert.Equal(t, "before", string(b))
	leftovers, _ := filepath.Glob(filepath.Join(s.Path("v"), ".stream-in-*"))
	assert.Empty(t, leftovers)
}

// TestTruncatedStreamInNeverLands cuts a chunked upload mid-way: the
// volume keeps what it had.
func TestTruncatedStreamInNeverLands(t *testing.T) {
	src, base := start(t)
	volume(t, base, "v")
	require.NoError(t, os.WriteFile(filepath.Join(src.Path("v"), "old"), []byte("old"), 0o644))
	resp, tarball := do(t, http.MethodPut, base+"/volumes/v/stream-out", nil, nil)
	require.Equal(t, 200, resp.StatusCode)

	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	half := tarball[:len(tarball)/2]
	fmt.Fprintf(conn, "PUT /volumes/v/stream-in?path=new HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", testToken, len(half))
	conn.Write(half)
	conn.Write([]byte("\r\n"))
	require.Eventually(t, func() bool { // the stream-in is extracting
		started, _ := filepath.Glob(filepath.Join(src.Path("v"), ".stream-in-*"))
		return len(started) > 0
	}, 10*time.Second, 5*time.Millisecond)
	conn.Close() // no terminating chunk: the upload was cut
	src.Kill()   // returns once the stream-in handler has
	_, err = os.Stat(filepath.Join(src.Path("v"), "new"))
	assert.True(t, os.IsNotExist(err), "a cut stream-in must not land")
	leftovers, _ := filepath.Glob(filepath.Join(src.Path("v"), ".stream-in-*"))
	assert.Empty(t, leftovers)
}

func TestStreamP2POut(t *testing.T) {
	src, srcURL := start(t)
	dst, dstURL := start(t)
	volume(t, srcURL, "a")
	require.NoError(t, os.WriteFile(filepath.Join(src.Path("a"), "f"), []byte("p2p"), 0o644))
	for _, enc := range []string{Raw, Gzip, Zstd, S2} {
		t.Run(enc, func(t *testing.T) {
			volume(t, dstURL, "b-"+enc)
			ticketFor(t, dstURL, "one-push", "b-"+enc, "x")
			resp, body := do(t, http.MethodPut, srcURL+"/volumes/a/stream-p2p-out?encoding="+enc+"&streamInURL="+
				dstURL+"/volumes/b-"+enc+"/stream-in%3Fpath%3Dx", map[string]string{StreamInAuthorization: "Bearer one-push"}, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
			got, err := os.ReadFile(filepath.Join(dst.Path("b-"+enc), "x", "f"))
			require.NoError(t, err)
			assert.Equal(t, "p2p", string(got))

			// The answer is the stream the destination took: the same bytes a
			// stream-out of the same path in the same encoding carries.
			var res P2PResult
			require.NoError(t, json.Unmarshal(body, &res))
			out, outBody := do(t, http.MethodPut, srcURL+"/volumes/a/stream-out", map[string]string{"Accept-Encoding": enc}, nil)
			require.Equal(t, http.StatusOK, out.StatusCode)
			sum := sha256.Sum256(outBody)
			assert.Equal(t, int64(len(outBody)), res.Bytes)
			assert.Equal(t, hex.EncodeToString(sum[:]), res.SHA256)
		})
	}
}

// TestRateChangesWhileServing throttles and unthrottles a server while it
// serves streams, as the integration tests do; the race detector guards it.
func TestRateChangesWhileServing(t *testing.T) {
	s, base := start(t)
	volume(t, base, "v")
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("v"), "f"), bytes.Repeat([]byte("x"), 256<<10), 0o644))
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPut, base+"/volumes/v/stream-out", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	s.SetRate(1 << 30)
	s.SetRate(0)
	require.NoError(t, <-done)
}

// TestLinksCrossAsLinks: a symbolic link in a volume streams out as a link
// (with its target) and lands as one; a link pointing out of the volume,
// and a file written through a link, are refused.
func TestLinksCrossAsLinks(t *testing.T) {
	src, srcURL := start(t)
	dst, dstURL := start(t)
	volume(t, srcURL, "a")
	volume(t, dstURL, "b")
	out := filepath.Join(src.Path("a"), "out")
	require.NoError(t, os.MkdirAll(filepath.Join(out, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(out, "tool"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.Symlink("../tool", filepath.Join(out, "bin", "tool")))
	resp, tarball := do(t, http.MethodPut, srcURL+"/volumes/a/stream-out?path=out", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, body := do(t, http.MethodPut, dstURL+"/volumes/b/stream-in?path=in", nil, bytes.NewReader(tarball))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	link, err := os.Readlink(filepath.Join(dst.Path("b"), "in", "bin", "tool"))
	require.NoError(t, err)
	assert.Equal(t, "../tool", link)

}

// TestStreamInRefusesHostileArchives: the hostile archives every
// extractor refuses (tarsafetest), refused the same way by stream-in,
// with a 400, leaving the volume as it was; but a link out of the volume
// alone is kept as a link (a container resolves it in its own root: an
// image's rootfs is full of them), and nothing is ever written through
// one. A gzip bomb stops at the server's limit.
func TestStreamInRefusesHostileArchives(t *testing.T) {
	dst, dstURL := start(t)
	volume(t, dstURL, "c")
	kept := filepath.Join(dst.Path("c"), "kept")
	require.NoError(t, os.WriteFile(kept, []byte("before"), 0o644))
	for _, h := range tarsafetest.Hostiles {
		if h.Before != nil {
			continue // stream-in extracts into a new folder, never into what is there
		}
		t.Run(h.Name, func(t *testing.T) {
			outside := t.TempDir()
			entries := h.Entries(outside)
			resp, body := do(t, http.MethodPut, dstURL+"/volumes/c/stream-in", nil, bytes.NewReader(tarsafetest.Tar(t, entries...)))
			if h.ForeignLink {
				require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
				last := entries[len(entries)-1]
				link, err := os.Readlink(filepath.Join(dst.Path("c"), last.Name))
				require.NoError(t, err)
				assert.Equal(t, last.Linkname, link, "kept as written")
			} else {
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
				var answer struct{ Error string }
				require.NoError(t, json.Unmarshal(body, &answer))
				assert.Contains(t, answer.Error, cmp.Or(h.ForeignWant, h.Want))
			}
			found, _ := os.ReadDir(outside)
			assert.Empty(t, found)
			b, err := os.ReadFile(kept)
			require.NoError(t, err, "the volume is as it was")
			assert.Equal(t, "before", string(b))
		})
	}
	t.Run("bomb", func(t *testing.T) {
		dst.SetLimits(tarsafe.Limits{Bytes: 8 << 20})
		bomb := tarsafetest.Bomb(10<<10, 1<<20)
		defer bomb.Close()
		resp, body := do(t, http.MethodPut, dstURL+"/volumes/c/stream-in", map[string]string{"Content-Encoding": "gzip"}, bomb)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(body), `tar entry \"zeros/8\" goes past the limit of 8388608 bytes an archive may write`)
		b, err := os.ReadFile(kept)
		require.NoError(t, err, "the volume is as it was")
		assert.Equal(t, "before", string(b))
	})

}

// ticketFor registers ticket at the server for one stream-in into handle's
// path.
func ticketFor(t testing.TB, base, ticket, handle, path string) {
	t.Helper()
	sum := sha256.Sum256([]byte(ticket))
	body, _ := json.Marshal(TicketRequest{SHA256: hex.EncodeToString(sum[:]), Handle: handle, Path: path})
	resp, answer := do(t, http.MethodPost, base+"/tickets", nil, bytes.NewReader(body))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", answer)
}

// TestServesOnlyTheTokensHolder: every route answers 401 to a request
// without the token, or with another, and reads, writes or removes
// nothing.
func TestServesOnlyTheTokensHolder(t *testing.T) {
	s, base := start(t)
	volume(t, base, "v")
	secret := filepath.Join(s.Path("v"), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("team a's"), 0o644))
	tarball := tarsafetest.Tar(t, &tar.Header{Name: "secret", Typeflag: tar.TypeReg, Mode: 0o644})
	sum := sha256.Sum256([]byte("mine"))
	ticket, _ := json.Marshal(TicketRequest{SHA256: hex.EncodeToString(sum[:]), Handle: "v"})
	for _, cred := range []string{"", "Bearer ", "Bearer wrong-token", "Basic " + testToken, testToken} {
		for _, tc := range []struct {
			method, path string
			body         []byte
		}{
			{http.MethodPut, "/volumes/v/stream-out", nil},
			{http.MethodPut, "/volumes/v/stream-in", tarball},
			{http.MethodPut, "/volumes/v/stream-p2p-out?streamInURL=http://127.0.0.1:1/", nil},
			{http.MethodPost, "/volumes", []byte(`{"handle":"new"}`)},
			{http.MethodPost, "/volumes", []byte(`{"handle":"new","strategy":{"type":"cow","volume":"v"}}`)},
			{http.MethodPost, "/tickets", ticket},
			{http.MethodGet, "/volumes", nil},
			{http.MethodGet, "/volumes?team=a", nil},
			{http.MethodGet, "/volumes/v", nil},
			{http.MethodDelete, "/volumes/v", nil},
			{http.MethodPut, "/volumes/v/properties/team", []byte(`{"value":"b"}`)},
			{http.MethodPut, "/volumes/v/properties/stream-in", []byte(`{"value":"b"}`)},
			{http.MethodGet, "/volumes/v/privileged", nil},
			{http.MethodPut, "/volumes/v/privileged", []byte(`{"value":true}`)},
			{http.MethodGet, "/no/such/path", nil},
		} {
			resp, body := do(t, tc.method, base+tc.path, map[string]string{"Authorization": cred}, bytes.NewReader(tc.body))
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s %s with %q", tc.method, tc.path, cred)
			assert.NotContains(t, string(body), "team a's")
			assert.Contains(t, string(body), "no valid credential")
		}
	}
	b, err := os.ReadFile(secret)
	require.NoError(t, err)
	assert.Equal(t, "team a's", string(b), "nothing written")
	_, err = os.Stat(s.Path("new"))
	assert.True(t, os.IsNotExist(err), "no volume made")
	assert.Equal(t, Volume{Handle: "v", Path: s.Path("v"), Properties: map[string]string{}}, lookUp(t, base, "v"),
		"no volume removed or changed")
	// The one ticket registered with the token is not one the others made.
	resp, _ := do(t, http.MethodPut, base+"/volumes/v/stream-in", map[string]string{"Authorization": "Bearer mine"}, bytes.NewReader(tarball))
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestOnlyTheStreamInRouteGoesWithoutTheToken: a request without the
// token whose path only ends as a stream-in's does (a property named
// stream-in, another method, another depth), or the stream-in route
// itself without a ticket, gets a 401 before the server reads a byte of
// its body: each request promises a body of 1 MiB and sends none.
func TestOnlyTheStreamInRouteGoesWithoutTheToken(t *testing.T) {
	_, base := start(t)
	volume(t, base, "v")
	for _, line := range []string{
		"PUT /volumes/v/properties/stream-in",
		"PUT /volumes/v/properties/x/stream-in",
		"POST /volumes/v/stream-in",
		"DELETE /volumes/v/stream-in",
		"PUT /volumes/v/x/stream-in",
		"PUT /volumes/stream-in",
		"PUT /stream-in",
		"PUT /volumes/v/stream-in",
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		fmt.Fprintf(conn, "%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", line, 1<<20)
		// The failure's bound, not a wait for something not to happen:
		// a server reading the body waits for it until then.
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "%s: no answer without its body", line)
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: %s", line, b)
		assert.Contains(t, string(b), "no valid credential", line)
	}
	assert.Equal(t, map[string]string{}, lookUp(t, base, "v").Properties, "no property set")
}

// TestTicketsServeOnePush: a push (stream-p2p-out) lands only with a
// ticket the destination's token holder registered, for that volume path,
// once, before it expires; without one the destination refuses it and
// the source says so.
func TestTicketsServeOnePush(t *testing.T) {
	src, srcURL := start(t)
	dst, dstURL := start(t)
	clock := time.Unix(1_000_000, 0)
	var mu sync.Mutex
	dst.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	volume(t, srcURL, "a")
	volume(t, dstURL, "b")
	require.NoError(t, os.WriteFile(filepath.Join(src.Path("a"), "f"), []byte("p2p"), 0o644))
	push := func(ticket, path string) (*http.Response, []byte) {
		hdr := map[string]string{}
		if ticket != "" {
			hdr[StreamInAuthorization] = "Bearer " + ticket
		}
		return do(t, http.MethodPut, srcURL+"/volumes/a/stream-p2p-out?streamInURL="+
			url.QueryEscape(dstURL+"/volumes/b/stream-in?path="+path), hdr, nil)
	}
	landed := func(path string) bool {
		_, err := os.Stat(filepath.Join(dst.Path("b"), path, "f"))
		return err == nil
	}

	resp, body := push("", "x")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, string(body), "401 Unauthorized")
	resp, body = push("never-registered", "x")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", body)
	assert.False(t, landed("x"))

	ticketFor(t, dstURL, "for-x", "b", "x")
	resp, body = push("for-x", "elsewhere")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "a ticket is for its path alone: %s", body)
	assert.False(t, landed("elsewhere"))
	resp, body = push("for-x", "x")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.True(t, landed("x"))
	require.NoError(t, os.RemoveAll(filepath.Join(dst.Path("b"), "x")))
	resp, _ = push("for-x", "x")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "a ticket serves once")
	assert.False(t, landed("x"))

	ticketFor(t, dstURL, "late", "b", "y")
	mu.Lock()
	clock = clock.Add(TicketTTL)
	mu.Unlock()
	resp, _ = push("late", "y")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "an expired ticket serves nobody")
	assert.False(t, landed("y"))
}

// TestServerNeedsATokenHash: there is no server serving anyone.
func TestServerNeedsATokenHash(t *testing.T) {
	for _, h := range []string{"", "abc", strings.Repeat("z", 64)} {
		_, err := Start(t.TempDir(), h)
		assert.ErrorContains(t, err, "SHA-256 in hex", "%q", h)
	}
}

// BenchmarkAuthorization streams a 1 MiB volume out through the server's
// handler chain (token checked) and through the route's handler alone,
// alternately within one loop so the machine's drift hits both alike, and
// reports the time ratio: the price of the check, once per request.
func BenchmarkAuthorization(b *testing.B) {
	sum := sha256.Sum256([]byte(testToken))
	s, err := Start(b.TempDir(), hex.EncodeToString(sum[:]))
	require.NoError(b, err)
	defer s.Kill()
	require.NoError(b, os.MkdirAll(s.Path("v"), 0o755))
	require.NoError(b, os.WriteFile(filepath.Join(s.Path("v"), "f"), bytes.Repeat([]byte("x"), 1<<20), 0o644))
	checked := httptest.NewServer(s.srv.Handler)
	defer checked.Close()
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.SetPathValue("handle", "v")
		s.streamOut(w, r)
	}))
	defer bare.Close()
	get := func(url string) time.Duration {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPut, url+"/volumes/v/stream-out", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatal(err, resp.Status)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start)
	}
	var withCheck, without time.Duration
	b.SetBytes(2 << 20)
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			withCheck += get(checked.URL)
			without += get(bare.URL)
		} else {
			without += get(bare.URL)
			withCheck += get(checked.URL)
		}
	}
	b.ReportMetric(float64(without)/float64(withCheck), "throughput-checked/unchecked")
}

// A stream-in into a folder that is there lands in that same folder, next
// to what it holds, as baggageclaim extracts: a container's mount of the
// folder (a web node's, package concourse) sees what lands, and a mount
// point nested in it stays.
func TestStreamInLandsInTheFolderThatIsThere(t *testing.T) {
	dst, dstURL := start(t)
	volume(t, dstURL, "m0")
	root := dst.Path("m0")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "in"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "kept"), []byte("before"), 0o644))
	before, err := os.Stat(root)
	require.NoError(t, err)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, content := range map[string]string{"new": "landed", "kept": "replaced"} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content))}))
		_, _ = tw.Write([]byte(content))
	}
	require.NoError(t, tw.Close())
	resp, body := do(t, http.MethodPut, dstURL+"/volumes/m0/stream-in?path=.", map[string]string{"Content-Encoding": "raw"}, &buf)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	after, err := os.Stat(root)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "the same folder")
	for name, want := range map[string]string{"new": "landed", "kept": "replaced"} {
		b, err := os.ReadFile(filepath.Join(root, name))
		require.NoError(t, err)
		assert.Equal(t, want, string(b))
	}
	assert.DirExists(t, filepath.Join(root, "in"), "a nested mount point stays")
}
