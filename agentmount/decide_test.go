package agentmount

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/steppod"
)

func TestSupports(t *testing.T) {
	for _, tc := range []struct {
		runtime, kubelet string
		ok               bool
		why              string
	}{
		{"containerd://2.2.9", "v1.36.0", true, ""},
		{"containerd://2.1.0", "v1.36.1", true, ""},
		{"containerd://2.1.4-k3s1", "v1.36.2+k3s1", true, ""},
		{"containerd://v2.1.1", "v1.37.0-eks-1", true, ""},
		{"cri-o://1.31.0", "v1.36.0", true, ""},
		{"cri-o://1.34.2", "v1.36.0", true, ""},
		{"containerd://2.0.5", "v1.36.0", false, `runs containerd://2.0.5`},
		{"containerd://1.7.0", "v1.36.0", false, `runs containerd://1.7.0`},
		{"cri-o://1.30.9", "v1.36.0", false, `runs cri-o://1.30.9`},
		{"docker://27.1.0", "v1.36.0", false, `runs "docker://27.1.0", not containerd or CRI-O`},
		{"", "v1.36.0", false, `runs "", not containerd or CRI-O`},
		{"containerd://", "v1.36.0", false, `runs containerd://`},
		{"containerd://2.2.9", "v1.35.4", false, `runs kubelet "v1.35.4"`},
		{"containerd://2.2.9", "v1.33.0", false, `runs kubelet "v1.33.0"`},
		{"containerd://2.2.9", "", false, `runs kubelet ""`},
		{"containerd://2.2.9", "fake", false, `runs kubelet "fake"`},
	} {
		ok, why := Supports(corev1.NodeSystemInfo{ContainerRuntimeVersion: tc.runtime, KubeletVersion: tc.kubelet})
		assert.Equal(t, tc.ok, ok, "%s, kubelet %s", tc.runtime, tc.kubelet)
		assert.Equal(t, tc.why, why, "%s, kubelet %s", tc.runtime, tc.kubelet)
	}
}

func node(name, runtime, kubelet string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: runtime, KubeletVersion: kubelet}}}
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []corev1.Node
		mount steppod.AgentMount
		why   string
	}{
		{"no nodes", nil, steppod.AgentInitContainer, "no node to run steps on"},
		{"all new", []corev1.Node{node("n1", "containerd://2.2.9", "v1.36.0"), node("n2", "cri-o://1.31.0", "v1.36.0")},
			steppod.AgentImageVolume, "all 2 nodes mount image volumes"},
		{"one old", []corev1.Node{node("n1", "containerd://2.2.9", "v1.36.0"), node("n2", "containerd://1.7.0", "v1.36.0")},
			steppod.AgentInitContainer, "node n2 runs containerd://1.7.0"},
		{"old kubelet", []corev1.Node{node("n1", "containerd://2.2.9", "v1.34.1")},
			steppod.AgentInitContainer, `node n1 runs kubelet "v1.34.1"`},
	} {
		mount, why := Decide(tc.nodes)
		assert.Equal(t, tc.mount, mount, tc.name)
		assert.Equal(t, tc.why, why, tc.name)
	}
}
