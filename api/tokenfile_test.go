package api

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	opsTokens = "tokens:\n- {name: ops, token: admin-token-0123456789, admin: true}\n"
	ciTokens  = opsTokens + "- {name: main-ci, token: main-token-0123456789, team: main}\n"
)

// The tokens file is read again when it changes: a token added works, a
// token removed stops working within two seconds, and a file that does
// not load keeps the last good tokens, reported once.
func TestTokensFollowTheirFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens.yaml")
		require.NoError(t, os.WriteFile(path, []byte(opsTokens), 0o600))
		var srv *Server
		reg := prometheus.NewRegistry()
		f, tokens, err := NewTokenFile(TokenFileOptions{Path: path, Registerer: reg,
			Set: func(tokens []Token) { srv.SetTokens(tokens) }})
		require.NoError(t, err)
		srv = New(Options{Gatherer: reg, Targets: fleet, Tokens: tokens})
		h := srv.Handler()
		status := func(token string) int { return request(t, h, "/api/v1/workers", token).Code }
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { assert.NoError(t, f.Start(ctx)) })
		defer func() { cancel(); wg.Wait() }()

		// The file changes between checks (at whole seconds), never while
		// one reads it.
		time.Sleep(time.Second / 2)
		assert.Equal(t, http.StatusUnauthorized, status("main-token-0123456789"))
		require.NoError(t, os.WriteFile(path, []byte(ciTokens), 0o600))
		time.Sleep(2 * time.Second)
		assert.Equal(t, http.StatusOK, status("main-token-0123456789"), "a token added works")

		require.NoError(t, os.WriteFile(path, []byte("tokens:\n- {name: half"), 0o600))
		time.Sleep(5 * time.Second)
		assert.Equal(t, http.StatusOK, status("main-token-0123456789"), "a broken file keeps the last good tokens")
		assert.Equal(t, 1.0, testutil.ToFloat64(f.loads.WithLabelValues("error")), "reported once")

		require.NoError(t, os.WriteFile(path, []byte(opsTokens), 0o600))
		time.Sleep(2 * time.Second)
		assert.Equal(t, http.StatusUnauthorized, status("main-token-0123456789"), "a token removed stops working")
		assert.Equal(t, http.StatusOK, status("admin-token-0123456789"))
		assert.Equal(t, 2.0, testutil.ToFloat64(f.loads.WithLabelValues("ok")))
	})
}

func TestATokensFileThatDoesNotLoadIsRefusedAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	require.NoError(t, os.WriteFile(path, []byte("tokens:\n- {name: short, token: abc, admin: true}\n"), 0o600))
	_, _, err := NewTokenFile(TokenFileOptions{Path: path, Set: func([]Token) {}})
	assert.ErrorContains(t, err, `tokens[0] ("short"): token must have at least 16 characters`)
	assert.NotContains(t, err.Error(), "abc")
}
