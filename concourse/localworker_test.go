package concourse_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/agent"
	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// The round trip of an agent's worker: the gateway's side
// (concourse.Agents, its calls exported for this test in
// export_test.go) against the agent's (agent.LocalWorker), over HTTP as
// the mesh carries it. It lives outside both packages, which import
// only wire of each other's protocol.

// localWorker serves a LocalWorker over dir to callers of kind, and
// returns the gateway's side of it (an agent named "box").
func localWorker(t *testing.T, dir, kind string, stepAgent ...string) *concourse.Agents {
	t.Helper()
	w := &agent.LocalWorker{Dir: dir, StepAgent: stepAgent}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan error, 1)
	go func() { started <- w.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-started)
	})
	h := w.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if kind != "" {
			r = r.WithContext(mesh.WithPeerKind(r.Context(), "gw", kind))
		}
		h.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}
	t.Cleanup(tr.CloseIdleConnections)
	a := &concourse.Agents{Joined: func() []targets.Status { return []targets.Status{{Name: "box"}} }, Client: &http.Client{Transport: tr}}
	// The volume server answers once Start has made it.
	require.Eventually(t, func() bool {
		resp, err := a.Volumes(context.Background(), "box", http.MethodGet, "/volumes", nil, nil, nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 5*time.Second, 10*time.Millisecond)
	return a
}

// TestLocalWorkerContainersAreFolders: a container on an agent is a folder
// whose fs/ has each mount at its path: a link to the volume its source
// names (nested mounts inside the mount they are in, whatever their
// order), an empty folder for a source that is no volume of the agent.
// It is listed, and destroyed with its folder; the volumes stay.
func TestLocalWorkerContainersAreFolders(t *testing.T) {
	dir := t.TempDir()
	a := localWorker(t, dir, mesh.KindGateway)
	ctx := context.Background()
	for _, h := range []string{"build", "input"} {
		resp, err := a.Volumes(ctx, "box", http.MethodPost, "/volumes", nil, http.Header{"Content-Type": {"application/json"}},
			strings.NewReader(`{"handle": "`+h+`", "strategy": {"type": "empty"}}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	vols := filepath.Join(dir, "volumes")
	require.NoError(t, a.MakeContainer(ctx, "box", "c1", []wire.LocalMount{
		{Path: "/tmp/build/x/input", Source: filepath.Join(vols, "input")},
		{Path: "/tmp/build/x", Source: filepath.Join(vols, "build")},
		{Path: "/etc/ssl/certs", Source: "/etc/ssl/certs"},
		{Path: "/scratch", Source: filepath.Join(vols, "..", "volumes", "missing")},
	}))
	fs := filepath.Join(dir, "containers", "c1", "fs")
	link, err := os.Readlink(filepath.Join(fs, "tmp/build/x"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(vols, "build"), link)
	link, err = os.Readlink(filepath.Join(vols, "build", "input"))
	require.NoError(t, err, "the nested mount is in the volume of the mount it is in")
	assert.Equal(t, filepath.Join(vols, "input"), link)
	for _, empty := range []string{"etc/ssl/certs", "scratch"} {
		fi, err := os.Lstat(filepath.Join(fs, empty))
		require.NoError(t, err)
		assert.True(t, fi.IsDir(), "%s: a source that is no volume is an empty folder", empty)
	}

	handles, err := a.Containers(ctx, "box")
	require.NoError(t, err)
	assert.Equal(t, []string{"c1"}, handles)
	require.NoError(t, a.DestroyContainer(ctx, "box", "c1"))
	require.NoError(t, a.DestroyContainer(ctx, "box", "c1"), "gone already: no error")
	assert.NoDirExists(t, filepath.Join(dir, "containers", "c1"))
	assert.DirExists(t, filepath.Join(vols, "input"))
	handles, err = a.Containers(ctx, "box")
	require.NoError(t, err)
	assert.Empty(t, handles)

	err = a.MakeContainer(ctx, "box", "c2", []wire.LocalMount{{Path: "relative", Source: "x"}})
	assert.ErrorContains(t, err, `mount "relative": not an absolute path below /`)
	err = a.MakeContainer(ctx, "box", "../c3", nil)
	assert.Error(t, err)
	assert.NoDirExists(t, filepath.Join(dir, "c3"))
}

// TestLocalWorkerExec: an exec on an agent runs the step agent's command
// in the container's folder, with JETWAY_STEP_ROOT and JETWAY_STEP_FS
// there: stdin in, stdout out, and a non-zero exit a CodeExitError with
// its stderr, as a pod's exec. Only the step agent's run, tail and abort
// of a process are run, and only in a container that is there.
func TestLocalWorkerExec(t *testing.T) {
	dir := t.TempDir()
	script := `cat; echo "root=$` + stepagent.RootEnv + ` fs=$` + stepagent.FSEnv + ` args=$*"; echo said-this >&2; exit 7`
	a := localWorker(t, dir, mesh.KindGateway, "sh", "-c", script, "sh")
	ctx := context.Background()
	require.NoError(t, a.MakeContainer(ctx, "box", "c1", nil))
	exec := a.Exec("box", "c1")
	var out bytes.Buffer
	err := exec(ctx, nil, "", []string{stepagent.BinPath, "tail", "--run", "p1"}, strings.NewReader("stdin-bytes\n"), &out)
	code, ok := stepagent.ExitCode(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, 7, code)
	assert.ErrorContains(t, err, "said-this")
	root := filepath.Join(dir, "containers", "c1")
	assert.Equal(t, "stdin-bytes\nroot="+root+" fs="+filepath.Join(root, "fs")+" args=tail --run p1\n", out.String())

	// A process's stdin may stay open after it ends (the web node's
	// stream): the exec ends with the process, and says it succeeded.
	quick := localWorker(t, t.TempDir(), mesh.KindGateway, "sh", "-c", "echo ended", "sh")
	require.NoError(t, quick.MakeContainer(ctx, "box", "c1", nil))
	stdin, open := io.Pipe()
	defer open.Close()
	out.Reset()
	require.NoError(t, quick.Exec("box", "c1")(ctx, nil, "", []string{stepagent.BinPath, "run", "--run", "p1"}, stdin, &out))
	assert.Equal(t, "ended\n", out.String())

	for _, cmd := range [][]string{
		{stepagent.BinPath, "install", "/x", "--run", "p1"},
		{stepagent.BinPath, "tail"},
		{"sh", "-c", "id"},
	} {
		err := exec(ctx, nil, "", cmd, nil, io.Discard)
		require.Error(t, err, "%q", cmd)
		_, coded := stepagent.ExitCode(err)
		assert.False(t, coded, "%q is refused, not run: %v", cmd, err)
	}
	err = a.Exec("box", "c9")(ctx, nil, "", []string{stepagent.BinPath, "tail", "--run", "p1"}, nil, io.Discard)
	assert.ErrorContains(t, err, "container c9 not found on this agent")
}
