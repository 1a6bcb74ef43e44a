package cluster

import (
	"errors"

	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/volumes"
)

// EmptyDirUsage is what the emptyDir volume of the pod uid takes on the
// real node's disk, counted as the kubelet counts it before it evicts a
// pod past the emptyDir's sizeLimit (volumes.DiskUsage); an error if the
// node has no such pod or volume.
func (c *Cluster) EmptyDirUsage(uid types.UID, volume string) (int64, error) {
	if c.node == nil {
		return 0, errors.New("not a real node")
	}
	dir, err := c.EmptyDirPath(uid, volume)
	if err != nil {
		return 0, err
	}
	return volumes.DiskUsage(dir)
}

// EmptyDirPath is the folder on the real node's disk that is the emptyDir
// volume of the pod uid (under the kubelet's root dir): what the pod's
// containers write there, the kubelet counts against its sizeLimit.
func (c *Cluster) EmptyDirPath(uid types.UID, volume string) (string, error) {
	if c.node == nil {
		return "", errors.New("not a real node")
	}
	return c.node.path("kubelet", "pods", string(uid), "volumes", "kubernetes.io~empty-dir", volume), nil
}
