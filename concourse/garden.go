package concourse

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"code.cloudfoundry.org/garden"
	"code.cloudfoundry.org/garden/transport"

	"github.com/jetway-ci/jetway/internal/httpjson"
	"github.com/jetway-ci/jetway/stepagent"
)

// The Garden API of a registered worker, as the web node calls it
// (../shared/CONCOURSE-WORKER.md): containers are made, listed, looked up,
// given properties and destroyed, and their processes run, attached to
// and stopped (Containers, processes.go). Errors are Garden's shape,
// {"Type", "Message", ...}, which the web node's client reads.

// maxContainerSpec bounds a Create's body.
const maxContainerSpec = 1 << 20

// gardenAPI serves the Garden API of target's worker: its containers are
// cs's; without cs (no state namespace, so no pod), the list is what
// Holdings hold and every other call is refused, saying why.
func gardenAPI(target string, h Holdings, cs *Containers, m *Metrics) http.Handler {
	g := &gardenServer{target: target, h: h, cs: cs, m: m, streams: map[string]*processStreams{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { httpjson.Write(w, http.StatusOK, struct{}{}) })
	mux.HandleFunc("GET /containers", g.list)
	if cs == nil {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			gardenError(w, fmt.Errorf("jetway does not run a Concourse web node's containers without a state namespace (docs/concourse.md): %s %s", r.Method, r.URL.Path))
		})
		return mux
	}
	mux.HandleFunc("POST /containers", g.create)
	mux.HandleFunc("DELETE /containers/{handle}", g.destroy)
	mux.HandleFunc("GET /containers/{handle}/properties", g.properties)
	mux.HandleFunc("GET /containers/{handle}/properties/{key}", g.property)
	mux.HandleFunc("PUT /containers/{handle}/properties/{key}", g.setProperty)
	mux.HandleFunc("DELETE /containers/{handle}/properties/{key}", g.removeProperty)
	mux.HandleFunc("PUT /containers/{handle}/grace_time", g.graceTime)
	mux.HandleFunc("GET /containers/{handle}/info", g.info)
	mux.HandleFunc("GET /containers/bulk_info", g.bulkInfo)
	mux.HandleFunc("GET /containers/{handle}/limits/{kind}", g.limits)
	mux.HandleFunc("GET /containers/{handle}/processes/{pid}", g.attach)
	mux.HandleFunc("POST /containers/{handle}/processes", g.run)
	mux.HandleFunc("GET /containers/{handle}/processes/{pid}/attaches/{stream}/stdout", g.output(stdoutStream))
	mux.HandleFunc("GET /containers/{handle}/processes/{pid}/attaches/{stream}/stderr", g.output(stderrStream))
	mux.HandleFunc("PUT /containers/{handle}/stop", g.stop)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		g.m.gardenCall("refused", errRefusedCall)
		gardenError(w, fmt.Errorf("jetway's workers do not serve Garden's %s %s: a web node never calls it "+
			"(docs/concourse.md, \"Garden's calls\")", r.Method, r.URL.Path))
	})
	return mux
}

// errRefusedCall counts a Garden call jetway does not serve.
var errRefusedCall = errors.New("refused")

// API serves the Garden API of target's worker.
func (c *Containers) API(target string) http.Handler { return gardenAPI(target, nil, c, c.Metrics) }

type gardenServer struct {
	target string
	h      Holdings
	cs     *Containers
	m      *Metrics

	mu      sync.Mutex
	streams map[string]*processStreams // by stream ID
}

// list answers the handles of the worker's containers whose properties
// include the query's (a name and a value each).
func (g *gardenServer) list(w http.ResponseWriter, r *http.Request) {
	filter := garden.Properties{}
	for k, vs := range r.URL.Query() {
		if len(vs) > 0 {
			filter[k] = vs[0]
		}
	}
	var handles []string
	var err error
	if g.cs != nil {
		handles, err = g.cs.List(r.Context(), g.target, filter)
	} else if handles, err = g.h.Containers(r.Context(), g.target); len(filter) > 0 {
		handles = nil // no properties are kept without a state namespace
	}
	g.m.gardenCall("list", err)
	if err != nil {
		gardenError(w, garden.NewServiceUnavailableError(err.Error()))
		return
	}
	httpjson.Write(w, http.StatusOK, struct{ Handles []string }{nonNil(handles)})
}

func (g *gardenServer) create(w http.ResponseWriter, r *http.Request) {
	var spec garden.ContainerSpec
	if !readJSON(w, r, &spec, maxContainerSpec) {
		return
	}
	c, err := g.cs.Create(r.Context(), g.target, spec)
	g.m.gardenCall("create", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, struct{ Handle string }{c.Handle()})
}

