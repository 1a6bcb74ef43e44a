package concourse

import (
	"encoding/json"
	"net/http"
)

// The APIs a registered worker serves the web node through its forwards.
// Today jetway makes no container or volume for a web node (running its
// steps is the next step, docs/concourse.md): the TSA's heartbeat lists
// what the worker holds, and the answer is true: nothing. Every other
// call is refused, saying so.

// gardenAPI serves the Garden API the TSA's heartbeat uses.
func gardenAPI() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /containers", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string][]string{"handles": {}})
	})
	mux.HandleFunc("/", notYet)
	return mux
}

// volumeAPI serves the volume (baggageclaim) API the TSA's heartbeat uses.
func volumeAPI() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, []any{})
	})
	mux.HandleFunc("/", notYet)
	return mux
}

func notYet(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusNotImplemented, map[string]string{
		"error": "jetway does not run a Concourse web node's containers or volumes yet: " + r.Method + " " + r.URL.Path})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
