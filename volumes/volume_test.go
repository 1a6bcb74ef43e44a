package volumes

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// create posts a create request; body is its JSON.
func create(t *testing.T, base, body string) (*http.Response, []byte) {
	t.Helper()
	return do(t, http.MethodPost, base+"/volumes", nil, strings.NewReader(body))
}

// made creates a volume as body says, and returns the answer.
func made(t *testing.T, base, body string) Volume {
	t.Helper()
	resp, b := create(t, base, body)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var v Volume
	require.NoError(t, json.Unmarshal(b, &v))
	return v
}

// lookUp gets a volume.
func lookUp(t *testing.T, base, handle string) Volume {
	t.Helper()
	resp, b := do(t, http.MethodGet, base+"/volumes/"+handle, nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var v Volume
	require.NoError(t, json.Unmarshal(b, &v))
	return v
}

// stepVolume makes a volume as the step agent does: a link to a folder
// elsewhere, holding a file, without metadata. It returns the folder.
func stepVolume(t *testing.T, s *Server, handle string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("step"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Dir(s.Path(handle)), 0o755))
	require.NoError(t, os.Symlink(dir, s.Path(handle)))
	return dir
}

func TestCreate(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"e","strategy":{"type":"empty"}}`)
	many := map[string]string{}
	for i := range maxProperties + 1 {
		many[strconv.Itoa(i)] = "x"
	}
	tooMany, _ := json.Marshal(CreateRequest{Handle: "n", Strategy: &Strategy{Type: StrategyEmpty}, Properties: many})
	for _, tc := range []struct {
		name, body string
		code       int
		msg        string
	}{
		{"a handle alone", `{"handle":"old"}`, 201, `"handle":"old"`},
		{"again: as before strategies, no conflict", `{"handle":"old"}`, 201, `"properties":{}`},
		{"empty", `{"handle":"new","strategy":{"type":"empty"},"properties":{"k":"v"},"privileged":true}`, 201,
			`"properties":{"k":"v"},"privileged":true`},
		{"an existing handle", `{"handle":"e","strategy":{"type":"empty"}}`, 409, `volume \"e\" exists`},
		{"a handle being a step's volume", `{"handle":"step","strategy":{"type":"empty"}}`, 409, `volume \"step\" exists`},
		{"an unknown strategy", `{"handle":"u","strategy":{"type":"btrfs"}}`, 422, `unknown strategy type \"btrfs\" (empty, cow, import)`},
		{"no strategy type", `{"handle":"u","strategy":{}}`, 422, `unknown strategy type \"\"`},
		{"a cow without parent", `{"handle":"u","strategy":{"type":"cow"}}`, 400, "names its parent volume"},
		{"a cow of a missing parent", `{"handle":"u","strategy":{"type":"cow","volume":"nope"}}`, 404, `parent volume \"nope\" not found`},
		{"an import without path", `{"handle":"u","strategy":{"type":"import"}}`, 400, "names its path"},
		{"bad JSON", `{"handle":`, 400, "body must be"},
		{"no handle", `{"strategy":{"type":"empty"}}`, 400, `handle \"\" is not`},
		{"a handle leaving the root", `{"handle":"../x","strategy":{"type":"empty"}}`, 400, `handle \"../x\" is not`},
		{"a handle of the server's own", `{"handle":".create-1"}`, 400, `handle \".create-1\" is not`},
		{"too many properties", string(tooMany), 400, "65 properties are past the limit of 64"},
		{"a long property name", `{"handle":"n","properties":{"` + strings.Repeat("k", 257) + `":"v"}}`, 400,
			"a property name of 257 bytes is past the limit of 256 bytes"},
		{"long property values", `{"handle":"n","properties":{"a":"` + strings.Repeat("v", 32<<10) + `","b":"` + strings.Repeat("v", 32<<10+1) + `"}}`, 400,
			"property values of 65537 bytes in all are past the limit of 65536 bytes"},
		{"a long body", `{"handle":"n","x":"` + strings.Repeat(" ", 1<<20) + `"}`, 400, "the body is past the limit of 1048576 bytes"},
	} {
		if tc.name == "a handle being a step's volume" {
			stepVolume(t, s, "step")
		}
		resp, body := create(t, base, tc.body)
		assert.Equal(t, tc.code, resp.StatusCode, "%s: %s", tc.name, body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), tc.name)
		assert.Contains(t, string(body), tc.msg, tc.name)
	}
	for _, h := range []string{"u", "n", "x"} {
		_, err := os.Lstat(s.Path(h))
		assert.True(t, os.IsNotExist(err), "no volume %s made", h)
	}
	// An empty volume is writable by whoever a step runs as; a volume
	// made without strategy is made as it always was.
	for h, mode := range map[string]os.FileMode{"new": 0o777, "old": 0o755 &^ umask(t)} {
		fi, err := os.Stat(s.Path(h))
		require.NoError(t, err)
		assert.Equal(t, os.ModeDir|mode, fi.Mode(), h)
	}
	leftovers, _ := filepath.Glob(filepath.Join(s.root, "volumes", ".*"))
	assert.Empty(t, leftovers)
}

