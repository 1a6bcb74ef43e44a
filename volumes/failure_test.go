package volumes

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFinalStatus: a copy that fails for what the volume or the archive
// holds, or for no room, answers a status the gateway does not retry; a
// failure of the moment answers none.
func TestFinalStatus(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		code int
	}{
		"the volumes' capacity": {fmt.Errorf("tar entry %q: %w", "big", &CapacityError{Need: 1 << 20}), http.StatusInsufficientStorage},
		"the disk is full":      {&fs.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC}, http.StatusInsufficientStorage},
		"a quota":               {entryError("f", &fs.PathError{Op: "write", Path: "f", Err: syscall.EDQUOT}), http.StatusInsufficientStorage},
		"a root-only folder":    {entryError("d700", &fs.PathError{Op: "openat", Path: "d700", Err: syscall.EACCES}), StatusUnreadable},
		"a chown not allowed":   {&fs.PathError{Op: "lchown", Path: "f", Err: syscall.EPERM}, StatusUnreadable},
		"a file gone meanwhile": {entryError("f", &fs.PathError{Op: "lstat", Path: "f", Err: syscall.ENOENT}), 0},
		"a cut connection":      {io.ErrUnexpectedEOF, 0},
		"an I/O error":          {&fs.PathError{Op: "read", Path: "f", Err: syscall.EIO}, 0},
	} {
		assert.Equal(t, tc.code, finalStatus(tc.err), name)
	}
	assert.EqualError(t, entryError("d700/key", &fs.PathError{Op: "openat", Path: "d700/key", Err: syscall.EACCES}),
		`tar entry "d700/key": openat: permission denied`, "the entry named once, with the operation and why")
}

// TestStreamOutFailureTrailer: what StreamOutFailure reads of a
// stream-out's trailers.
func TestStreamOutFailureTrailer(t *testing.T) {
	_, _, failed := StreamOutFailure(http.Header{})
	assert.False(t, failed, "no trailer: the stream ended whole")
	code, msg, failed := StreamOutFailure(http.Header{ErrorTrailer: {errorTrailer(StatusUnreadable, "volume v: tar entry \"d\":\nopenat: permission denied")}})
	assert.True(t, failed)
	assert.Equal(t, StatusUnreadable, code)
	assert.Equal(t, `volume v: tar entry "d": openat: permission denied`, msg, "on one line")
	code, msg, failed = StreamOutFailure(http.Header{ErrorTrailer: {"gibberish"}})
	assert.True(t, failed)
	assert.Equal(t, http.StatusBadGateway, code, "a trailer not ours fails the stream, as one that may pass")
	assert.Equal(t, "gibberish", msg)
}

