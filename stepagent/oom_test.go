package stepagent

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
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
