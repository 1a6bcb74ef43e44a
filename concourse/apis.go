package concourse

import (
	"context"
	"encoding/json"
	"net/http"
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
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		volumes := make([]map[string]any, 0, len(handles))
		for _, handle := range handles {
			volumes = append(volumes, map[string]any{"handle": handle, "path": "", "properties": map[string]string{}})
		}
		writeJSON(w, http.StatusOK, volumes)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "jetway keeps no volumes for a Concourse web node " +
			"without a state namespace (docs/concourse.md): " + r.Method + " " + r.URL.Path})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
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
