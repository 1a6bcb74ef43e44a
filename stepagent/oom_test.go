package stepagent

import (
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOOMKills reads the OOM killer's count of a container's memory
// cgroup as cgroup v2 and v1 show it, and 0 where neither is.
func TestOOMKills(t *testing.T) {
	v2 := fstest.MapFS{"memory.events": {Data: []byte("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")}}
	v1 := fstest.MapFS{"memory/memory.oom_control": {Data: []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")}}
	old := fstest.MapFS{"memory/memory.oom_control": {Data: []byte("oom_kill_disable 0\nunder_oom 0\n")}}
	assert.Equal(t, int64(2), oomKills(v2))
	assert.Equal(t, int64(5), oomKills(v1))
	assert.Zero(t, oomKills(old), "a kernel before 4.13 does not count")
	assert.Zero(t, oomKills(fstest.MapFS{}), "no cgroup to read")
}

// TestASupervisorKilledAtTheMemoryLimitIsOOMKilled: a step whose
// supervisor died is lost, unless the kernel killed in its container at
// the memory limit since the step's process started (the supervisor may
// be its choice): then OOMKilled, 137.
func TestASupervisorKilledAtTheMemoryLimitIsOOMKilled(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "run"), 0o755))
	require.NoError(t, os.WriteFile(Path(root, StartedFile), []byte(`{"pid": 7, "at": "2026-11-26T05:00:00Z", "oom_kills": 1}`), 0o644))
	saved := cgroupFS
	defer func() { cgroupFS = saved }()

	cgroupFS = fstest.MapFS{"memory.events": {Data: []byte("oom_kill 1\n")}}
	assert.Equal(t, lostStatus, lost(root), "no kill since the start")

	cgroupFS = fstest.MapFS{"memory.events": {Data: []byte("oom_kill 2\n")}}
	st := lost(root)
	assert.Equal(t, ReasonOOMKilled, st.Reason)
	assert.Equal(t, 137, st.ExitStatus)
	assert.Contains(t, st.Message, "memory limit")
}
