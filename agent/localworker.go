package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/internal/capped"
	"github.com/jetway-ci/jetway/internal/httpjson"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// An agent's machine is a worker to the web node as Concourse's Houdini
// is on a Mac: its containers are folders, not images. The agent serves
// the gateway it joined (and no one else: mesh peers of kind gateway),
// under wire.LocalWorkerPath (the calls, as the gateway makes them, are
// written down there):
//
//   - volumes/...: the web node's volumes, kept by the volume server jetway
//     runs everywhere (package volumes) over <dir>/volumes, on a loopback
//     port with a token only this process holds;
//   - containers: a container is <dir>/containers/<handle>, whose fs/
//     stands in for its filesystem: each bind mount a link at its path
//     to the volume it names (nested mounts inside), as the kwok test
//     nodes stand in for a pod's mounts;
//   - containers/<handle>/exec: one step agent command (run, tail, abort)
//     in the container's folder, as pods/exec runs it in a pod: its stdin
//     the request's body, its stdout the answer's, its exit code and
//     stderr in the answer's trailers. A process is a run of the step agent
//     there (JETWAY_STEP_FS=fs/), so it outlives a dropped call, a gateway
//     restart and an agent restart, as in a pod.
//
// The image is not used: processes run on the agent's machine, as its
// user, with what is installed there.

// execCommands are the step agent's commands a gateway runs on an agent.
var execCommands = []string{"run", "tail", "abort"}

// maxCreate bounds the body of a container's make, as the gateway bounds
// a volume's.
const maxCreate = 1 << 20

// LocalWorker is, on an agent, the web node's worker the agent is.
type LocalWorker struct {
	// Dir holds the volumes and containers (the agent's
	// <work-dir>/concourse).
	Dir string
	// StepAgent is the step agent's command line: this binary and its
	// hidden step-agent command.
	StepAgent []string
	// Extract bounds what one archive streamed into a volume may write.
	Extract tarsafe.Limits
	Logger  *slog.Logger

	mu    sync.Mutex
	vols  *volumes.Server // nil until started
	proxy *httputil.ReverseProxy
}

// Start serves the volumes until ctx ends.
func (w *LocalWorker) Start(ctx context.Context) error {
	for _, d := range []string{"volumes", "containers"} {
		if err := os.MkdirAll(filepath.Join(w.Dir, d), 0o700); err != nil {
			return fmt.Errorf("the web node's worker: %w", err)
		}
	}
	// A container half made when the agent stopped is made again, if
	// ever, from the start.
	half, _ := filepath.Glob(filepath.Join(w.Dir, "containers", makingPrefix+"*"))
	for _, dir := range half {
		_ = os.RemoveAll(dir)
	}
	token := rand.Text() + rand.Text()
	vols, err := volumes.Start(w.Dir, ownership.TokenHash(token))
	if err != nil {
		return fmt.Errorf("the web node's worker: serve its volumes: %w", err)
	}
	vols.SetLimits(w.Extract)
	to := &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(vols.Port())}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(to)
			r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, strings.TrimSuffix(wire.LocalWorkerPath, "/"))
			r.Out.URL.RawPath = ""
			r.Out.Header.Set("Authorization", "Bearer "+token)
		},
		FlushInterval: -1, // a stream-out's bytes as they come
		ErrorHandler: func(rw http.ResponseWriter, _ *http.Request, err error) {
			httpjson.Write(rw, http.StatusBadGateway, httpjson.Error(fmt.Errorf("the agent's volume server: %w", err)))
		},
	}
	w.mu.Lock()
	w.vols, w.proxy = vols, proxy
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	w.vols, w.proxy = nil, nil
	w.mu.Unlock()
	return vols.Kill()
}

// Handler serves the gateways' calls; anyone else gets 404.
func (w *LocalWorker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(wire.LocalWorkerPath+"volumes", w.volumes)
	mux.HandleFunc(wire.LocalWorkerPath+"volumes/", w.volumes)
	mux.HandleFunc("GET "+wire.LocalWorkerPath+"containers", w.list)
	mux.HandleFunc("PUT "+wire.LocalWorkerPath+"containers/{handle}", w.create)
	mux.HandleFunc("DELETE "+wire.LocalWorkerPath+"containers/{handle}", w.destroy)
	mux.HandleFunc("POST "+wire.LocalWorkerPath+"containers/{handle}/exec", w.execute)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if mesh.PeerKind(r.Context()) != mesh.KindGateway {
			http.NotFound(rw, r)
			return
		}
		mux.ServeHTTP(rw, r)
	})
}