// umask is the process's umask, as a new folder's mode shows it.
func umask(t *testing.T) os.FileMode {
	dir := filepath.Join(t.TempDir(), "probe")
	require.NoError(t, os.Mkdir(dir, 0o777))
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	return 0o777 &^ fi.Mode().Perm()
}

// TestCopyOnWrite: a cow volume is a copy of its parent's files, modes
// and links (not followed), independent of the parent, with its own
// properties; the answer says the bytes copied.
func TestCopyOnWrite(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"p","strategy":{"type":"empty"},"properties":{"from":"parent"}}`)
	p := s.Path("p")
	require.NoError(t, os.MkdirAll(filepath.Join(p, "d", "deep"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(p, "d", "f"), []byte("hello"), 0o640))
	require.NoError(t, os.WriteFile(filepath.Join(p, "d", "deep", "x"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.Symlink("d/f", filepath.Join(p, "link")))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(p, "out")))
	require.NoError(t, os.MkdirAll(filepath.Join(p, "ro"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(p, "ro", "g"), []byte("read-only"), 0o444))
	require.NoError(t, os.Chmod(filepath.Join(p, "ro"), 0o555))
	t.Cleanup(func() { // so that t.TempDir can go
		_ = os.Chmod(filepath.Join(p, "ro"), 0o755)
		_ = os.Chmod(filepath.Join(s.Path("c"), "ro"), 0o755)
	})

	resp, body := create(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"},"properties":{"own":"1"}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.Equal(t, strconv.Itoa(len("hello")+len("#!/bin/sh\n")+len("read-only")), resp.Header.Get(CopiedBytesHeader))
	var v Volume
	require.NoError(t, json.Unmarshal(body, &v))
	assert.Equal(t, Volume{Handle: "c", Path: s.Path("c"), Properties: map[string]string{"own": "1"}}, v,
		"a parent's properties stay its own")

	c := s.Path("c")
	for name, mode := range map[string]os.FileMode{
		".": os.ModeDir | 0o777, "d": os.ModeDir | 0o750, "d/deep": os.ModeDir | 0o750, "d/f": 0o640,
		"d/deep/x": 0o755, "ro": os.ModeDir | 0o555, "ro/g": 0o444,
	} {
		fi, err := os.Lstat(filepath.Join(c, name))
		require.NoError(t, err, name)
		assert.Equal(t, mode, fi.Mode(), name)
	}
	for name, want := range map[string]string{"d/f": "hello", "d/deep/x": "#!/bin/sh\n", "ro/g": "read-only"} {
		b, err := os.ReadFile(filepath.Join(c, name))
		require.NoError(t, err)
		assert.Equal(t, want, string(b), name)
	}
	for name, target := range map[string]string{"link": "d/f", "out": "/etc/passwd"} {
		got, err := os.Readlink(filepath.Join(c, name))
		require.NoError(t, err, "%s is a link still", name)
		assert.Equal(t, target, got)
	}

	// The copy is the child's own.
	require.NoError(t, os.WriteFile(filepath.Join(c, "d", "f"), []byte("changed"), 0o640))
	require.NoError(t, os.WriteFile(filepath.Join(c, "new"), nil, 0o644))
	b, err := os.ReadFile(filepath.Join(p, "d", "f"))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b))
	assert.NoFileExists(t, filepath.Join(p, "new"))
	assert.Equal(t, map[string]string{"from": "parent"}, lookUp(t, base, "p").Properties)

	// A step's volume, a link, is copied from the folder it links to.
	stepVolume(t, s, "step")
	resp, body = create(t, base, `{"handle":"of-step","strategy":{"type":"cow","volume":"step"}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.Equal(t, "4", resp.Header.Get(CopiedBytesHeader))
	fi, err := os.Lstat(s.Path("of-step"))
	require.NoError(t, err)
	assert.True(t, fi.IsDir(), "a folder, not a link")
	b, err = os.ReadFile(filepath.Join(s.Path("of-step"), "f"))
	require.NoError(t, err)
	assert.Equal(t, "step", string(b))
}

