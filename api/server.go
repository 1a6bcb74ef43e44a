// Package api serves jetway over HTTP: the Concourse worker API that fly
// reads, jetway's own API, Prometheus metrics and the health probes.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/steps"
)

// Options configure a Server.
type Options struct {
	// Listen is the TCP address to serve on; ignored when Listener is set.
	Listen string
	// Listener, if set, is served instead of listening on Listen (tests).
	Listener net.Listener
	// ConcourseVersion and WorkerVersion are reported by /api/v1/info.
	ConcourseVersion string
	WorkerVersion    string
	// Gatherer backs /metrics.
	Gatherer prometheus.Gatherer
	// Targets backs the worker and target endpoints.
	Targets Targets
	// Lifecycle backs land, retire, prune and sync.
	Lifecycle Lifecycle
	// Streams backs POST /api/v1/streams.
	Streams Streamer
	// Steps backs /api/v1/steps.
	Steps Steps
	// Placement configures POST /api/v1/placements, served with Targets.
	Placement        steps.PlacementOptions
	PlacementMetrics *PlacementMetrics
	// Mesh, if set, lists every gateway's targets and carries calls on
	// targets other gateways own to them.
	Mesh Mesh
	// Concourse, if set, says each target's registration with a Concourse
	// web node.
	Concourse interface {
		Registration(name string) (concourse.Registration, bool)
	}
	// Tokens are the accepted bearer tokens; NoAuth serves without any.
	Tokens []Token
	NoAuth bool
	// Ready, if set, must report true for /readyz to answer 200.
	Ready func() bool
	// ShutdownTimeout bounds draining in-flight requests once ctx ends.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
}

// Server is the gateway's HTTP server.
type Server struct {
	opts    Options
	tokens  atomic.Pointer[tokenSet] // opts.Tokens, until SetTokens
	handler http.Handler
	ready   atomic.Bool
	addr    atomic.Pointer[net.Addr]
	// draining is closed when the drain begins: requests that only
	// follow (step events, which a client resumes from where it was) end
	// then instead of holding the drain to its deadline.
	draining  chan struct{}
	drainOnce sync.Once
	// stepPlaces remembers where the mesh's other gateways run steps.
	stepPlaces stepPlaces
}

// New builds a Server; Start runs it.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, draining: make(chan struct{})}
	s.SetTokens(opts.Tokens)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/v1/info", s.info)
	if opts.Targets != nil {
		mux.HandleFunc("GET /api/v1/workers", s.authenticate(s.listWorkers))
		mux.HandleFunc("GET /api/v1/targets", s.authenticate(s.listTargets))
		mux.HandleFunc("GET /api/v1/targets/{name}", s.authenticate(s.forwardable(s.getTarget)))
		mux.HandleFunc("POST /api/v1/placements", s.authenticate(s.place))
	}
	if opts.Targets != nil && opts.Lifecycle != nil {
		mux.HandleFunc("PUT /api/v1/workers/{name}/land", s.authenticate(s.forwardable(s.workerAction(opts.Targets.Get, opts.Lifecycle.Land))))
		mux.HandleFunc("PUT /api/v1/workers/{name}/retire", s.authenticate(s.forwardable(s.workerAction(opts.Targets.Get, opts.Lifecycle.Retire))))
		mux.HandleFunc("PUT /api/v1/workers/{name}/prune", s.authenticate(s.pruneLost(s.forwardable(s.prune))))
		mux.HandleFunc("PUT /api/v1/targets/{name}/resume", s.authenticate(s.forwardable(s.workerAction(opts.Targets.Find, opts.Lifecycle.Resume))))
		mux.HandleFunc("PUT /api/v1/targets/{name}/sync", s.authenticate(s.forwardable(s.syncTarget)))
	}
	if opts.Targets != nil && opts.Streams != nil {
		mux.HandleFunc("POST /api/v1/streams", s.authenticate(s.createStream))
		mux.HandleFunc("PUT "+meshStreamOutPath, s.authenticate(s.streamOut))
	}
	if opts.Steps != nil {
		mux.HandleFunc("POST /api/v1/steps", s.authenticate(s.submitAnywhere))
		mux.HandleFunc("GET /api/v1/steps/{handle}", s.authenticate(s.stepForwardable(s.getStep)))
		mux.HandleFunc("GET /api/v1/steps/{handle}/events", s.authenticate(s.stepForwardable(s.stepEvents)))
		mux.HandleFunc("DELETE /api/v1/steps/{handle}", s.authenticate(s.stepForwardable(s.abortStep)))
		mux.HandleFunc("PUT /api/v1/steps/{handle}/inputs/{name}", s.authenticate(s.stepForwardable(s.uploadInput)))
		mux.HandleFunc("GET /api/v1/steps/{handle}/outputs/{name}", s.authenticate(s.stepForwardable(s.downloadOutput)))
	}
	s.handler = s.fromAgents(mux)
	return s
}

