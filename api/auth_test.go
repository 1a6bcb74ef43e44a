package api

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
)

// TestTokenComparisonHidesLength checks that a token is compared as a
// fixed-size digest: comparing raw values would return at once on a length
// mismatch and so tell an attacker how long each token is.
func TestTokenComparisonHidesLength(t *testing.T) {
	var lengths [][2]int
	orig := constantTimeCompare
	constantTimeCompare = func(x, y []byte) int {
		lengths = append(lengths, [2]int{len(x), len(y)})
		return orig(x, y)
	}
	defer func() { constantTimeCompare = orig }()

	h := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet, Tokens: tokens}).Handler()
	for given, code := range map[string]int{"x": 401, "main-token-0123456789": 200, "a-much-longer-guess-than-any-token-here": 401} {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer "+given)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		assert.Equal(t, code, rec.Code, given)
	}
	assert.Len(t, lengths, 3*len(tokens), "every token is compared, whichever matches")
	for _, l := range lengths {
		assert.Equal(t, [2]int{32, 32}, l)
	}
}
