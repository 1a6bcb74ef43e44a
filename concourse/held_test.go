package concourse

import (
	"testing"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"
)

// TestParentOf: the volume a create copies, which is settled first: a
// cow's parent, the volume an import's path is in; none for an empty
// volume, an image's import or a body that is not a create.
func TestParentOf(t *testing.T) {
	for body, want := range map[string]string{
		`{"handle":"c","strategy":{"type":"cow","volume":"p"}}`:                              "p",
		`{"handle":"c","strategy":{"type":"import","path":"/jetway/volumes/volumes/p"}}`:     "p",
		`{"handle":"c","strategy":{"type":"import","path":"k8s-image://docker.io/busybox"}}`: "",
		`{"handle":"c","strategy":{"type":"empty"}}`:                                         "",
		`{"handle":"c"}`: "",
		`not json`:       "",
	} {
		assert.Equal(t, want, parentOf([]byte(body)), body)
	}
}

// TestWrittenBack: what a process writes is the volume's for a writable
// mount, not for a read-only one, /scratch or a mount others are nested
// in (a task's build dir).
func TestWrittenBack(t *testing.T) {
	mounts := []garden.BindMount{
		{SrcPath: "/v/build", DstPath: "/tmp/build/x", Mode: garden.BindMountModeRW},
		{SrcPath: "/v/in", DstPath: "/tmp/build/x/in", Mode: garden.BindMountModeRW},
		{SrcPath: "/v/ro", DstPath: "/tmp/build/x/ro", Mode: garden.BindMountModeRO},
		{SrcPath: "/v/scratch", DstPath: scratchPath, Mode: garden.BindMountModeRW},
		{SrcPath: "/v/xy", DstPath: "/tmp/build/xy", Mode: garden.BindMountModeRW},
	}
	var got []string
	for _, bm := range mounts {
		if writtenBack(mounts, bm) {
			got = append(got, bm.SrcPath)
		}
	}
	assert.Equal(t, []string{"/v/in", "/v/xy"}, got)
}