// TestImportRecordsItsPath: an import volume is empty, whatever its path
// names, even a folder of the server's machine; the path is kept.
func TestImportRecordsItsPath(t *testing.T) {
	s, base := start(t)
	local := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(local, "secret"), []byte("host's"), 0o644))
	for i, path := range []string{"k8s-image://docker.io/x:1", local} {
		h := fmt.Sprintf("i%d", i)
		body, _ := json.Marshal(CreateRequest{Handle: h, Strategy: &Strategy{Type: StrategyImport, Path: path}})
		v := made(t, base, string(body))
		assert.Equal(t, Volume{Handle: h, Path: s.Path(h), Properties: map[string]string{}, ImportPath: path}, v)
		assert.Equal(t, v, lookUp(t, base, h))
		entries, err := os.ReadDir(s.Path(h))
		require.NoError(t, err)
		assert.Empty(t, entries, "nothing read from %s", path)
	}
	_, b := do(t, http.MethodGet, base+"/volumes/i0", nil, nil)
	assert.Contains(t, string(b), `"import_path":"k8s-image://docker.io/x:1"`)
	_, b = create(t, base, `{"handle":"e","strategy":{"type":"empty"}}`)
	assert.NotContains(t, string(b), "import_path", "only an import has one")

	// A copy of an import, and a copy of that, import what it imports:
	// the web node runs a base type's image from a copy of its import.
	v := made(t, base, `{"handle":"c0","strategy":{"type":"cow","volume":"i0"}}`)
	assert.Equal(t, "k8s-image://docker.io/x:1", v.ImportPath)
	made(t, base, `{"handle":"c1","strategy":{"type":"cow","volume":"c0"}}`)
	assert.Equal(t, "k8s-image://docker.io/x:1", lookUp(t, base, "c1").ImportPath)
	assert.Empty(t, made(t, base, `{"handle":"c2","strategy":{"type":"cow","volume":"e"}}`).ImportPath)
}