func (g *gardenServer) destroy(w http.ResponseWriter, r *http.Request) {
	err := g.cs.Destroy(r.Context(), g.target, r.PathValue("handle"))
	g.m.gardenCall("destroy", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, struct{}{})
}

func (g *gardenServer) properties(w http.ResponseWriter, r *http.Request) {
	c, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	g.m.gardenCall("properties", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, c.Properties())
}

func (g *gardenServer) property(w http.ResponseWriter, r *http.Request) {
	c, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	key := r.PathValue("key")
	if err == nil {
		if _, ok := c.properties[key]; !ok {
			err = fmt.Errorf("%w: %s", ErrPropertyNotFound, key)
		}
	}
	g.m.gardenCall("property", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, map[string]string{"value": c.properties[key]})
}

func (g *gardenServer) setProperty(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Value string `json:"value"`
	}
	if !readJSON(w, r, &req, maxRecordData) {
		return
	}
	err := g.cs.SetProperty(r.Context(), g.target, r.PathValue("handle"), r.PathValue("key"), req.Value)
	g.m.gardenCall("set-property", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, struct{}{})
}

func (g *gardenServer) removeProperty(w http.ResponseWriter, r *http.Request) {
	err := g.cs.RemoveProperty(r.Context(), g.target, r.PathValue("handle"), r.PathValue("key"))
	g.m.gardenCall("remove-property", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, struct{}{})
}

// info answers a container's Garden info (Containers.Info).
func (g *gardenServer) info(w http.ResponseWriter, r *http.Request) {
	info, err := g.cs.Info(r.Context(), g.target, r.PathValue("handle"))
	g.m.gardenCall("info", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, info)
}

// maxBulkInfo bounds the handles of one bulk info.
const maxBulkInfo = 1000

// bulkInfo answers the info of each of the comma-separated handles, or
// its error, as Garden's server does.
func (g *gardenServer) bulkInfo(w http.ResponseWriter, r *http.Request) {
	handles := strings.FieldsFunc(r.URL.Query().Get("handles"), func(c rune) bool { return c == ',' })
	if len(handles) > maxBulkInfo {
		gardenError(w, fmt.Errorf("bulk info of %d containers: jetway answers at most %d at once", len(handles), maxBulkInfo))
		return
	}
	out := make(map[string]garden.ContainerInfoEntry, len(handles))
	for _, h := range handles {
		info, err := g.cs.Info(r.Context(), g.target, h)
		entry := garden.ContainerInfoEntry{Info: info}
		if err != nil {
			var notFound garden.ContainerNotFoundError
			if errors.As(err, &notFound) {
				err = notFound
			}
			entry.Err = &garden.Error{Err: err}
		}
		out[h] = entry
	}
	g.m.gardenCall("bulk-info", nil)
	httpjson.Write(w, http.StatusOK, out)
}

// limits answers one kind of a container's limits (bandwidth, cpu, disk,
// memory) as Create was given them, as Garden's server does.
func (g *gardenServer) limits(w http.ResponseWriter, r *http.Request) {
	c, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	g.m.gardenCall("limits", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	l := c.Spec.Limits
	switch kind := r.PathValue("kind"); kind {
	case "bandwidth":
		httpjson.Write(w, http.StatusOK, l.Bandwidth)
	case "cpu":
		httpjson.Write(w, http.StatusOK, l.CPU)
	case "disk":
		httpjson.Write(w, http.StatusOK, l.Disk)
	case "memory":
		httpjson.Write(w, http.StatusOK, l.Memory)
	default:
		gardenError(w, fmt.Errorf("Garden has no %q limits: bandwidth, cpu, disk or memory", kind))
	}
}

// graceTime is taken and has no effect: jetway never destroys a
// container on its own; the web node destroys what it no longer needs.
func (g *gardenServer) graceTime(w http.ResponseWriter, r *http.Request) {
	_, err := g.cs.Lookup(r.Context(), g.target, r.PathValue("handle"))
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, struct{}{})
}