func (w *LocalWorker) volumes(rw http.ResponseWriter, r *http.Request) {
	w.mu.Lock()
	proxy := w.proxy
	w.mu.Unlock()
	if proxy == nil {
		httpjson.Write(rw, http.StatusServiceUnavailable, map[string]string{"error": "the agent is not serving volumes (starting or stopping)"})
		return
	}
	proxy.ServeHTTP(rw, r)
}

// containerDir is handle's folder, or an error for a handle that is none.
func (w *LocalWorker) containerDir(handle string) (string, error) {
	if !wire.IsContainerHandle(handle) {
		return "", fmt.Errorf("container handle %q: not a handle jetway takes", handle)
	}
	return filepath.Join(w.Dir, "containers", handle), nil
}

// makingPrefix names a container's folder while it is made: no handle
// starts with a dot.
const makingPrefix = ".making-"

// containerFS is the folder of a container's folder standing in for its
// filesystem.
const containerFS = "fs"

func (w *LocalWorker) list(rw http.ResponseWriter, _ *http.Request) {
	entries, err := os.ReadDir(filepath.Join(w.Dir, "containers"))
	if err != nil {
		httpjson.Write(rw, http.StatusInternalServerError, httpjson.Error(err))
		return
	}
	handles := []string{}
	for _, e := range entries {
		if e.IsDir() && wire.IsContainerHandle(e.Name()) {
			handles = append(handles, e.Name())
		}
	}
	httpjson.Write(rw, http.StatusOK, handles)
}

// create makes a container's folder: each mount a link to its volume, or
// an empty folder, shallowest first so that a nested mount lands in the
// volume of the mount it is in. Made again, a container is made anew.
func (w *LocalWorker) create(rw http.ResponseWriter, r *http.Request) {
	dir, err := w.containerDir(r.PathValue("handle"))
	if err != nil {
		httpjson.Write(rw, http.StatusBadRequest, httpjson.Error(err))
		return
	}
	var req wire.LocalContainer
	dec := json.NewDecoder(http.MaxBytesReader(rw, r.Body, maxCreate))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpjson.Write(rw, http.StatusBadRequest, map[string]string{"error": `body must be {"mounts": [{"path", "source"}]}: ` + err.Error()})
		return
	}
	for _, m := range req.Mounts {
		if !path.IsAbs(m.Path) || path.Clean(m.Path) == "/" {
			httpjson.Write(rw, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("mount %q: not an absolute path below /", m.Path)})
			return
		}
	}
	slices.SortStableFunc(req.Mounts, func(a, b wire.LocalMount) int {
		return strings.Count(path.Clean(a.Path), "/") - strings.Count(path.Clean(b.Path), "/")
	})
	tmp := filepath.Join(filepath.Dir(dir), makingPrefix+filepath.Base(dir))
	_ = os.RemoveAll(tmp)
	if err := w.makeContainer(tmp, req.Mounts); err != nil {
		_ = os.RemoveAll(tmp)
		httpjson.Write(rw, http.StatusInternalServerError, httpjson.Error(err))
		return
	}
	if err := w.removeContainer(dir); err != nil {
		httpjson.Write(rw, http.StatusInternalServerError, httpjson.Error(err))
		return
	}
	if err := os.Rename(tmp, dir); err != nil {
		httpjson.Write(rw, http.StatusInternalServerError, httpjson.Error(err))
		return
	}
	rw.WriteHeader(http.StatusNoContent)
}

// makeContainer makes a container's folder at dir.
func (w *LocalWorker) makeContainer(dir string, mounts []wire.LocalMount) error {
	fs := filepath.Join(dir, containerFS)
	if err := os.MkdirAll(fs, 0o755); err != nil {
		return err
	}
	for _, m := range mounts {
		at := filepath.Join(fs, filepath.FromSlash(path.Clean(m.Path)))
		if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", m.Path, err)
		}
		if vol := w.volume(m.Source); vol != "" {
			if err := os.Symlink(vol, at); err != nil {
				return fmt.Errorf("mount %s: %w", m.Path, err)
			}
			continue
		}
		if err := os.MkdirAll(at, 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", m.Path, err)
		}
	}
	return nil
}

// volume is the folder of the volume at src, the path the volume server
// gives it; "" if src is no volume of this agent.
func (w *LocalWorker) volume(src string) string {
	handle := filepath.Base(src)
	want := filepath.Join(w.Dir, "volumes", handle)
	if filepath.Clean(src) != want || !volumeHandle(handle) {
		return ""
	}
	if fi, err := os.Stat(want); err != nil || !fi.IsDir() {
		return ""
	}
	return want
}