// TestImportOfAVolumeCopiesIt: an import of one of the server's own
// volumes, by the path it answered, is a copy of it (a web node keeps a
// task's cache so), counted as one; the import path is not kept.
func TestImportOfAVolumeCopiesIt(t *testing.T) {
	s, base := start(t)
	src := made(t, base, `{"handle":"cache","strategy":{"type":"empty"}}`)
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("cache"), "seen"), []byte("1\n"), 0o644))
	body, _ := json.Marshal(CreateRequest{Handle: "kept", Strategy: &Strategy{Type: StrategyImport, Path: src.Path}})
	resp, b := create(t, base, string(body))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	assert.Equal(t, "2", resp.Header.Get(CopiedBytesHeader))
	assert.Equal(t, Volume{Handle: "kept", Path: s.Path("kept"), Properties: map[string]string{}}, lookUp(t, base, "kept"))
	got, err := os.ReadFile(filepath.Join(s.Path("kept"), "seen"))
	require.NoError(t, err)
	assert.Equal(t, "1\n", string(got))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("cache"), "seen"), []byte("changed"), 0o644))
	got, _ = os.ReadFile(filepath.Join(s.Path("kept"), "seen"))
	assert.Equal(t, "1\n", string(got), "a copy, not the same files")

	body, _ = json.Marshal(CreateRequest{Handle: "gone", Strategy: &Strategy{Type: StrategyImport, Path: s.Path("missing")}})
	resp, b = create(t, base, string(body))
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), `parent volume \"missing\" not found`)
}

