package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/stepagent"
)

// TestStepVolumesServeOnlyTheAgent: a step's volume server listens on
// loopback, where any user of the machine reaches it; without the token
// the agent made for it, a call gets 401 and reads nothing, while the
// agent's own streams work.
func TestStepVolumesServeOnlyTheAgent(t *testing.T) {
	s := &step{root: t.TempDir()}
	vol, err := s.serveVolumes()
	require.NoError(t, err)
	defer vol.Kill()
	require.NoError(t, os.MkdirAll(filepath.Join(s.root, stepagent.VolumesDir, "output-out"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(s.root, stepagent.VolumesDir, "output-out", "secret"), []byte("team a's"), 0o644))

	for _, auth := range []string{"", "Bearer guessed"} {
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d/volumes/output-out/stream-out", vol.Port()), nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		assert.NotContains(t, string(body), "team a's")
	}
	out, err := s.openVolume(context.Background(), "output-out", "", "raw")
	require.NoError(t, err)
	tarball, err := io.ReadAll(out)
	out.Close()
	require.NoError(t, err)
	assert.Contains(t, string(tarball), "team a's", "the agent's own stream-out")
}
