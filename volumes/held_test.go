package volumes

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

// TestAHeldVolumeSettlesOnce: a volume held by a pod says so; a copy of
// the pod's files settles it once: they are the volume's files then,
// with what the pod's process removed gone, its properties kept, the
// copy gone, and the account as the disk says. A second settle of the
// same pod, or of another pod, is refused (409) and changes nothing.
func TestAHeldVolumeSettlesOnce(t *testing.T) {
	s, base := startWith(t, t.TempDir(), 64<<20)
	made(t, base, `{"handle":"out","strategy":{"type":"empty"},"properties":{"k":"v"}}`)
	resp, body := streamInto(t, base, "out", ".", archiveOf(t, "old", 1<<20, "kept", 10))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)

	held := `{"pod":"p","uid":"u-1","mount":"m0","container":"c"}`
	resp, body = do(t, http.MethodPut, base+"/volumes/out/held", nil, strings.NewReader(held))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	assert.Equal(t, &Held{Pod: "p", UID: "u-1", Mount: "m0", Container: "c"}, lookUp(t, base, "out").Held)

	// The pod's files now: old removed, kept and a new file.
	made(t, base, `{"handle":"copy","strategy":{"type":"empty"}}`)
	resp, body = streamInto(t, base, "copy", ".", archiveOf(t, "kept", 10, "new", 2<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)

	resp, body = do(t, http.MethodPost, base+"/volumes/out/settle", nil, strings.NewReader(`{"from":"copy","uid":"u-2"}`))
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "another pod's copy: %s", body)
	resp, body = do(t, http.MethodPost, base+"/volumes/out/settle", nil, strings.NewReader(`{"from":"copy","uid":"u-1"}`))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)

	v := lookUp(t, base, "out")
	assert.Nil(t, v.Held, "settled")
	assert.Equal(t, map[string]string{"k": "v"}, v.Properties)
	assert.Equal(t, map[string]int64{".": -1, "kept": 10, "new": 2 << 20}, landedIn(t, s, "out"))
	resp, _ = do(t, http.MethodGet, base+"/volumes/copy", nil, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the copy is the volume now")
	assert.NoFileExists(t, s.metaPath("copy"))
	leftovers, _ := filepath.Glob(filepath.Join(s.root, "volumes", ".*"))
	assert.Empty(t, leftovers)
	accountHolds(t, s, 64<<10)

	made(t, base, `{"handle":"late","strategy":{"type":"empty"}}`)
	resp, body = do(t, http.MethodPost, base+"/volumes/out/settle", nil, strings.NewReader(`{"from":"late","uid":"u-1"}`))
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "settled already: %s", body)
	assert.Equal(t, map[string]int64{".": -1, "kept": 10, "new": 2 << 20}, landedIn(t, s, "out"))
	lookUp(t, base, "late")
}

// TestDestroyingAHeldVolumeSaysSo: a held volume destroyed answers
// HeldHeader (its files were never copied back); another does not.
func TestDestroyingAHeldVolumeSaysSo(t *testing.T) {
	_, base := start(t)
	for _, h := range []string{"held", "plain"} {
		made(t, base, `{"handle":"`+h+`","strategy":{"type":"empty"}}`)
	}
	resp, body := do(t, http.MethodPut, base+"/volumes/held/held", nil, strings.NewReader(`{"pod":"p","uid":"u","mount":"m1"}`))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	for h, want := range map[string]string{"held": "true", "plain": ""} {
		resp, body := do(t, http.MethodDelete, base+"/volumes/"+h, nil, nil)
		require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
		assert.Equal(t, want, resp.Header.Get(HeldHeader), h)
	}
}

