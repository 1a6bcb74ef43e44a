package concourse

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/integration/cluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWebNode: the web node answers, fly is logged in to team main, no
// worker is registered, and Stop leaves nothing behind.
func TestWebNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), StartupTimeout)
	defer cancel()
	began := time.Now()
	w, err := Start(ctx, Options{})
	require.NoError(t, err)
	t.Logf("Start took %v", time.Since(began).Round(time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			w.Stop()
		}
	})

	out, err := w.Fly("status")
	require.NoError(t, err, out)
	assert.Contains(t, out, "logged in successfully")
	teams, err := w.Fly("teams")
	require.NoError(t, err)
	assert.Contains(t, teams, Team)
	assert.Empty(t, w.Workers(t))
	for _, path := range []string{w.TSAPublicKey, w.WorkerKey, w.WorkerPublicKey} {
		assert.FileExists(t, path)
	}

	web, pg := w.web, w.pg.proc
	began = time.Now()
	w.Stop()
	stopped = true
	t.Logf("Stop took %v", time.Since(began).Round(time.Millisecond))
	assert.True(t, web.exited() && pg.exited())
	_, err = os.Stat(filepath.Join(w.pg.socketDir, ".s.PGSQL."+pgPort))
	assert.ErrorIs(t, err, os.ErrNotExist, "PostgreSQL's socket")
	if os.Getenv(cluster.EnvKeep) != "1" {
		assert.NoDirExists(t, w.Dir)
	}
}
