// Package httpjson writes the JSON answers of the worker APIs jetway
// serves to a Concourse web node: the gateway's (package concourse) and
// an agent's local worker (package agent), which the gateway relays.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Write answers with status code and v as JSON.
func Write(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Error is err as the body baggageclaim and Garden answer a failure with:
// {"error": "..."}.
func Error(err error) map[string]string { return map[string]string{"error": err.Error()} }
