package steps

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

func TestBuildPod(t *testing.T) {
	cfg := &targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"}, Meta: targets.Metadata{
		Namespace: "ci", NodeSelector: map[string]string{"pool": "ci"},
		Tolerations:      []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists}},
		ImagePullSecrets: []string{"registry"},
	}}
	tgt, err := targets.NewTarget(cfg, "prod")
	require.NoError(t, err)
	req := validRequest()
	req.Team, req.Resources, req.Timeout = "main", Resources{CPU: "500m", Memory: "1Gi"}, "1h"
	req.Run.Env = map[string]string{"SECRET": "hunter2"}
	req.Stdin = "also secret"
	req.Outputs = []Output{{Name: "out", Path: "out"}}
	require.Nil(t, req.Validate())
	sum := summaryOf(req, false, time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))

	key, err := ownership.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	p := buildPod(&sum, "gw-a", tgt, Placed{Target: "east", Pod: PodName("main", "build-1")}, PodOptions{AgentImage: "reg/step-agent:1", Installation: "prod", Key: key})

	assert.Equal(t, "ci", p.Namespace)
	assert.Equal(t, map[string]string{
		"org.concourse-ci.worker": "east", "jetway-ci.dev/installation": "prod", "jetway-ci.dev/step-type": "task",
		"jetway-ci.dev/team": "main", "jetway-ci.dev/step": "build-1", "jetway-ci.dev/owner": "gw-a"}, p.Labels)
	assert.Equal(t, map[string]string{ownership.SealAnnotation: key.Seal("east", p.Name, "main")}, p.Annotations,
		"what a restarted gateway needs is in the step's record; the pod has only jetway's seal")
	assert.True(t, key.Sealed("east", p))
	token := key.Token("east", p.Name)
	spec, _ := json.Marshal(p)
	assert.NotContains(t, string(spec), token, "the sidecar's token is nowhere in the pod")
	assert.Equal(t, map[string]string{"pool": "ci"}, p.Spec.NodeSelector)
	assert.Equal(t, cfg.Meta.Tolerations, p.Spec.Tolerations)
	assert.Equal(t, []corev1.LocalObjectReference{{Name: "registry"}}, p.Spec.ImagePullSecrets)
	assert.False(t, *p.Spec.AutomountServiceAccountToken)
	assert.Equal(t, corev1.RestartPolicyNever, p.Spec.RestartPolicy)

	require.Len(t, p.Spec.InitContainers, 1)
	assert.Equal(t, "reg/step-agent:1", p.Spec.InitContainers[0].Image)
	require.Len(t, p.Spec.Containers, 2)
	step, side := p.Spec.Containers[0], p.Spec.Containers[1]
	assert.Equal(t, "busybox", step.Image)
	assert.Equal(t, []string{"/jetway/bin/step-agent", "pid1"}, step.Command)
	assert.Equal(t, resource.MustParse("500m"), step.Resources.Limits[corev1.ResourceCPU])
	assert.Equal(t, resource.MustParse("1Gi"), step.Resources.Requests[corev1.ResourceMemory])
	assert.False(t, *step.SecurityContext.Privileged)
	assert.False(t, *step.SecurityContext.AllowPrivilegeEscalation)
	assert.Equal(t, int32(7788), side.Ports[0].ContainerPort)
	assert.Contains(t, side.Env, corev1.EnvVar{Name: stepagent.TokenHashEnv, Value: ownership.TokenHash(token)},
		"the sidecar holds the hash of its token")
	assert.Equal(t, "/jetway", side.WorkingDir, "the step's log is read through it once the step's container ended")
	assert.True(t, *side.SecurityContext.RunAsNonRoot)
	assert.Equal(t, []string{"/step-agent", "volumes", "--listen", ":7788"}, side.Command, "the agent's own extract limits")
	limited := buildPod(&sum, "gw-a", tgt, Placed{Target: "east", Pod: PodName("main", "build-1")},
		PodOptions{AgentImage: "reg/step-agent:1", Installation: "prod", Extract: tarsafe.Limits{Bytes: 1 << 30, Entries: 5000}})
	assert.Equal(t, []string{"/step-agent", "volumes", "--listen", ":7788", "--max-extract-bytes", "1073741824", "--max-extract-entries", "5000"},
		limited.Spec.Containers[1].Command)
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		require.Len(t, c.VolumeMounts, 1, c.Name)
		assert.Equal(t, "/jetway", c.VolumeMounts[0].MountPath, c.Name)
	}

	raw, err := json.Marshal(p)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "hunter2", "the environment reaches the pod only through exec")
	assert.NotContains(t, string(raw), "also secret")
}

func TestPodNamesAreValidAndApart(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, h := range []string{"a", "build-1", long, strings.Repeat("ab-", 20) + "c"} {
		name := PodName("main", h)
		assert.Empty(t, validation.IsDNS1123Label(name), name)
	}
	assert.NotEqual(t, PodName("main", "x"), PodName("other", "x"), "handles are per team")
	assert.NotEqual(t, PodName("", long), PodName("", long[:62]+"b"))
}
