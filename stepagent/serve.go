package stepagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Frame kinds of a sandbox session (Serve): requests in, muxed logs out.
const (
	// KindRequest starts a run: a JSON Request, then its spec and inputs
	// bytes as they follow.
	KindRequest byte = 0x10
	// KindPing keeps the session alive (empty).
	KindPing byte = 0x11
	// KindMux carries a chunk of a run's log: one byte of run name
	// length, the name, then the chunk (frames, cut anywhere).
	KindMux byte = 0x12
	// KindRunError says a run could not start: name length, name, message.
	KindRunError byte = 0x13
)

// Request is a KindRequest's JSON.
type Request struct {
	Run         string `json:"run"`
	SpecBytes   int    `json:"spec_bytes"`
	InputsBytes int    `json:"inputs_bytes"`
}

// ServeIdle is how long a session waits for its next frame (a request or
// a ping) before it ends: a kubelet may never close an exec's stdin, so
// silence is how a session learns its gateway went.
const ServeIdle = time.Minute

// Serve runs a sandbox session on in and out: each request prepares and
// starts a run in its own folder (as `run --run NAME` does) and streams
// its log as TailFrom writes it from the start (a position frame, the
// log's frames, the trailer), muxed with the others' as KindMux chunks.
// It ends when in ends, is silent for ServeIdle, or out fails; runs it
// started go on under their supervisors, and tail finds them.
func Serve(root string, in io.Reader, out io.Writer) error {
	w := &muxOut{out: out}
	got := make(chan request)
	readErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() { // ends with in: at EOF, or when the exec goes
		for {
			f, err := ReadFrame(in)
			var req request
			if err == nil && f.Kind == KindRequest {
				req, err = readRequest(in, f.Payload)
			}
			if err != nil {
				readErr <- err
				return
			}
			select {
			case got <- req:
			case <-done:
				return
			}
		}
	}()
	var runs sync.WaitGroup
	defer runs.Wait()
	idle := time.NewTimer(ServeIdle)
	defer idle.Stop()
	for {
		select {
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-idle.C:
			return fmt.Errorf("no request or ping for %s: the gateway went", ServeIdle)
		case req := <-got:
			idle.Reset(ServeIdle)
			if err := w.failed(); err != nil {
				return err
			}
			if req.Run != "" { // not a ping
				runs.Go(func() { w.run(root, req) })
			}
		}
	}
}

// request is a read KindRequest; a ping is the zero request.
type request struct {
	Request
	spec, inputs []byte
}

func readRequest(in io.Reader, payload []byte) (request, error) {
	var req request
	if err := json.Unmarshal(payload, &req.Request); err != nil {
		return req, fmt.Errorf("request: %w", err)
	}
	if req.Run == "" {
		return req, errors.New("request: no run name")
	}
	var err error
	if req.spec, err = readExactly(in, req.SpecBytes); err != nil {
		return req, err
	}
	req.inputs, err = readExactly(in, req.InputsBytes)
	return req, err
}

// muxOut writes the runs' chunks to the session's out, one at a time.
type muxOut struct {
	mu  sync.Mutex
	out io.Writer
	err error
}

func (w *muxOut) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *muxOut) send(kind byte, run string, b []byte) error {
	head := append([]byte{byte(len(run))}, run...)
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.err == nil {
		n := min(len(b), MaxPayload-len(head))
		w.err = WriteFrame(w.out, kind, append(head[:len(head):len(head)], b[:n]...))
		b = b[n:]
		if len(b) == 0 {
			break
		}
	}
	return w.err
}

// run prepares, starts and tails one run, its log going out as chunks.
func (w *muxOut) run(root string, req request) {
	if len(req.Run) > 255 {
		_ = w.send(KindRunError, req.Run[:255], []byte("run name too long"))
		return
	}
	err := func() error {
		runRoot, err := RunRoot(root, req.Run)
		if err != nil {
			return err
		}
		if err := Prepare(runRoot, req.spec); err != nil {
			return err
		}
		if err := startHere(runRoot, req.inputs); err != nil {
			return err
		}
		return TailFrom(context.Background(), runRoot, TailOptions{}, runWriter{w, req.Run})
	}()
	if err != nil && w.failed() == nil {
		_ = w.send(KindRunError, req.Run, []byte(err.Error()))
	}
}

// runWriter writes one run's log to the session.
type runWriter struct {
	w   *muxOut
	run string
}

// Write sends p as one or more of the run's KindMux chunks.
func (r runWriter) Write(p []byte) (int, error) {
	if err := r.w.send(KindMux, r.run, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// A sandbox pod's sessions are served by one daemon of the agent, which
// outlives the execs that reach it: a session's exec only relays its
// stdin and stdout to the daemon's socket (Connect). When an exec drops,
// the runs it started go on under the daemon, and tail finds them.
const (
	SocketFile = "serve.sock" // the daemon's unix socket, under the root
	DaemonLock = "serve.lock" // flock held by the daemon, with its pid
)

// Connect relays in and out to the pod's session daemon, starting it if
// none runs, until either side ends.
func Connect(root string, in io.Reader, out io.Writer) error {
	conn, err := dialDaemon(root)
	if err != nil {
		return err
	}
	defer conn.Close()
	go func() {
		_, _ = io.Copy(conn, in)
		_ = conn.(*net.UnixConn).CloseWrite()
	}()
	_, err = io.Copy(out, conn)
	return err
}

// socketPath is the daemon's socket, relative when the working dir is
// the root: a unix socket's path has ~100 bytes at most.
func socketPath(root string) string {
	if wd, err := os.Getwd(); err == nil && wd == filepath.Clean(root) {
		return SocketFile
	}
	return Path(root, SocketFile)
}

func dialDaemon(root string) (net.Conn, error) {
	sock := socketPath(root)
	if c, err := net.Dial("unix", sock); err == nil {
		return c, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append(slices.Clone(SelfArgs), "serve-daemon")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), RootEnv+"="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the session daemon: %w", err)
	}
	_ = cmd.Process.Release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the session daemon does not answer: %w", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Daemon serves sessions on the root's socket for the pod's life. A
// second daemon finds the lock held and leaves at once.
func Daemon(root string) error {
	lock, err := os.OpenFile(Path(root, DaemonLock), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if free, err := tryLock(lock); err != nil || !free {
		return err
	}
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	setSubreaper()
	sock := socketPath(root)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer ln.Close()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			_ = Serve(root, conn, conn)
		}()
	}
}
