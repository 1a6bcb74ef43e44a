package steppod

import (
	"encoding/json"
	"strings"
	"testing"

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
	"github.com/jetway-ci/jetway/wire"
)

func TestBuild(t *testing.T) {
	cfg := &targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"}, Meta: targets.Metadata{
		Namespace: "ci", NodeSelector: map[string]string{"pool": "ci"},
		Tolerations:      []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists}},
		ImagePullSecrets: []string{"registry"},
	}}
	tgt, err := targets.NewTarget(cfg, "prod")
	require.NoError(t, err)
	spec := taskSpec("main")
	spec.Resources = wire.Resources{CPU: "500m", Memory: "1Gi"}
	key, err := ownership.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	p := Build(tgt, spec, Options{AgentImage: "reg/step-agent:1", Installation: "prod", Key: key})

	assert.Equal(t, "ci", p.Namespace)
	assert.Equal(t, map[string]string{
		"org.concourse-ci.worker": "east", "jetway-ci.dev/installation": "prod", "jetway-ci.dev/step-type": "task",
		"jetway-ci.dev/team": "main", "jetway-ci.dev/step": "build-1", "jetway-ci.dev/owner": "gw-a"}, p.Labels)
	nonce := p.Annotations[ownership.NonceAnnotation]
	assert.Len(t, nonce, 32)
	assert.Equal(t, map[string]string{ownership.SealAnnotation: key.Seal("east", p.Name, "main"), ownership.NonceAnnotation: nonce}, p.Annotations,
		"what a restarted gateway needs is in the step's record; the pod has only jetway's seal and its nonce (its binding comes once it is made)")
	assert.True(t, key.Sealed("east", p))
	assert.False(t, key.Bound("east", p), "bound once made, to the UID the create returns")
	token := key.PodToken("east", p)
	raw, _ := json.Marshal(p)
	assert.NotContains(t, string(raw), token, "the sidecar's token is nowhere in the pod")
	again := Build(tgt, spec, Options{AgentImage: "reg/step-agent:1", Installation: "prod", Key: key})
	assert.NotEqual(t, token, key.PodToken("east", again), "a pod made again under the name has another token")
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
	assert.Equal(t, []string{"/tmp/jetway/bin/step-agent", "pid1"}, step.Command)
	assert.Equal(t, resource.MustParse("500m"), step.Resources.Limits[corev1.ResourceCPU])
	assert.Equal(t, resource.MustParse("1Gi"), step.Resources.Requests[corev1.ResourceMemory])
	assert.False(t, *step.SecurityContext.Privileged)
	assert.False(t, *step.SecurityContext.AllowPrivilegeEscalation)
	assert.Nil(t, p.Spec.Volumes[0].EmptyDir.SizeLimit, "no defaults given: no limit")
	assert.Equal(t, int32(7788), side.Ports[0].ContainerPort)
	assert.Contains(t, side.Env, corev1.EnvVar{Name: stepagent.TokenHashEnv, Value: ownership.TokenHash(token)},
		"the sidecar holds the hash of its token")
	assert.Equal(t, "/tmp/jetway", side.WorkingDir, "the step's log is read through it once the step's container ended")
	assert.Equal(t, sidecarSecurity(false), side.SecurityContext)
	assert.Equal(t, []string{"/step-agent", "volumes", "--listen", ":7788", "--owners"}, side.Command,
		"the agent's own extract limits, every file with its owner")
	limited := Build(tgt, spec,
		Options{AgentImage: "reg/step-agent:1", Installation: "prod", Extract: tarsafe.Limits{Bytes: 1 << 30, Entries: 5000}})
	assert.Equal(t, []string{"/step-agent", "volumes", "--listen", ":7788", "--owners", "--max-extract-bytes", "1073741824", "--max-extract-entries", "5000"},
		limited.Spec.Containers[1].Command)
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		require.Len(t, c.VolumeMounts, 1, c.Name)
		assert.Equal(t, "/tmp/jetway", c.VolumeMounts[0].MountPath, c.Name)
	}

}

