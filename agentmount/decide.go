package agentmount

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/jetway-ci/jetway/steppod"
)

// The oldest releases that mount an image volume: the runtimes that
// implement it (containerd 2.1, CRI-O 1.31) and the kubelet where
// ImageVolume is on without a feature gate (GA in Kubernetes 1.36). A
// kubelet of 1.33-1.35 with the gate on is not told from one without it
// by its node status, so it counts as not supporting it (force
// image-volume there).
var (
	minRuntime = map[string]*version.Version{
		"containerd": version.MustParseGeneric("2.1"),
		"cri-o":      version.MustParseGeneric("1.31"),
	}
	minKubelet = version.MustParseGeneric("1.36")
)

// Supports reports whether a node reporting info mounts image volumes,
// and if not, why (naming what it runs).
func Supports(info corev1.NodeSystemInfo) (bool, string) {
	rt := info.ContainerRuntimeVersion
	name, ver, ok := strings.Cut(rt, "://")
	min, known := minRuntime[name]
	if !ok || !known {
		return false, fmt.Sprintf("runs %q, not containerd or CRI-O", rt)
	}
	v, err := version.ParseGeneric(ver)
	if err != nil || !v.AtLeast(min) {
		return false, "runs " + rt
	}
	kv, err := version.ParseGeneric(info.KubeletVersion)
	if err != nil || !kv.AtLeast(minKubelet) {
		return false, fmt.Sprintf("runs kubelet %q", info.KubeletVersion)
	}
	return true, ""
}

// Decide is the mount for step pods that may land on nodes, and why: an
// image volume only when there is a node and each supports it.
func Decide(nodes []corev1.Node) (steppod.AgentMount, string) {
	if len(nodes) == 0 {
		return steppod.AgentInitContainer, "no node to run steps on"
	}
	for i := range nodes {
		if ok, why := Supports(nodes[i].Status.NodeInfo); !ok {
			return steppod.AgentInitContainer, "node " + nodes[i].Name + " " + why
		}
	}
	return steppod.AgentImageVolume, fmt.Sprintf("all %d nodes mount image volumes", len(nodes))
}
