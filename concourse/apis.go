package concourse

import (
	"context"
	"encoding/json"
	"net/http"
)

// The APIs a registered worker serves the web node through its forwards.
// jetway does not run a web node's containers yet (docs/concourse.md):
// Garden's list answers what jetway holds for the worker (Holdings), and
// every other Garden call is refused, saying so. The volume API is the
// Holder's (volumes.go); without one, volumeAPI lists none.

// gardenAPI serves the Garden API of target's worker.
func gardenAPI(target string, h Holdings) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /containers", func(w http.ResponseWriter, r *http.Request) {
		handles, err := h.Containers(r.Context(), target)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		if r.URL.RawQuery != "" {
			// A filter by properties: jetway keeps none yet, so none match.
			handles = nil
		}
		writeJSON(w, http.StatusOK, map[string][]string{"handles": nonNil(handles)})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// Garden's clients read an error as {"Type", "Message"}.
		writeJSON(w, http.StatusInternalServerError, map[string]string{"Type": "", "Message": notYetMessage(r)})
	})
	return mux
}

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
	mux.HandleFunc("/", notYet)
	return mux
}

func notYet(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusNotImplemented, map[string]string{"error": notYetMessage(r)})
}

func notYetMessage(r *http.Request) string {
	return "jetway does not run a Concourse web node's containers yet (docs/concourse.md): " + r.Method + " " + r.URL.Path
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