func TestPodNamesAreValidAndApart(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, h := range []string{"a", "build-1", long, strings.Repeat("ab-", 20) + "c"} {
		name := Name("main", h)
		assert.Empty(t, validation.IsDNS1123Label(name), name)
	}
	assert.NotEqual(t, Name("main", "x"), Name("other", "x"), "handles are per team")
	assert.NotEqual(t, Name("", long), Name("", long[:62]+"b"))
}

// podOn builds the pod of a task asking for resources r (privileged if
// asked) on a target whose target.yaml has policy, with the gateway's
// defaults d.
func podOn(t *testing.T, policy targets.StepPolicy, d Defaults, r wire.Resources, privileged bool) *corev1.Pod {
	t.Helper()
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci", Steps: policy}}, "prod")
	require.NoError(t, err)
	spec := taskSpec("")
	spec.Resources, spec.Privileged = r, privileged
	return Build(tgt, spec, Options{AgentImage: "reg/step-agent:1", Installation: "prod", Steps: d})
}

// taskSpec is the spec of a task's pod for team, as package steps makes
// it: named for its handle, labelled with it and its owner.
func taskSpec(team string) Spec {
	return Spec{Name: Name(team, "build-1"), Type: "task", Team: team, Image: "busybox",
		Labels: map[string]string{"jetway-ci.dev/step": "build-1", ownership.OwnerLabel: "gw-a"}}
}

func quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

// TestStepContainerSecurity: the step container runs with the runtime's
// seccomp profile, no privilege escalation and the runtime's capabilities
// minus NET_RAW; a privileged step, where its target allows it, runs
// privileged and without those. The init container keeps the restricted
// profile either way; the volume sidecar runs as root with the four
// capabilities that carry files as written (drop ALL, add CHOWN,
// DAC_OVERRIDE, FOWNER, FSETID), and CAP_MKNOD with devices only where
// the target allows privileged steps, no escalation, a read-only root.
func TestStepContainerSecurity(t *testing.T) {
	p := podOn(t, targets.StepPolicy{}, Defaults{}, wire.Resources{}, false)
	sc := p.Spec.Containers[0].SecurityContext
	require.NotNil(t, sc)
	assert.Equal(t, &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}, sc.SeccompProfile)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	assert.False(t, *sc.Privileged)
	assert.Equal(t, &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}, sc.Capabilities, "the runtime's defaults, minus NET_RAW")
	assert.Nil(t, sc.RunAsNonRoot, "the image decides its user")

	priv := podOn(t, targets.StepPolicy{AllowPrivileged: true}, Defaults{}, wire.Resources{}, true)
	sc = priv.Spec.Containers[0].SecurityContext
	assert.Equal(t, &corev1.SecurityContext{Privileged: ptrTo(true)}, sc,
		"privileged and nothing else: Kubernetes refuses it with allowPrivilegeEscalation false")
	for _, pod := range []*corev1.Pod{p, priv} {
		for _, c := range pod.Spec.InitContainers {
			assert.Equal(t, agentSecurity(), c.SecurityContext, c.Name)
		}
	}
	for _, tc := range []struct {
		pod  *corev1.Pod
		caps []corev1.Capability
		args []string
	}{
		{p, []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"}, []string{"--owners"}},
		{priv, []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "MKNOD"}, []string{"--owners", "--devices"}},
	} {
		sc := tc.pod.Spec.Containers[1].SecurityContext
		assert.Equal(t, int64(0), *sc.RunAsUser)
		assert.False(t, *sc.RunAsNonRoot)
		assert.False(t, *sc.AllowPrivilegeEscalation)
		assert.False(t, *sc.Privileged)
		assert.True(t, *sc.ReadOnlyRootFilesystem)
		assert.Equal(t, &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}, sc.SeccompProfile)
		assert.Equal(t, &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: tc.caps}, sc.Capabilities)
		assert.Equal(t, tc.args, tc.pod.Spec.Containers[1].Command[4:])
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestUserNamespaces: a target with steps.userNamespaces runs its
// unprivileged step pods with hostUsers false, and its privileged ones
// with the host's users (Kubernetes refuses a privileged container in a
// user namespace); a target without it leaves hostUsers to the cluster.
func TestUserNamespaces(t *testing.T) {
	userns := targets.StepPolicy{UserNamespaces: true, AllowPrivileged: true}
	assert.Equal(t, ptrTo(false), podOn(t, userns, Defaults{}, wire.Resources{}, false).Spec.HostUsers)
	assert.Nil(t, podOn(t, userns, Defaults{}, wire.Resources{}, true).Spec.HostUsers, "privileged")
	assert.Nil(t, podOn(t, targets.StepPolicy{}, Defaults{}, wire.Resources{}, false).Spec.HostUsers, "not asked for")
}

