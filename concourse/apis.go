package concourse

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/jetway-ci/jetway/internal/httpjson"
)

// The volume API a registered worker serves without a Holder (no state
// namespace): the volumes Holdings hold, and nothing else. The Garden API
// is garden.go's; the Holder's volume API is volumes.go's.

// volumeAPI serves the volume (baggageclaim) API of target's worker.
func volumeAPI(target string, h Holdings) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, r *http.Request) {
		handles, err := h.Volumes(r.Context(), target)
		if err != nil {
			httpjson.Write(w, http.StatusServiceUnavailable, httpjson.Error(err))
			return
		}
		volumes := make([]map[string]any, 0, len(handles))
		for _, handle := range handles {
			volumes = append(volumes, map[string]any{"handle": handle, "path": "", "properties": map[string]string{}})
		}
		httpjson.Write(w, http.StatusOK, volumes)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusNotImplemented, map[string]string{"error": "jetway keeps no volumes for a Concourse web node " +
			"without a state namespace (docs/concourse.md): " + r.Method + " " + r.URL.Path})
	})
	return mux
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// none holds nothing.
type none struct{}

func (none) Containers(context.Context, string) ([]string, error)   { return nil, nil }
func (none) Volumes(context.Context, string) ([]string, error)      { return nil, nil }
func (none) DestroyContainer(context.Context, string, string) error { return ErrNotOurs }
func (none) DestroyVolume(context.Context, string, string) error    { return ErrNotOurs }
func (none) Release(context.Context, string) error                  { return nil }

// logCalls logs each call h answers at debug level: the API, method,
// path (handles, no bodies), status and time taken (for a hijacked
// process stream, until it ended; for an answer cut, until it was).
func logCalls(log *slog.Logger, api string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !log.Enabled(r.Context(), slog.LevelDebug) {
			h.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() { // also for an answer cut (http.ErrAbortHandler)
			log.Debug("web node call", "api", api, "method", r.Method, "path", r.URL.Path, "status", sw.status,
				"took", time.Since(start).Round(time.Microsecond))
		}()
		h.ServeHTTP(sw, r)
	})
}

// statusWriter keeps the status written; Unwrap lets a handler hijack the
// connection through it (http.ResponseController).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