func (g *gardenServer) run(w http.ResponseWriter, r *http.Request) {
	var spec garden.ProcessSpec
	if !readJSON(w, r, &spec, maxContainerSpec) {
		return
	}
	p, err := g.cs.Run(r.Context(), g.target, r.PathValue("handle"), spec)
	g.m.gardenCall("run", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	g.serveProcess(w, r, p, http.StatusCreated)
}

func (g *gardenServer) attach(w http.ResponseWriter, r *http.Request) {
	p, err := g.cs.Attach(r.Context(), g.target, r.PathValue("handle"), r.PathValue("pid"))
	g.m.gardenCall("attach", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	g.serveProcess(w, r, p, http.StatusOK)
}

func (g *gardenServer) stop(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Kill bool `json:"kill"`
	}
	if !readJSON(w, r, &req, 4096) {
		return
	}
	err := g.cs.Stop(r.Context(), g.target, r.PathValue("handle"), req.Kill)
	g.m.gardenCall("stop", err)
	if err != nil {
		gardenError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, struct{}{})
}

// Garden's process protocol: the Run (or Attach) connection is hijacked;
// the server writes the process's ID and a stream ID, the client opens the
// process's stdout and stderr by that stream ID (two more hijacked
// connections) and sends stdin, window sizes and signals on the first;
// the server writes the exit status there when the process ends.

// streamAttach bounds the wait for the client to open the process's
// output streams: the process starts once they are open (its output is
// not buffered meanwhile).
const streamAttach = 10 * time.Second

type streamKind int

const (
	stdoutStream streamKind = iota
	stderrStream
)

// processStreams are the output connections of one served process.
type processStreams struct {
	conns [2]chan net.Conn // opened by the client, each at most once
	done  chan struct{}    // the process's output is all written
}

// serveProcess answers a Run or Attach of p with Garden's protocol and
// follows the process until it ends or the client goes (the process goes
// on: Attach finds it again).
func (g *gardenServer) serveProcess(w http.ResponseWriter, r *http.Request, p *Process, code int) {
	defer g.cs.following()()
	streamID := strings.ToLower(rand.Text())
	ps := &processStreams{conns: [2]chan net.Conn{make(chan net.Conn, 1), make(chan net.Conn, 1)}, done: make(chan struct{})}
	g.mu.Lock()
	g.streams[streamID] = ps
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.streams, streamID)
		g.mu.Unlock()
		close(ps.done)
	}()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	conn, br, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	var wmu sync.Mutex // the exit status and the stream's first message
	send := func(v any) error {
		wmu.Lock()
		defer wmu.Unlock()
		return json.NewEncoder(conn).Encode(v)
	}
	// The client's messages: stdin, window sizes, signals. Its connection closing
	// ends the following (not the process).
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	stdinR, stdinW := io.Pipe()
	var wg sync.WaitGroup
	defer func() {
		cancel()
		conn.Close() // ends the reader below
		stdinW.Close()
		wg.Wait()
	}()
	if err := send(transport.ProcessPayload{ProcessID: p.ID, StreamID: streamID}); err != nil {
		return
	}
	wg.Go(func() {
		defer cancel()
		err := readMessages(br.Reader, maxProcessMessage, func(msg transport.ProcessPayload) error {
			switch {
			case msg.Source != nil && msg.Data != nil:
				if p.tap != nil {
					p.tap.write([]byte(*msg.Data))
				}
				return writeStdin(stdinW, stepagent.KindStdin, []byte(*msg.Data))
			case msg.Source != nil:
				_ = writeStdin(stdinW, stepagent.KindStdinEnd, nil)
			case msg.TTY != nil && msg.TTY.WindowSize != nil:
				size, _ := json.Marshal(terminal(msg.TTY))
				return stepagent.WriteFrame(stdinW, stepagent.KindWindow, size)
			case msg.Signal != nil:
				// Abort outlives the connection that asked for it.
				wg.Go(func() {
					actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), holderCall)
					defer acancel()
					_ = p.run.Abort(actx)
				})
			}
			return nil
		})
		if errors.Is(err, errMessageTooLarge) {
			g.m.oversizedMessage()
			g.cs.logger().Warn("garden process message past its cap: the client's connection is closed, the process goes on",
				"target", g.target, "process", p.ID, "cap", maxProcessMessage)
		}
		stdinW.CloseWithError(errors.New("the web node's connection closed"))
	})
	var outs [2]io.Writer
	for i := range outs {
		outs[i] = io.Discard
		select {
		case c := <-ps.conns[i]:
			outs[i] = c
		case <-time.After(streamAttach):
		case <-ctx.Done():
			return
		}
	}
	status, err := p.Follow(ctx, stdinR, outs[stdoutStream], outs[stderrStream])
	for _, o := range outs {
		if c, ok := o.(net.Conn); ok {
			c.Close()
		}
	}
	if ctx.Err() != nil {
		return // the client went
	}
	if err != nil {
		msg := processError(err)
		_ = send(transport.ProcessPayload{ProcessID: p.ID, Error: &msg})
		return
	}
	_ = send(transport.ProcessPayload{ProcessID: p.ID, ExitStatus: &status})
}