// TestNetRaw: with steps.netRaw an unprivileged step keeps the runtime's
// capabilities whole, NET_RAW among them, as on a stock worker; the rest
// of its security context stays.
func TestNetRaw(t *testing.T) {
	sc := podOn(t, targets.StepPolicy{NetRaw: true}, Defaults{}, wire.Resources{}, false).Spec.Containers[0].SecurityContext
	assert.Nil(t, sc.Capabilities, "none dropped")
	assert.False(t, *sc.AllowPrivilegeEscalation)
	assert.Equal(t, &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}, sc.SeccompProfile)
}

// TestHermeticLabel: a hermetic step's pod carries HermeticLabel, which
// no label of the spec's replaces; another step's pod has none.
func TestHermeticLabel(t *testing.T) {
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci"}}, "prod")
	require.NoError(t, err)
	spec := taskSpec("")
	assert.NotContains(t, Build(tgt, spec, Options{AgentImage: "a"}).Labels, targets.HermeticLabel)
	spec.Hermetic, spec.Labels[targets.HermeticLabel] = true, "false"
	assert.Equal(t, "true", Build(tgt, spec, Options{AgentImage: "a"}).Labels[targets.HermeticLabel])
}

// TestStepPodLimits: the emptyDir's size limit, the ephemeral-storage
// request and the default cpu and memory requests come from the
// gateway's defaults unless the target's target.yaml sets its own (0:
// none there); what a step asks for is its request and limit, and keeps
// the defaults off that resource only.
func TestStepPodLimits(t *testing.T) {
	defaults := Defaults{VolumeSizeLimit: resource.MustParse("10Gi"), EphemeralStorageRequest: resource.MustParse("1Gi"),
		CPURequest: resource.MustParse("100m"), MemoryRequest: resource.MustParse("256Mi")}
	rl := func(kv ...string) corev1.ResourceList {
		if len(kv) == 0 {
			return nil
		}
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	for _, tt := range []struct {
		name     string
		policy   targets.StepPolicy
		defaults Defaults
		asked    wire.Resources
		size     string // "": no sizeLimit
		requests corev1.ResourceList
		limits   corev1.ResourceList
	}{
		{name: "the gateway's defaults", defaults: defaults, size: "10Gi",
			requests: rl("cpu", "100m", "memory", "256Mi", "ephemeral-storage", "1Gi")},
		{name: "asked for both: kept, as limits too", defaults: defaults, asked: wire.Resources{CPU: "2", Memory: "4Gi"}, size: "10Gi",
			requests: rl("cpu", "2", "memory", "4Gi", "ephemeral-storage", "1Gi"), limits: rl("cpu", "2", "memory", "4Gi")},
		{name: "asked for memory only: cpu defaulted", defaults: defaults, asked: wire.Resources{Memory: "1Gi"}, size: "10Gi",
			requests: rl("cpu", "100m", "memory", "1Gi", "ephemeral-storage", "1Gi"), limits: rl("memory", "1Gi")},
		{name: "target.yaml overrides", defaults: defaults, size: "50Gi",
			policy: targets.StepPolicy{VolumeSizeLimit: quantity("50Gi"), EphemeralStorageRequest: quantity("5Gi"),
				DefaultCPURequest: quantity("1"), DefaultMemoryRequest: quantity("2Gi")},
			requests: rl("cpu", "1", "memory", "2Gi", "ephemeral-storage", "5Gi")},
		{name: "target.yaml turns them off", defaults: defaults,
			policy: targets.StepPolicy{VolumeSizeLimit: quantity("0"), EphemeralStorageRequest: quantity("0"),
				DefaultCPURequest: quantity("0"), DefaultMemoryRequest: quantity("0")}},
		{name: "target.yaml alone", size: "1Gi", policy: targets.StepPolicy{VolumeSizeLimit: quantity("1Gi"), DefaultMemoryRequest: quantity("64Mi")},
			requests: rl("memory", "64Mi")},
		{name: "no defaults, nothing asked: as before"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := podOn(t, tt.policy, tt.defaults, tt.asked, false)
			dir := p.Spec.Volumes[0].EmptyDir
			require.NotNil(t, dir)
			if tt.size == "" {
				assert.Nil(t, dir.SizeLimit)
			} else if assert.NotNil(t, dir.SizeLimit) {
				assert.Zero(t, dir.SizeLimit.Cmp(resource.MustParse(tt.size)), "sizeLimit %s", dir.SizeLimit)
			}
			res := p.Spec.Containers[0].Resources
			assert.Equal(t, quantities(tt.requests), quantities(res.Requests), "requests")
			assert.Equal(t, quantities(tt.limits), quantities(res.Limits), "limits")
			assert.Equal(t, sidecarResources, p.Spec.Containers[1].Resources, "the sidecar's own")
		})
	}
}