func TestList(t *testing.T) {
	s, base := start(t)
	resp, body := do(t, http.MethodGet, base+"/volumes", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "[]", string(body), "no volumes yet: an empty array")

	made(t, base, `{"handle":"b","strategy":{"type":"empty"},"properties":{"kind":"cache","team":"2"}}`)
	made(t, base, `{"handle":"a","strategy":{"type":"empty"},"properties":{"kind":"cache","team":"1"}}`)
	volume(t, base, "c")
	stepVolume(t, s, "d")
	// The server's own temporary folders are not volumes.
	require.NoError(t, os.Mkdir(filepath.Join(s.root, "volumes", ".stream-in-1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.root, "volumes", "file"), nil, 0o644))
	for _, tc := range []struct {
		query string
		code  int
		want  []string
	}{
		{"", 200, []string{"a", "b", "c", "d"}},
		{"?kind=cache", 200, []string{"a", "b"}},
		{"?kind=cache&team=2", 200, []string{"b"}},
		{"?kind=other", 200, []string{}},
		{"?team=", 200, []string{}},
		{"?team=1&team=2", 422, nil},
	} {
		resp, body := do(t, http.MethodGet, base+"/volumes"+tc.query, nil, nil)
		require.Equal(t, tc.code, resp.StatusCode, "%s: %s", tc.query, body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		if tc.code != http.StatusOK {
			continue
		}
		var got []Volume
		require.NoError(t, json.Unmarshal(body, &got))
		handles := []string{}
		for _, v := range got {
			handles = append(handles, v.Handle)
			assert.NotNil(t, v.Properties, "properties are an object, never null")
			assert.Equal(t, s.Path(v.Handle), v.Path)
		}
		assert.Equal(t, tc.want, handles, tc.query)
		if len(tc.want) == 0 {
			assert.Equal(t, "[]", string(body))
		}
	}
}

// TestMetadataSurvivesARestart: a server started over the same root
// answers the same volumes, and sweeps what a killed one left half done.
func TestMetadataSurvivesARestart(t *testing.T) {
	root := t.TempDir()
	first, base := startIn(t, root)
	made(t, base, `{"handle":"a","strategy":{"type":"empty"},"properties":{"k":"v"},"privileged":true}`)
	made(t, base, `{"handle":"i","strategy":{"type":"import","path":"k8s-image://x"}}`)
	resp, _ := do(t, http.MethodPut, base+"/volumes/i/properties/late", nil, strings.NewReader(`{"value":"yes"}`))
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	before, b := do(t, http.MethodGet, base+"/volumes", nil, nil)
	require.Equal(t, http.StatusOK, before.StatusCode)
	require.NoError(t, first.Kill())
	for _, half := range []string{"volumes/" + creating + "1", "volumes/" + deleting + "2", "meta/.a.json.3"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, half), 0o755))
	}

	_, base = startIn(t, root)
	_, after := do(t, http.MethodGet, base+"/volumes", nil, nil)
	assert.JSONEq(t, string(b), string(after))
	assert.Equal(t, map[string]string{"k": "v"}, lookUp(t, base, "a").Properties)
	assert.True(t, lookUp(t, base, "a").Privileged)
	assert.Equal(t, Volume{Handle: "i", Path: filepath.Join(root, "volumes", "i"),
		Properties: map[string]string{"late": "yes"}, ImportPath: "k8s-image://x"}, lookUp(t, base, "i"))
	for _, dir := range []string{"volumes", "meta"} {
		leftovers, _ := filepath.Glob(filepath.Join(root, dir, ".*"))
		assert.Empty(t, leftovers)
	}
}

func TestDestroy(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"v","strategy":{"type":"empty"},"properties":{"k":"v"}}`)
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("v"), "f"), []byte("x"), 0o644))
	target := stepVolume(t, s, "step")
	for _, h := range []string{"v", "step"} {
		resp, body := do(t, http.MethodDelete, base+"/volumes/"+h, nil, nil)
		assert.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
		_, err := os.Lstat(s.Path(h))
		assert.True(t, os.IsNotExist(err), h)
		assert.NoFileExists(t, s.metaPath(h))
		resp, body = do(t, http.MethodGet, base+"/volumes/"+h, nil, nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		assert.Equal(t, `{"error":"volume \"`+h+`\" not found"}`, string(body))
		resp, body = do(t, http.MethodDelete, base+"/volumes/"+h, nil, nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		assert.Equal(t, `{"error":"volume \"`+h+`\" not found"}`, string(body))
	}
	b, err := os.ReadFile(filepath.Join(target, "f"))
	require.NoError(t, err, "a step's volume is a link: its folder stays")
	assert.Equal(t, "step", string(b))
	leftovers, _ := filepath.Glob(filepath.Join(s.root, "volumes", ".*"))
	assert.Empty(t, leftovers)
	// The handle is free again, with no properties of the old volume.
	assert.Empty(t, made(t, base, `{"handle":"v","strategy":{"type":"empty"}}`).Properties)
}

func TestPropertiesAndPrivileged(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"v","strategy":{"type":"empty"},"properties":{"a":"1"}}`)
	stepVolume(t, s, "step")
	for _, tc := range []struct {
		method, path, body string
		code               int
		answer             string
	}{
		{http.MethodPut, "/volumes/v/properties/b", `{"value":"2"}`, 204, ""},
		{http.MethodPut, "/volumes/v/properties/a", `{"value":"one"}`, 204, ""},
		{http.MethodPut, "/volumes/step/properties/a", `{"value":"s"}`, 204, ""},
		{http.MethodPut, "/volumes/nope/properties/a", `{"value":"1"}`, 404, `{"error":"volume \"nope\" not found"}`},
		{http.MethodPut, "/volumes/v/properties/c", `{"value":`, 400, ""},
		{http.MethodPut, "/volumes/v/properties/c", `{"value":"` + strings.Repeat("v", 64<<10) + `"}`, 400, ""},
		{http.MethodGet, "/volumes/v/privileged", "", 200, "false"},
		{http.MethodPut, "/volumes/v/privileged", `{"value":true}`, 204, ""},
		{http.MethodGet, "/volumes/v/privileged", "", 200, "true"},
		{http.MethodGet, "/volumes/step/privileged", "", 200, "false"},
		{http.MethodPut, "/volumes/v/privileged", `{"value":"yes"}`, 400, ""},
		{http.MethodGet, "/volumes/nope/privileged", "", 404, `{"error":"volume \"nope\" not found"}`},
		{http.MethodPut, "/volumes/nope/privileged", `{"value":true}`, 404, `{"error":"volume \"nope\" not found"}`},
	} {
		resp, body := do(t, tc.method, base+tc.path, nil, strings.NewReader(tc.body))
		assert.Equal(t, tc.code, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		if tc.code != http.StatusNoContent {
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		}
		if tc.answer != "" {
			assert.Equal(t, tc.answer, string(body), "%s %s", tc.method, tc.path)
		}
	}
	_, body := do(t, http.MethodPut, base+"/volumes/v/properties/c", nil, strings.NewReader(`{"value":"`+strings.Repeat("v", 64<<10)+`"}`))
	assert.Contains(t, string(body), "property values of 65540 bytes in all are past the limit of 65536 bytes")
	v := lookUp(t, base, "v")
	assert.Equal(t, map[string]string{"a": "one", "b": "2"}, v.Properties, "a refused change changes nothing")
	assert.True(t, v.Privileged)
	assert.Equal(t, map[string]string{"a": "s"}, lookUp(t, base, "step").Properties)
}