// volumeHandle reports whether h can name a volume's folder.
func volumeHandle(h string) bool {
	return h != "" && h != "." && h != ".." && !strings.ContainsAny(h, `/\`)
}

func (w *LocalWorker) destroy(rw http.ResponseWriter, r *http.Request) {
	dir, err := w.containerDir(r.PathValue("handle"))
	if err != nil {
		httpjson.Write(rw, http.StatusBadRequest, httpjson.Error(err))
		return
	}
	if err := w.removeContainer(dir); err != nil {
		httpjson.Write(rw, http.StatusInternalServerError, httpjson.Error(err))
		return
	}
	rw.WriteHeader(http.StatusNoContent)
}

// removeContainer kills what still runs in a container's folder (the
// process groups of its runs' processes, which end their supervisors)
// and removes the folder; the volumes its mounts link to stay.
func (w *LocalWorker) removeContainer(dir string) error {
	runs, _ := os.ReadDir(filepath.Join(dir, stepagent.RunsDir))
	for _, run := range runs {
		root := filepath.Join(dir, stepagent.RunsDir, run.Name())
		if _, ended, _ := stepagent.ReadStatus(root); ended {
			continue
		}
		b, err := os.ReadFile(stepagent.Path(root, stepagent.StartedFile))
		var st stepagent.Started
		if err != nil || json.Unmarshal(b, &st) != nil || st.PID <= 1 {
			continue
		}
		if err := syscall.Kill(-st.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			w.logger().Warn("kill a destroyed container's process", "dir", dir, "pid", st.PID, "error", err.Error())
		}
	}
	return os.RemoveAll(dir)
}

// execStderrLimit bounds the stderr an exec sends back.
const execStderrLimit = 4 << 10

// execute runs one step agent command in a container's folder.
func (w *LocalWorker) execute(rw http.ResponseWriter, r *http.Request) {
	dir, err := w.containerDir(r.PathValue("handle"))
	if err != nil {
		httpjson.Write(rw, http.StatusBadRequest, httpjson.Error(err))
		return
	}
	args := r.URL.Query()[wire.LocalExecArg]
	if len(args) == 0 || !slices.Contains(execCommands, args[0]) || !slices.Contains(args, "--run") {
		httpjson.Write(rw, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("exec %q: an agent runs the step agent's %v of a process (--run ID) only", args, execCommands)})
		return
	}
	if fi, err := os.Stat(filepath.Join(dir, containerFS)); err != nil || !fi.IsDir() {
		httpjson.Write(rw, http.StatusNotFound, map[string]string{"error": "container " + r.PathValue("handle") + " not found on this agent"})
		return
	}
	// The answer streams while the body does: a process's stdin.
	_ = http.NewResponseController(rw).EnableFullDuplex()
	cmd := exec.CommandContext(r.Context(), w.StepAgent[0], append(slices.Clone(w.StepAgent[1:]), args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), stepagent.RootEnv+"="+dir, stepagent.FSEnv+"="+filepath.Join(dir, containerFS))
	stderr := &capped.Buffer{Limit: execStderrLimit}
	cmd.Stderr = stderr
	cmd.Stdout = flushWriter{rw}
	cmd.WaitDelay = time.Second
	rw.Header().Set("Trailer", wire.TrailerExitCode+", "+wire.TrailerExecStderr)
	rw.Header().Set("Content-Type", "application/octet-stream")
	rw.WriteHeader(http.StatusOK)
	// The body is copied by a goroutine of this handler's, not the
	// command's: a process's stdin (the web node's stream) may stay open
	// after it ended, and the command's own copy would hold its Wait
	// until then. This one ends when the call does.
	stdin, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err == nil {
		go func() {
			_, _ = io.Copy(stdin, r.Body)
			_ = stdin.Close()
		}()
		err = cmd.Wait()
	}
	code := 0
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	case err != nil:
		code = -1
		_, _ = stderr.Write([]byte(err.Error()))
	}
	rw.Header().Set(wire.TrailerExitCode, strconv.Itoa(code))
	rw.Header().Set(wire.TrailerExecStderr, strings.ToValidUTF8(strings.Join(strings.Fields(stderr.String()), " "), "?"))
}

// flushWriter sends each write at once.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = http.NewResponseController(f.w).Flush()
	}
	return n, err
}

func (w *LocalWorker) logger() *slog.Logger {
	if w.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return w.Logger
}