// quantities is a resource list as comparable strings.
func quantities(l corev1.ResourceList) map[corev1.ResourceName]string {
	if len(l) == 0 {
		return nil
	}
	out := map[corev1.ResourceName]string{}
	for k, v := range l {
		out[k] = v.String()
	}
	return out
}

// A web node's container is a step pod no step engine acts on: no handle,
// no owner; its bind mounts are folders of the pod's volume, in order.
func TestAContainersPod(t *testing.T) {
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci", Team: "main"}}, "prod")
	require.NoError(t, err)
	p := Build(tgt, Spec{Name: "c-1", Type: "concourse", Team: "main", Image: "busybox:1.36",
		Labels:    map[string]string{"jetway-ci.dev/concourse-container": "h1"},
		Resources: wire.Resources{Memory: "100Mi", CPU: "500m"}, CPUWeight: true,
		Mounts: []Mount{{Path: "/tmp/build/x", Volume: "m0"}, {Path: "/tmp/build/x/in", Volume: "m1", ReadOnly: true}},
	}, Options{AgentImage: "reg/step-agent:1", Installation: "prod"})
	assert.NotContains(t, p.Labels, "jetway-ci.dev/step")
	assert.NotContains(t, p.Labels, ownership.OwnerLabel)
	assert.Equal(t, "h1", p.Labels["jetway-ci.dev/concourse-container"])
	assert.Equal(t, "main", p.Labels[ownership.TeamLabel])
	assert.Contains(t, p.Annotations, ownership.SealAnnotation)
	step := p.Spec.Containers[0]
	assert.Equal(t, "busybox:1.36", step.Image)
	assert.Equal(t, []corev1.VolumeMount{
		{Name: sharedVolume, MountPath: stepagent.Root},
		{Name: sharedVolume, MountPath: "/tmp/build/x", SubPath: "volumes/m0"},
		{Name: sharedVolume, MountPath: "/tmp/build/x/in", SubPath: "volumes/m1", ReadOnly: true},
	}, step.VolumeMounts)
	assert.Equal(t, "100Mi", step.Resources.Limits.Memory().String())
	assert.Equal(t, "500m", step.Resources.Requests.Cpu().String(), "Garden's CPU shares: a weight")
	assert.True(t, step.Resources.Limits.Cpu().IsZero(), "not a limit")
	assert.Equal(t, SidecarContainer, p.Spec.Containers[1].Name)
	assert.Equal(t, []string{"/step-agent", "install", stepagent.Root + "/" + stepagent.BinPath, "m0", "m1"}, p.Spec.InitContainers[0].Command,
		"the mounts' folders, made open before the kubelet mounts them")
}

