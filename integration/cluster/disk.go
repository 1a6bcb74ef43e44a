package cluster

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"k8s.io/apimachinery/pkg/types"
)

// EmptyDirUsage is what the emptyDir volume of the pod uid takes on the
// real node's disk, counted as the kubelet counts it before it evicts a
// pod past the emptyDir's sizeLimit: the blocks of every file, folder and
// link in it, a file with several links once (k8s.io/kubernetes
// pkg/volume/util/fs.DiskUsage).
func (c *Cluster) EmptyDirUsage(uid types.UID, volume string) (int64, error) {
	if c.node == nil {
		return 0, errors.New("not a real node")
	}
	dir := c.node.path("kubelet", "pods", string(uid), "volumes", "kubernetes.io~empty-dir", volume)
	if _, err := os.Stat(dir); err != nil {
		return 0, err // no such pod or volume on the node: no usage to report
	}
	var n int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p != dir {
			return nil // removed since it was listed
		}
		if err != nil {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Nlink > 1 {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		n += st.Blocks * 512
		return nil
	})
	return n, err
}