// processError is a process's failure as the web node gets it, final:
// its Garden client takes an error whose words end in "EOF" for a
// dropped connection and attaches again (retryableProcess.Wait in
// Concourse v8.2.5's atc/worker/gardenruntime/gclient), which would
// follow the process and copy its volumes out again, without end (issue
// 41: a cut stream-out, 74 tries in 90 s). jetway's answer never ends so.
func processError(err error) string {
	msg := err.Error()
	if strings.HasSuffix(msg, "EOF") {
		msg += " (jetway does not try again)"
	}
	return msg
}

// maxProcessMessage bounds one message a client sends on a process's
// connection (stdin, a window size, a signal). Garden's client writes
// each as one JSON line, and a web node sends a resource script's whole
// stdin, its request (source, params, version), in one: Concourse
// v8.2.5's atc/resource passes the request as a bytes.Buffer, which
// io.Copy writes at once. 8 MiB is far past any sane request; a message
// past it ends the client's connection, as if the client went.
const maxProcessMessage = 8 << 20

var errMessageTooLarge = fmt.Errorf("a message on a process's connection is past %d bytes", maxProcessMessage)

// readMessages reads a process connection's messages, each one line of
// JSON of at most limit bytes, and hands each to handle, until r or handle
// fails: errMessageTooLarge once a line goes past limit, having read at
// most limit bytes of it.
func readMessages(r *bufio.Reader, limit int, handle func(transport.ProcessPayload) error) error {
	var line []byte
	for {
		line = line[:0]
		var err error
		for {
			var frag []byte
			frag, err = r.ReadSlice('\n')
			if len(line)+len(frag) > limit {
				return errMessageTooLarge
			}
			line = append(line, frag...)
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var msg transport.ProcessPayload
			if jerr := json.Unmarshal(line, &msg); jerr != nil {
				return fmt.Errorf("a message on a process's connection: %w", jerr)
			}
			if herr := handle(msg); herr != nil {
				return herr
			}
		}
		if err != nil {
			return err
		}
		if cap(line) > 64<<10 {
			line = nil // a large message's buffer goes with it
		}
	}
}

// writeStdin writes stdin for the agent (steppod.RunIn.Follow): chunks of
// at most stepagent.MaxPayload, in frames of kind.
func writeStdin(w io.Writer, kind byte, b []byte) error {
	for {
		n := min(len(b), stepagent.MaxPayload)
		if err := stepagent.WriteFrame(w, kind, b[:n]); err != nil {
			return err
		}
		b = b[n:]
		if len(b) == 0 {
			return nil
		}
	}
}

// output serves one output stream of a process the client runs or
// attaches: the connection is hijacked and handed to the process.
func (g *gardenServer) output(kind streamKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		ps := g.streams[r.PathValue("stream")]
		g.mu.Unlock()
		if ps == nil {
			gardenError(w, garden.ProcessNotFoundError{ProcessID: r.PathValue("pid")})
			return
		}
		w.WriteHeader(http.StatusOK)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		select {
		case ps.conns[kind] <- conn:
		default:
			conn.Close() // opened twice
			return
		}
		<-ps.done
		select {
		case c := <-ps.conns[kind]:
			c.Close() // opened after the process stopped waiting for it
		default:
		}
	}
}

// gardenError answers err as Garden's server does: 404 for an unknown
// container or process, else 500, with its type for the client to rebuild.
func gardenError(w http.ResponseWriter, err error) {
	var notFound garden.ContainerNotFoundError
	if errors.As(err, &notFound) {
		err = notFound
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = garden.NewServiceUnavailableError(err.Error())
	}
	ge := &garden.Error{Err: err}
	httpjson.Write(w, ge.StatusCode(), ge)
}

// readJSON decodes r's body of at most limit bytes into v, or answers 400
// naming what is wrong.
func readJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		gardenError(w, fmt.Errorf("read the request: %w", err))
	case int64(len(b)) > limit:
		gardenError(w, fmt.Errorf("the request is over %d bytes", limit))
	default:
		if err := json.Unmarshal(b, v); err != nil {
			gardenError(w, fmt.Errorf("the request is not the JSON of Garden's %s %s: %w", r.Method, r.URL.Path, err))
			return false
		}
		return true
	}
	return false
}