// TestSidecarListens: a pod's volume sidecar is probed until it listens,
// and listens only then (kwok reports it ready as it runs); it runs once
// started; a node that reports no container states says both by running.
func TestSidecarListens(t *testing.T) {
	side := Options{AgentImage: "agent:1"}.sidecar("hash", false)
	assert.Nil(t, side.StartupProbe, "a startup probe is first run a period after the container starts")
	probe := side.ReadinessProbe
	require.NotNil(t, probe, "run by kubelet as soon as it sees the container running")
	assert.Equal(t, int32(stepagent.VolumePort), probe.TCPSocket.Port.IntVal)
	assert.Equal(t, int32(1), probe.PeriodSeconds)

	pod := func(phase corev1.PodPhase, statuses ...corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: phase, ContainerStatuses: statuses}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	step := corev1.ContainerStatus{Name: StepContainer, State: running}
	for _, tc := range []struct {
		name         string
		pod          *corev1.Pod
		listens, run bool
	}{
		{"none", nil, false, false},
		{"pending", pod(corev1.PodPending), false, false},
		{"running, no container states", pod(corev1.PodRunning), true, true},
		{"sidecar waiting", pod(corev1.PodRunning, step, corev1.ContainerStatus{Name: SidecarContainer,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}}), false, false},
		{"sidecar not ready", pod(corev1.PodRunning, step, corev1.ContainerStatus{Name: SidecarContainer, State: running}), false, true},
		{"sidecar ready", pod(corev1.PodRunning, step, corev1.ContainerStatus{Name: SidecarContainer, State: running, Ready: true}), true, true},
		{"sidecar ended", pod(corev1.PodRunning, step, corev1.ContainerStatus{Name: SidecarContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}, Ready: true}), false, false},
	} {
		assert.Equal(t, tc.listens, SidecarListens(tc.pod), "listens: %s", tc.name)
		assert.Equal(t, tc.run, SidecarRuns(tc.pod), "runs: %s", tc.name)
	}
}

// TestBuildAgentImageVolume: with AgentImageVolume the step pod has no
// init container: the agent's image is an image volume, mounted read-only
// over the emptyDir's bin folder of the step container (its pid 1 is the
// agent there) and the sidecar (the gateway runs bin/step-agent in it
// once the step's container ended); the step's image is unchanged. A
// Concourse container with mounts gets it too: kubelet makes the mounts'
// folders as it mounts them.
func TestBuildAgentImageVolume(t *testing.T) {
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci"}}, "prod")
	require.NoError(t, err)
	opts := Options{AgentImage: "reg/step-agent:1", AgentMount: AgentImageVolume, Installation: "prod"}
	p := Build(tgt, taskSpec(""), opts)

	assert.Empty(t, p.Spec.InitContainers)
	require.Len(t, p.Spec.Volumes, 2)
	assert.NotNil(t, p.Spec.Volumes[0].EmptyDir)
	assert.Equal(t, corev1.Volume{Name: "jetway-agent", VolumeSource: corev1.VolumeSource{
		Image: &corev1.ImageVolumeSource{Reference: "reg/step-agent:1"}}}, p.Spec.Volumes[1])
	require.Len(t, p.Spec.Containers, 2)
	assert.Equal(t, "busybox", p.Spec.Containers[0].Image, "the step's image as it is")
	assert.Equal(t, []string{"/tmp/jetway/bin/step-agent", "pid1"}, p.Spec.Containers[0].Command)
	for _, c := range p.Spec.Containers {
		assert.Equal(t, []corev1.VolumeMount{{Name: "jetway", MountPath: "/tmp/jetway"},
			{Name: "jetway-agent", MountPath: "/tmp/jetway/bin", ReadOnly: true}}, c.VolumeMounts, c.Name)
	}

	plain := Build(tgt, Spec{Name: "c-1", Type: "concourse", Team: "main", Image: "busybox"}, opts)
	assert.Empty(t, plain.Spec.InitContainers, "a container without mounts gets the agent's image volume")
	mounted := Build(tgt, Spec{Name: "c-2", Type: "concourse", Team: "main", Image: "busybox",
		Mounts: []Mount{{Path: "/tmp/build/in", Volume: "v1"}}}, opts)
	assert.Empty(t, mounted.Spec.InitContainers, "a container with mounts gets the agent's image volume")
	assert.Len(t, mounted.Spec.Volumes, 2)
	assert.Contains(t, mounted.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "jetway", MountPath: "/tmp/build/in",
		SubPath: "volumes/v1"})
	opts.AgentMount = AgentInitContainer
	mounted = Build(tgt, Spec{Name: "c-3", Type: "concourse", Team: "main", Image: "busybox",
		Mounts: []Mount{{Path: "/tmp/build/in", Volume: "v1"}}}, opts)
	require.Len(t, mounted.Spec.InitContainers, 1)
	assert.Equal(t, []string{"/step-agent", "install", "/tmp/jetway/bin/step-agent", "v1"}, mounted.Spec.InitContainers[0].Command,
		"the init container makes the mounts' folders open")

	for _, s := range []string{"", "init-container", "image-volume", "auto"} {
		_, err := ParseAgentMount(s)
		assert.NoError(t, err, s)
	}
	_, err = ParseAgentMount("copy")
	assert.ErrorContains(t, err, `step agent mount "copy"`)
}

