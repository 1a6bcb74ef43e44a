package cluster

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestMounts reads mount points and types from mountinfo lines, escaped
// characters and optional fields included.
func TestMounts(t *testing.T) {
	info := "36 35 98:0 / /sys/fs/cgroup/memory rw,relatime shared:1 - cgroup cgroup rw,memory\n" +
		"37 35 0:31 / /work/x\\040y/node/shm rw master:2 - tmpfs shm rw\n" +
		"38 35 0:32 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n" +
		"garbage\n"
	assert.Equal(t, []mount{
		{point: "/sys/fs/cgroup/memory", fstype: "cgroup"},
		{point: "/work/x y/node/shm", fstype: "tmpfs"},
		{point: "/sys/fs/cgroup/unified", fstype: "cgroup2"},
	}, mounts([]byte(info)))
}
