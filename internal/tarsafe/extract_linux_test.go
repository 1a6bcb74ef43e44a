package tarsafe_test

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/internal/tarsafe/tarsafetest"
)

// usernsDirEnv names the folder the test's child extracts into, inside
// its user namespace.
const usernsDirEnv = "TARSAFE_TEST_USERNS_DIR"

// TestExtractInAUserNamespace: where the extractor's user namespace maps
// only the ids 0 to 65535 (a pod's with hostUsers false), an entry whose
// owner or group is past them stays the extractor's and loses setuid and
// setgid; the others keep their owners and modes. The test extracts in a
// child of its own in such a namespace (it runs as root, as the tests
// here do).
func TestExtractInAUserNamespace(t *testing.T) {
	if dir := os.Getenv(usernsDirEnv); dir != "" {
		archive := tarsafetest.Tar(t,
			&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o2750, Uid: 1000, Gid: 70000},
			&tar.Header{Name: "d/theirs", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 70000, Gid: 70000},
			&tar.Header{Name: "mine", Typeflag: tar.TypeReg, Mode: 0o4750, Uid: 1000, Gid: 1001})
		_, err := tarsafe.Extract(bytes.NewReader(archive), dir, tarsafe.Limits{Owners: true})
		require.NoError(t, err)
		return
	}
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestExtractInAUserNamespace$", "-test.count=1")
	child.Env = append(os.Environ(), usernsDirEnv+"="+dir)
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}}
	child.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids}
	out, err := child.CombinedOutput()
	require.NoError(t, err, "the child in its user namespace: %s", out)

	for _, f := range []struct {
		name     string
		mode     os.FileMode
		uid, gid uint32
	}{
		{"d", os.ModeDir | 0o750, 0, 0},
		{"d/theirs", 0o755, 0, 0},
		{"mine", os.ModeSetuid | 0o750, 1000, 1001},
	} {
		fi, err := os.Lstat(filepath.Join(dir, f.name))
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		assert.Equal(t, f.mode, fi.Mode(), f.name)
		assert.Equal(t, []uint32{f.uid, f.gid}, []uint32{st.Uid, st.Gid}, f.name)
	}
}