// chooser is a MountChooser that answers mount for every target.
type chooser AgentMount

func (c chooser) AgentMount(*targets.Target) AgentMount { return AgentMount(c) }

// TestBuildAgentAuto: with AgentAuto the Chooser decides per target; a
// forced mount ignores it; without a Chooser, auto is the init container.
func TestBuildAgentAuto(t *testing.T) {
	tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci"}}, "prod")
	require.NoError(t, err)
	for _, tc := range []struct {
		mount   AgentMount
		chooser MountChooser
		init    bool
	}{
		{AgentAuto, chooser(AgentImageVolume), false},
		{AgentAuto, chooser(AgentInitContainer), true},
		{AgentAuto, nil, true},
		{AgentInitContainer, chooser(AgentImageVolume), true},
		{AgentImageVolume, chooser(AgentInitContainer), false},
	} {
		p := Build(tgt, taskSpec(""), Options{AgentImage: "reg/step-agent:1", AgentMount: tc.mount, Chooser: tc.chooser, Installation: "prod"})
		assert.Equal(t, tc.init, len(p.Spec.InitContainers) == 1, "%s with %v", tc.mount, tc.chooser)
		assert.Equal(t, !tc.init, len(p.Spec.Volumes) == 2, "%s with %v", tc.mount, tc.chooser)
	}
}

// TestCheckPodRequests: a Concourse check container, idle between checks
// and one per resource, gets the check requests (the gateway's, or its
// target.yaml's) where it asks for nothing, not a step's; what it asks
// for is still its own.
func TestCheckPodRequests(t *testing.T) {
	defaults := Defaults{EphemeralStorageRequest: resource.MustParse("1Gi"),
		CPURequest: resource.MustParse("100m"), MemoryRequest: resource.MustParse("256Mi"),
		CheckCPURequest: resource.MustParse("10m"), CheckMemoryRequest: resource.MustParse("32Mi")}
	check := func(policy targets.StepPolicy, asked wire.Resources) corev1.ResourceRequirements {
		tgt, err := targets.NewTarget(&targets.Config{Name: "east", REST: &rest.Config{Host: "https://127.0.0.1:1"},
			Meta: targets.Metadata{Namespace: "ci", Steps: policy}}, "prod")
		require.NoError(t, err)
		spec := Spec{Name: "concourse-c1", Type: "concourse", Image: "busybox", Resources: asked, CPUWeight: true, Check: true}
		return Build(tgt, spec, Options{AgentImage: "reg/step-agent:1", Installation: "prod", Steps: defaults}).Spec.Containers[0].Resources
	}
	res := check(targets.StepPolicy{}, wire.Resources{})
	assert.Equal(t, map[corev1.ResourceName]string{"cpu": "10m", "memory": "32Mi", "ephemeral-storage": "1Gi"}, quantities(res.Requests))
	assert.Empty(t, res.Limits)
	res = check(targets.StepPolicy{CheckCPURequest: quantity("5m"), CheckMemoryRequest: quantity("0")}, wire.Resources{})
	assert.Equal(t, map[corev1.ResourceName]string{"cpu": "5m", "ephemeral-storage": "1Gi"}, quantities(res.Requests), "the target's own; 0: none")
	res = check(targets.StepPolicy{}, wire.Resources{Memory: "1Gi"})
	assert.Equal(t, map[corev1.ResourceName]string{"cpu": "10m", "memory": "1Gi", "ephemeral-storage": "1Gi"}, quantities(res.Requests))
	assert.Equal(t, "1Gi", res.Limits.Memory().String(), "what it asks for is its own")
}
