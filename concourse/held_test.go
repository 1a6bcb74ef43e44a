package concourse

import (
	"testing"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/volumes"
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
// mount, a mount others are nested in too (an output with an input under
// it, or a task's build dir), not for a read-only one or /scratch.
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
		if writtenBack(bm) {
			got = append(got, bm.SrcPath)
		}
	}
	assert.Equal(t, []string{"/v/build", "/v/in", "/v/xy"}, got)
}

// TestSettlingOf: the copy made to settle a volume names the volume.
func TestSettlingOf(t *testing.T) {
	for handle, want := range map[string]string{"v-settle-ABCDEFGH": "v", "a-settle-b-settle-XY": "a-settle-b", "v": "", "-settle-x": ""} {
		of, ok := settlingOf(handle)
		assert.Equal(t, want, of, handle)
		assert.Equal(t, want != "", ok, handle)
	}
}

// TestTheSweepLeavesOutCopiesBeingSettled: a copy made to settle a
// held volume is not reported (the web node would destroy it mid-copy,
// as it did to a 1 GiB output's in the artifact benchmark); one left
// over once its volume is settled, or gone, is.
func TestTheSweepLeavesOutCopiesBeingSettled(t *testing.T) {
	held := &volumes.Held{Pod: "p", UID: "u", Mount: "m0"}
	vols := []volumes.Volume{
		{Handle: "a", Held: held}, {Handle: "a-settle-AAAAAAAA"},
		{Handle: "b"}, {Handle: "b-settle-BBBBBBBB"},
		{Handle: "gone-settle-CCCCCCCC"},
	}
	var got []string
	for _, v := range reportable(vols) {
		got = append(got, v.Handle)
	}
	assert.Equal(t, []string{"a", "b", "b-settle-BBBBBBBB", "gone-settle-CCCCCCCC"}, got)
}

// TestHeldPath: a bind mount's source is a holder's volume under the
// step root, and under the root before it (/jetway), which volumes a
// holder made before an upgrade still report; not the volumes folder
// itself nor a path elsewhere.
func TestHeldPath(t *testing.T) {
	for src, want := range map[string]bool{
		"/tmp/jetway/volumes/abc":  true,
		"/jetway/volumes/abc":      true,
		"/tmp/jetway/volumes":      false,
		"/jetway/volumes/":         false,
		"/tmp/jetway/build/abc":    false,
		"/var/lib/volumes/abc":     false,
		"/tmp/jetway/volumesx/abc": false,
	} {
		assert.Equal(t, want, heldPath(src), src)
	}
}