// TestACopyOfWhatTheServerMayNotReadFailsNamingIt (issue 41): a volume
// holding a folder only root may read, served as the step pods' sidecar
// serves it (an unprivileged user): a stream-out that asks for the error
// trailer ends with the failure's status and the entry and why, after
// what it could read; one that does not ask is cut; a push
// (stream-p2p-out) answers the failure itself, and nothing lands.
func TestACopyOfWhatTheServerMayNotReadFailsNamingIt(t *testing.T) {
	root := t.TempDir()
	srcURL := startUnprivileged(t, root)
	volume(t, srcURL, "v")
	vol := filepath.Join(root, "volumes", "v")
	require.NoError(t, os.WriteFile(filepath.Join(vol, "a"), []byte("readable"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(vol, "d700"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(vol, "d700", "key"), []byte("secret"), 0o600))
	if os.Geteuid() != 0 {
		require.NoError(t, os.Chmod(filepath.Join(vol, "d700"), 0)) // the server is this user: none may read it
		t.Cleanup(func() { _ = os.Chmod(filepath.Join(vol, "d700"), 0o700) })
	}
	const why = `volume v: tar entry "d700": openat: permission denied`

	t.Run("stream-out with the trailer", func(t *testing.T) {
		resp, body := do(t, http.MethodPut, srcURL+"/volumes/v/stream-out", map[string]string{"Accept-Encoding": Raw, AcceptErrorTrailer: "true"}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		code, msg, failed := StreamOutFailure(resp.Trailer)
		require.True(t, failed, "the body ended; its trailer says it failed")
		assert.Equal(t, StatusUnreadable, code)
		assert.Equal(t, why, msg)
		tr := tar.NewReader(bytes.NewReader(body))
		h, err := tr.Next()
		require.NoError(t, err)
		assert.Equal(t, "a", h.Name, "what came before the folder")
	})
	t.Run("stream-out without", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPut, srcURL+"/volumes/v/stream-out", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err == nil { // else cut before its answer's first bytes left
			defer resp.Body.Close()
			_, err = io.ReadAll(resp.Body)
		}
		assert.Error(t, err, "cut: a client that reads no trailer sees no clean end")
	})
	t.Run("stream-p2p-out", func(t *testing.T) {
		dst, dstURL := start(t)
		volume(t, dstURL, "w")
		ticketFor(t, dstURL, "one-push", "w", "x")
		resp, body := do(t, http.MethodPut, srcURL+"/volumes/v/stream-p2p-out?streamInURL="+dstURL+"/volumes/w/stream-in%3Fpath%3Dx",
			map[string]string{StreamInAuthorization: "Bearer one-push"}, nil)
		assert.Equal(t, StatusUnreadable, resp.StatusCode, "%s", body)
		assert.Equal(t, `{"error":"`+strings.ReplaceAll(why, `"`, `\"`)+`"}`, string(body))
		_, err := os.Stat(filepath.Join(dst.Path("w"), "x"))
		assert.ErrorIs(t, err, fs.ErrNotExist, "nothing landed")
	})
}

// TestAPushTheDestinationRefusesAnswersItsRefusal: a push of a volume
// holding a FIFO to a destination that takes none answers the
// destination's refusal as its own (400, the entry and why), not a 502
// the gateway would take for one that may pass.
func TestAPushTheDestinationRefusesAnswersItsRefusal(t *testing.T) {
	src, srcURL := start(t)
	_, dstURL := start(t)
	volume(t, srcURL, "v")
	volume(t, dstURL, "w")
	require.NoError(t, syscall.Mkfifo(filepath.Join(src.Path("v"), "f"), 0o644))
	ticketFor(t, dstURL, "one-push", "w", "x")
	resp, body := do(t, http.MethodPut, srcURL+"/volumes/v/stream-p2p-out?streamInURL="+dstURL+"/volumes/w/stream-in%3Fpath%3Dx",
		map[string]string{StreamInAuthorization: "Bearer one-push"}, nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", body)
	assert.Equal(t, `{"error":"the destination refused the push: stream-in: tar entry \"f\": a FIFO, and this folder takes no devices or FIFOs"}`, string(body))
}

// serveAsEnv, set, makes this test binary a volume server over the folder
// it names (serveForParent): startUnprivileged runs it so.
const serveAsEnv = "JETWAY_TEST_VOLUMES_ROOT"

// serveForParent serves root to the test that started this process, as
// whatever user it runs as: it writes its port on stdout and serves
// until its stdin ends. It returns the process's exit code.
func serveForParent(root string) int {
	s, err := Start(root, testTokenHash())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.Port())
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := s.Kill(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// sidecarUID is the user the step pods' volume sidecar runs as.
const sidecarUID = 65532

// startUnprivileged starts a volume server over root, which it makes
// its own, as the step pods' sidecar runs: as uid and gid 65532, without
// a capability (this test binary again, as that user); for a test not
// run by root, in this process, unprivileged already. It returns the
// server's URL.
func startUnprivileged(t *testing.T, root string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		_, url := startIn(t, root)
		return url
	}
	self, err := os.Executable()
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "volumes.test") // a copy that user may run
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	for _, dir := range []string{filepath.Dir(filepath.Dir(bin)), filepath.Dir(bin)} {
		require.NoError(t, os.Chmod(dir, 0o755))
	}
	require.NoError(t, os.Chown(root, sidecarUID, sidecarUID))
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), serveAsEnv+"="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sidecarUID, Gid: sidecarUID}}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		assert.NoError(t, cmd.Wait(), "the unprivileged server's exit")
	})
	port, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		require.NoError(t, errors.Join(err, stdin.Close(), cmd.Wait()), "the unprivileged server's port")
	}
	return "http://127.0.0.1:" + strings.TrimSpace(port)
}