// Handler returns the server's routes, for in-process tests.
func (s *Server) Handler() http.Handler { return s.handler }

// Addr returns the address the server listens on, or nil before Start has
// bound it.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// Start serves until ctx ends, then stops accepting connections and
// drains: requests in flight run to their end for at most ShutdownTimeout.
// Their contexts are not ctx but end only at that deadline, when the
// requests still running are cancelled and their connections closed;
// Start then returns an error counting them.
func (s *Server) Start(ctx context.Context) error {
	ln := s.opts.Listener
	if ln == nil {
		var err error
		var lc net.ListenConfig
		if ln, err = lc.Listen(ctx, "tcp", s.opts.Listen); err != nil {
			return fmt.Errorf("listen %s: %w", s.opts.Listen, err)
		}
	}
	addr := ln.Addr()
	s.addr.Store(&addr)
	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRequests()
	var inflight requests
	srv := &http.Server{
		Handler:           inflight.track(s.handler),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.ready.Store(true)
	s.opts.Logger.Info("serving http", "addr", addr.String())

	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	s.ready.Store(false)
	s.Drain()
	err := s.drain(srv, &inflight, cancelRequests)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("shut down http server: %w", err)
	}
	return nil
}

// Drain ends at once the requests that only follow (step events), which
// their clients resume from where they were: what Start does as its drain
// begins, for a server whose handler another server serves (an agent's,
// the mesh's) to call as that one stops.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// drain stops srv accepting and waits for its requests for at most
// ShutdownTimeout; then it cancels those left, closes their connections
// and waits for their handlers to return.
func (s *Server) drain(srv *http.Server, inflight *requests, cancelRequests context.CancelFunc) error {
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	n, idle := inflight.running()
	cancelRequests()
	_ = srv.Close() // unblocks handlers writing to clients that stopped reading
	<-idle
	if n == 0 { // only connections that never finished a request's headers
		return nil
	}
	return fmt.Errorf("cancelled %d request(s) still running after %s", n, s.opts.ShutdownTimeout)
}

// requests counts the handlers running, so a drain cut short can say how
// many it cancelled and wait for them to return (http.Server.Close does
// not wait).
type requests struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; see running
}

func (r *requests) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		if r.n == 0 {
			r.idle = make(chan struct{})
		}
		r.n++
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			if r.n--; r.n == 0 {
				close(r.idle)
			}
			r.mu.Unlock()
		}()
		next.ServeHTTP(w, req)
	})
}

// running returns how many handlers run and a channel closed once none do.
func (r *requests) running() (int, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		closed := make(chan struct{})
		close(closed)
		return 0, closed
	}
	return r.n, r.idle
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() || (s.opts.Ready != nil && !s.opts.Ready()) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// infoResponse is Concourse's /api/v1/info body (atc.Info), the keys fly reads.
type infoResponse struct {
	Version       string `json:"version"`
	WorkerVersion string `json:"worker_version"`
}

func (s *Server) info(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, infoResponse{Version: s.opts.ConcourseVersion, WorkerVersion: s.opts.WorkerVersion})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // messages are read by people and fly, not browsers
	_ = enc.Encode(v)
}