// TestHoldAndSettleRefuseBadRequests: what is missing is named.
func TestHoldAndSettleRefuseBadRequests(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"v","strategy":{"type":"empty"}}`)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPut, "/volumes/v/held", `{"pod":"p","uid":"u"}`},
		{http.MethodPut, "/volumes/v/held", `not json`},
		{http.MethodPost, "/volumes/v/settle", `{"from":"../x","uid":"u"}`},
		{http.MethodPost, "/volumes/v/settle", `{"from":"w"}`},
	} {
		resp, body := do(t, c.method, base+c.path, nil, strings.NewReader(c.body))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s %s", c.body, body)
	}
	resp, body := do(t, http.MethodPut, base+"/volumes/none/held", nil, strings.NewReader(`{"pod":"p","uid":"u","mount":"m"}`))
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)
	resp, body = do(t, http.MethodPost, base+"/volumes/v/settle", nil, strings.NewReader(`{"from":"none","uid":"u"}`))
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)
	_, err := os.Stat(s.Path("v"))
	require.NoError(t, err, "the volume stays")
}

// TestCheckRefusesWhatAStreamInWould: a check walks a volume without
// reading its files and refuses, naming the entry, what this server's
// stream-in would (a FIFO without devices, a volume past the entries
// limit); it counts a file of two links once, as a tar carries it.
func TestCheckRefusesWhatAStreamInWould(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"v","strategy":{"type":"empty"}}`)
	dir := s.Path("v")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "d"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "d", "f"), []byte("12345"), 0o600))
	require.NoError(t, os.Link(filepath.Join(dir, "d", "f"), filepath.Join(dir, "link")))
	require.NoError(t, os.Symlink("d/f", filepath.Join(dir, "sym")))

	resp, body := do(t, http.MethodGet, base+"/volumes/v/check", nil, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	assert.Equal(t, "5", resp.Header.Get(CheckedHeader), "a file of two links counts once")
	assert.Equal(t, "4", resp.Header.Get(CheckedEntriesHeader))

	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "d", "pipe"), 0o644))
	resp, body = do(t, http.MethodGet, base+"/volumes/v/check", nil, nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(body), `tar entry \"d/pipe\": a FIFO, and this folder takes no devices or FIFOs`)

	s.SetLimits(tarsafe.Limits{Devices: true, Entries: 4})
	resp, body = do(t, http.MethodGet, base+"/volumes/v/check", nil, nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(body), `goes past the limit of 4 entries`)
	s.SetLimits(tarsafe.Limits{Devices: true})
	resp, body = do(t, http.MethodGet, base+"/volumes/v/check", nil, nil)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode, "devices allowed: %s", body)

	resp, _ = do(t, http.MethodGet, base+"/volumes/none/check", nil, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// TestALostVolumeSaysWhy: a volume lost with the pod that held it is no
// more (not listed, its files gone, the account given back), and asking
// for it, or copying it, answers 410 with why; a destroy forgets it.
func TestALostVolumeSaysWhy(t *testing.T) {
	s, base := startWith(t, t.TempDir(), 64<<20)
	empty := s.space.usedBytes()
	volume(t, base, "v")
	resp, body := streamInto(t, base, "v", ".", archiveOf(t, "f", 1<<20))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	resp, body = do(t, http.MethodPost, base+"/volumes/v/lose", nil, strings.NewReader(`{"why":"its pod p is deleted"}`))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)

	_, err := os.Lstat(s.Path("v"))
	assert.True(t, os.IsNotExist(err), "its files are gone")
	resp, body = do(t, http.MethodGet, base+"/volumes", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "[]", strings.TrimSpace(string(body)))
	resp, body = do(t, http.MethodGet, base+"/volumes/v", nil, nil)
	assert.Equal(t, http.StatusGone, resp.StatusCode)
	assert.Equal(t, `{"error":"volume \"v\" is lost: its pod p is deleted"}`, string(body))
	resp, body = create(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"v"}}`)
	assert.Equal(t, http.StatusGone, resp.StatusCode)
	assert.Contains(t, string(body), `parent volume \"v\" is lost: its pod p is deleted`)

	resp, _ = do(t, http.MethodDelete, base+"/volumes/v", nil, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = do(t, http.MethodGet, base+"/volumes/v", nil, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "forgotten once destroyed")
	assert.Equal(t, empty, s.space.usedBytes(), "everything given back")
}
