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
	return volumes.DiskUsage(c.node.path("kubelet", "pods", string(uid), "volumes", "kubernetes.io~empty-dir", volume))
}