// TestConcurrentChanges: creates of one handle race to one volume;
// changes of different volumes at once are safe (the race detector
// guards it), and none is lost.
func TestConcurrentChanges(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"p","strategy":{"type":"empty"}}`)
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("p"), "f"), []byte("data"), 0o644))
	send := func(method, path, body string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const n = 8
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			codes <- send(http.MethodPost, "/volumes", `{"handle":"same","strategy":{"type":"cow","volume":"p"}}`)
		})
		wg.Go(func() {
			h := fmt.Sprintf("v%d", i)
			if send(http.MethodPost, "/volumes", `{"handle":"`+h+`","strategy":{"type":"empty"}}`) != http.StatusCreated {
				return
			}
			for j := range 10 {
				send(http.MethodPut, "/volumes/"+h+"/properties/p"+strconv.Itoa(j), `{"value":"x"}`)
			}
			send(http.MethodGet, "/volumes", "")
		})
	}
	wg.Wait()
	close(codes)
	counts := map[int]int{}
	for c := range codes {
		counts[c]++
	}
	assert.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusConflict: n - 1}, counts)
	for i := range n {
		assert.Len(t, lookUp(t, base, fmt.Sprintf("v%d", i)).Properties, 10)
	}
}

// TestStreamOutOfOneFile: a path naming a file streams a tar of that file
// alone, named by its base name, as baggageclaim's does: the web node
// reads an image's metadata.json so.
func TestStreamOutOfOneFile(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"img","strategy":{"type":"empty"}}`)
	require.NoError(t, os.MkdirAll(filepath.Join(s.Path("img"), "rootfs", "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("img"), "metadata.json"), []byte(`{"user":"root"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(s.Path("img"), "rootfs", "etc", "os-release"), []byte("ID=test\n"), 0o644))
	for path, want := range map[string][2]string{
		"metadata.json":         {"metadata.json", `{"user":"root"}`},
		"rootfs/etc/os-release": {"os-release", "ID=test\n"},
	} {
		resp, body := do(t, http.MethodPut, base+"/volumes/img/stream-out?path="+path, map[string]string{"Accept-Encoding": "raw"}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		tr := tar.NewReader(bytes.NewReader(body))
		h, err := tr.Next()
		require.NoError(t, err, path)
		assert.Equal(t, want[0], h.Name)
		got, err := io.ReadAll(tr)
		require.NoError(t, err)
		assert.Equal(t, want[1], string(got))
		_, err = tr.Next()
		assert.Equal(t, io.EOF, err, "that file alone")
	}
}

// TestStreamOutNeverFollowsLinksOut: a volume may hold links out of it
// (an image's rootfs; anything a step makes). Stream-out writes them as
// links and never reads through one: a path through a link out of the
// volume is not found, though what the link names exists on the host.
func TestStreamOutNeverFollowsLinksOut(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"img","strategy":{"type":"empty"}}`)
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o644))
	vol := s.Path("img")
	require.NoError(t, os.MkdirAll(filepath.Join(vol, "rootfs", "bin"), 0o755))
	require.NoError(t, os.Symlink("/bin/busybox", filepath.Join(vol, "rootfs", "bin", "sh")))
	require.NoError(t, os.Symlink(outside, filepath.Join(vol, "out")))
	require.NoError(t, os.Symlink("../..", filepath.Join(vol, "up")))

	entries := func(path string) map[string]string {
		resp, body := do(t, http.MethodPut, base+"/volumes/img/stream-out?path="+path, map[string]string{"Accept-Encoding": "raw"}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		got := map[string]string{}
		tr := tar.NewReader(bytes.NewReader(body))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return got
			}
			require.NoError(t, err)
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			got[h.Name] = h.Linkname + string(b)
		}
	}
	assert.Equal(t, map[string]string{"rootfs/": "", "rootfs/bin/": "", "rootfs/bin/sh": "/bin/busybox", "out": outside, "up": "../.."}, entries("."))
	assert.Equal(t, map[string]string{"out": outside}, entries("out"), "the link itself")
	for _, path := range []string{"out/secret", "up/secret", "rootfs/bin/sh/x"} {
		resp, body := do(t, http.MethodPut, base+"/volumes/img/stream-out?path="+path, map[string]string{"Accept-Encoding": "raw"}, nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		assert.NotContains(t, string(body), "host", path)
	}
}

// TestStreamInAtTheRootSlash: fly's uploads stream into a volume at
// path "/", which is the volume's root, as baggageclaim takes it.
func TestStreamInAtTheRootSlash(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"up","strategy":{"type":"empty"}}`)
	resp, body := do(t, http.MethodPut, base+"/volumes/up/stream-in?path=/", map[string]string{"Content-Encoding": "raw"},
		bytes.NewReader(tarsafetest.Tar(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644})))
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	b, err := os.ReadFile(filepath.Join(s.Path("up"), "f"))
	require.NoError(t, err)
	assert.Equal(t, "x", string(b))
	resp, _ = do(t, http.MethodPut, base+"/volumes/up/stream-out?path=/f", map[string]string{"Accept-Encoding": "raw"}, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestStreamInNeverFollowsLinksOut: a step can make links in its own
// volumes; a stream-in at a path through one that leaves the volume (to
// the pod's agent binary, say) is refused, writes nothing there, and
// leaves the volume as it was. A path through a link that stays inside
// lands where the link points; a link at the path itself is replaced.
func TestStreamInNeverFollowsLinksOut(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"v","strategy":{"type":"empty"}}`)
	outside := t.TempDir()
	vol := s.Path("v")
	require.NoError(t, os.Symlink(outside, filepath.Join(vol, "out")))
	require.NoError(t, os.Symlink("../..", filepath.Join(vol, "up")))
	require.NoError(t, os.MkdirAll(filepath.Join(vol, "in", "d"), 0o755))
	require.NoError(t, os.Symlink("in", filepath.Join(vol, "inner")))
	archive := func() io.Reader {
		return bytes.NewReader(tarsafetest.Tar(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}))
	}
	for _, path := range []string{"out/x", "out", "up/x", "out/d/x"} {
		resp, body := do(t, http.MethodPut, base+"/volumes/v/stream-in?path="+path, map[string]string{"Content-Encoding": "raw"}, archive())
		if path == "out" {
			// The link itself is the destination: replaced by the folder.
			require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
			fi, err := os.Lstat(filepath.Join(vol, "out"))
			require.NoError(t, err)
			assert.True(t, fi.IsDir(), "the link at the path is replaced")
			require.NoError(t, os.Remove(filepath.Join(vol, "out", "f")))
			require.NoError(t, os.Remove(filepath.Join(vol, "out")))
			require.NoError(t, os.Symlink(outside, filepath.Join(vol, "out")))
			continue
		}
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", path, body)
		assert.Contains(t, string(body), "link", path)
	}
	left, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, left, "nothing lands outside the volume")
	parent, err := os.ReadDir(filepath.Dir(filepath.Dir(s.Path("v"))))
	require.NoError(t, err)
	for _, e := range parent {
		assert.NotEqual(t, "x", e.Name())
	}
	resp, body := do(t, http.MethodPut, base+"/volumes/v/stream-in?path=inner/d", map[string]string{"Content-Encoding": "raw"}, archive())
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", body)
	assert.FileExists(t, filepath.Join(vol, "in", "d", "f"), "a link inside the volume is followed")
	entries, err := os.ReadDir(vol)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"out", "up", "in", "inner"}, names, "no stream-in's temporary folder is left")
}

// TestCopyOnWriteCarriesFilesAsWritten: a cow copy carries what a
// stream would, through the same extractor: hard links as links, setuid,
// setgid and sticky modes, modification times, numeric owners (with the
// server's Owners), and a FIFO with its Devices; without Devices the copy
// is refused, naming the FIFO, and no volume is made.
func TestCopyOnWriteCarriesFilesAsWritten(t *testing.T) {
	s, base := start(t)
	made(t, base, `{"handle":"p","strategy":{"type":"empty"}}`)
	p := s.Path("p")
	at := func(name string) string { return filepath.Join(p, name) }
	require.NoError(t, os.WriteFile(at("a"), []byte("linked"), 0o644))
	require.NoError(t, os.Link(at("a"), at("hard")))
	require.NoError(t, os.WriteFile(at("suid"), []byte("s"), 0o755))
	require.NoError(t, os.Chmod(at("suid"), 0o755|os.ModeSetuid))
	require.NoError(t, os.Mkdir(at("sticky"), 0o777))
	require.NoError(t, os.Chmod(at("sticky"), 0o777|os.ModeSticky))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	require.NoError(t, os.WriteFile(at("old"), []byte("old"), 0o600))
	require.NoError(t, os.Chtimes(at("old"), old, old))
	// Root gives a file another owner; anyone else keeps its own.
	owner := os.Getuid()
	if owner == 0 {
		owner = 1000
	}
	require.NoError(t, os.Lchown(at("old"), owner, owner))
	require.NoError(t, syscall.Mkfifo(at("fifo"), 0o640))

	resp, body := create(t, base, `{"handle":"refused","strategy":{"type":"cow","volume":"p"}}`)
	assert.GreaterOrEqual(t, resp.StatusCode, 400, "%s", body)
	assert.Contains(t, string(body), `tar entry \"fifo\": a FIFO`, "the entry it refused, and why")
	assert.False(t, s.exists("refused"))

	s.SetLimits(tarsafe.Limits{Owners: true, Devices: true})
	resp, body = create(t, base, `{"handle":"c","strategy":{"type":"cow","volume":"p"}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	c := func(name string) string { return filepath.Join(s.Path("c"), name) }
	var a, hard syscall.Stat_t
	require.NoError(t, syscall.Stat(c("a"), &a))
	require.NoError(t, syscall.Stat(c("hard"), &hard))
	assert.Equal(t, a.Ino, hard.Ino, "a hard link as a link")
	assert.EqualValues(t, 2, a.Nlink)
	for name, mode := range map[string]os.FileMode{"suid": 0o755 | os.ModeSetuid, "sticky": os.ModeDir | 0o777 | os.ModeSticky,
		"old": 0o600, "fifo": os.ModeNamedPipe | 0o640} {
		fi, err := os.Lstat(c(name))
		require.NoError(t, err, name)
		assert.Equal(t, mode, fi.Mode(), name)
	}
	fi, err := os.Lstat(c("old"))
	require.NoError(t, err)
	assert.True(t, old.Equal(fi.ModTime()), "its modification time: %s", fi.ModTime())
	st := fi.Sys().(*syscall.Stat_t)
	assert.EqualValues(t, owner, st.Uid, "its owner")
	assert.EqualValues(t, owner, st.Gid, "its group")
}
