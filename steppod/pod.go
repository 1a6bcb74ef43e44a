package steppod

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Containers of a step pod: the step's own, whose pid 1 is the step
// agent, the volume sidecar, which serves the pod's volumes, and the
// init container that installs the agent where there is no image volume.
const (
	StepContainer    = "step"
	SidecarContainer = "volumes"
	installContainer = "install"
)

// Volumes of a step pod: the emptyDir its containers share (the build
// dir, volumes, the agent's log) and the agent's image volume.
const (
	sharedVolume = "jetway"
	agentVolume  = "jetway-agent"
)

// AgentMount is how a step pod gets its agent (docs/steps.md).
type AgentMount string

const (
	// AgentInitContainer: an init container copies the agent from its
	// image into the pod's emptyDir (bin/step-agent), on any runtime.
	// kubelet starts the step's containers only once it saw the init
	// container end, at its next relist (up to a second).
	AgentInitContainer AgentMount = "init-container"
	// AgentImageVolume: the agent's image is an image volume (ImageVolume,
	// GA in Kubernetes 1.36; containerd 2.1 or later, CRI-O 1.31 or
	// later) mounted read-only at the emptyDir's bin folder of the step
	// container and the sidecar: no init container, so the step's
	// containers start at once.
	AgentImageVolume AgentMount = "image-volume"
	// AgentAuto: per target, what Options.Chooser chose from the runtime
	// its nodes report (package agentmount); the init container without
	// a Chooser.
	AgentAuto AgentMount = "auto"
)

// ParseAgentMount reads an AgentMount ("" is AgentInitContainer).
func ParseAgentMount(s string) (AgentMount, error) {
	switch m := AgentMount(s); m {
	case "":
		return AgentInitContainer, nil
	case AgentInitContainer, AgentImageVolume, AgentAuto:
		return m, nil
	}
	return "", fmt.Errorf("step agent mount %q: want %s, %s or %s", s, AgentAuto, AgentInitContainer, AgentImageVolume)
}

// MountChooser says how a target's step pods get the agent, with
// AgentAuto. It must not block: Build calls it.
type MountChooser interface {
	AgentMount(t *targets.Target) AgentMount
}

// mountFor is the mount of t's step pods: opts.AgentMount, or with
// AgentAuto the Chooser's choice (the init container without one).
func (o Options) mountFor(t *targets.Target) AgentMount {
	if o.AgentMount != AgentAuto {
		return o.AgentMount
	}
	if o.Chooser == nil {
		return AgentInitContainer
	}
	return o.Chooser.AgentMount(t)
}

// Name is the step pod's name (an agent's step folder): readable,
// and unique per team and handle.
func Name(team, handle string) string {
	sum := sha256.Sum256([]byte(team + "/" + handle))
	prefix := handle
	if len(prefix) > 52 {
		prefix = strings.TrimRight(prefix[:52], "-")
	}
	return prefix + "-" + hex.EncodeToString(sum[:])[:10]
}

// Options are the settings every step pod shares.
type Options struct {
	// AgentImage holds the step agent: mounted or copied into the pod
	// (AgentMount), and the volume sidecar runs it.
	AgentImage string
	// AgentMount is how the agent gets into the step container ("": an
	// init container; AgentAuto: as Chooser says for the target).
	AgentMount AgentMount
	Chooser    MountChooser
	// Installation names this installation in ownership labels.
	Installation string
	// Steps are the step containers' defaults (the gateway's flags);
	// each target's target.yaml may set its own.
	Steps Defaults
	// Extract bounds what one archive streamed into the pod's volumes may
	// write (the sidecar's flags; zero fields: tarsafe's defaults).
	Extract tarsafe.Limits
	// Key seals the pod and derives its sidecar's token
	// (ownership.Key): without it no step runs.
	Key ownership.Key
}

// sidecarCommand runs the volume sidecar with the pod's extract limits:
// every file with its owner, and device nodes and FIFOs only where the
// target lets a step be privileged (devices: a privileged step could make
// them anyway).
func (o Options) sidecarCommand(devices bool) []string {
	cmd := []string{"/step-agent", "volumes", "--listen", ":7788", "--owners"}
	if devices {
		cmd = append(cmd, "--devices")
	}
	if o.Extract.Bytes > 0 {
		cmd = append(cmd, "--max-extract-bytes", strconv.FormatInt(o.Extract.Bytes, 10))
	}
	if o.Extract.Entries > 0 {
		cmd = append(cmd, "--max-extract-entries", strconv.Itoa(o.Extract.Entries))
	}
	return cmd
}

// sidecar is the volume sidecar container, serving the pod's emptyDir to
// the holder of the token whose SHA-256 is tokenHash. Its working dir is
// the emptyDir, as the step container's: the gateway reads a step's log
// through it (the same relative bin/step-agent) once the step's container
// ended.
func (o Options) sidecar(tokenHash string, devices bool) corev1.Container {
	return corev1.Container{
		Name: SidecarContainer, Image: o.AgentImage,
		Command:    o.sidecarCommand(devices),
		WorkingDir: stepagent.Root,
		Env: []corev1.EnvVar{{Name: stepagent.RootEnv, Value: stepagent.Root},
			{Name: stepagent.TokenHashEnv, Value: tokenHash}},
		Ports:           []corev1.ContainerPort{{Name: "volumes", ContainerPort: stepagent.VolumePort}},
		VolumeMounts:    []corev1.VolumeMount{{Name: sharedVolume, MountPath: stepagent.Root}},
		SecurityContext: sidecarSecurity(devices),
		Resources:       sidecarResources,
		// Ready once it listens: SidecarListens. A readiness probe, not a
		// startup probe: kubelet probes it at once when it first reports
		// the container running (a startup probe waits for its period's
		// tick), then each second, a TCP connect (three misses in a row
		// make it unready).
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(stepagent.VolumePort)}},
			PeriodSeconds: 1, TimeoutSeconds: 1, FailureThreshold: 3,
		},
	}
}

// SidecarListens reports whether pod runs and its volume sidecar listens
// (ready: its readiness probe passed), so that a stream to it is not
// refused. A node that reports no container states says it by running.
func SidecarListens(p *corev1.Pod) bool {
	// Not ready until its readiness probe passed.
	return sidecarIs(p, func(cs corev1.ContainerStatus) bool { return cs.State.Running != nil && cs.Ready })
}

// SidecarRuns reports whether pod runs with its volume sidecar started,
// listening or about to: the probe's next tick (up to a second) is not
// waited for. A stream refused in that moment is tried again (a
// Concourse container's moves).
func SidecarRuns(p *corev1.Pod) bool {
	return sidecarIs(p, func(cs corev1.ContainerStatus) bool { return cs.State.Running != nil })
}

// sidecarIs reports whether pod runs and its sidecar's status is as is
// says; a node that reports no container states says it by running.
func sidecarIs(p *corev1.Pod, is func(corev1.ContainerStatus) bool) bool {
	if p == nil || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == SidecarContainer {
			return is(cs)
		}
	}
	return len(p.Status.ContainerStatuses) == 0
}

// sidecarResources bound the volume sidecar: it streams, holding one
// buffer per stream.
var sidecarResources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
	Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
}

// Spec is one step pod: a step's, a check sandbox's or a Concourse
// container's, as its user says it.
type Spec struct {
	// Name is the pod's name (Name(team, handle) for a step).
	Name string
	// Type is its step type (targets.StepTypeLabel): task, check, get,
	// put, or concourse for a web node's container.
	Type string
	// Team runs in it ("": jetway's own, no team's).
	Team, Image string
	// Labels are added to the pod's own (ownership, team, type): a
	// step's handle and owner, a container's handle.
	Labels    map[string]string
	Resources wire.Resources
	// CPUWeight says Resources.CPU is a relative weight, as Garden's CPU
	// shares are: a request without a limit, so the step gets its share
	// when the node is busy and more when it is not.
	CPUWeight bool
	// Check says it is a Concourse check container: what it does not ask
	// for, it gets the Defaults' check requests, not a step's.
	Check      bool
	Privileged bool
	// Hermetic says the step may reach no network beyond its pod
	// (Concourse's `hermetic: true`): the pod carries HermeticLabel, which
	// the target's hermetic NetworkPolicy selects.
	Hermetic bool
	// Mounts are a Concourse container's bind mounts: each one a folder
	// of the pod's emptyDir at Path, in this order, so a mount nested in
	// another comes after it. The folder is a volume the sidecar serves,
	// named Volume (under stepagent.VolumesDir), so that its files can be
	// streamed in and out.
	Mounts []Mount
	// PullSecrets are pull secrets of this pod alone, besides the
	// target's (a container's image's credentials from its pipeline).
	PullSecrets []string
}

// Mount is one bind mount of a Concourse container.
type Mount struct {
	Path, Volume string
	ReadOnly     bool
}

// Build is the step pod of spec on target t: the step container (the
// spec's image, the agent its pid 1, waiting for the process an exec
// starts), the volume sidecar, the agent as opts.AgentMount says, the
// target's placement and step policy (with steps.userNamespaces, an
// unprivileged pod has a user namespace of its own), and jetway's seal.
func Build(t *targets.Target, spec Spec, opts Options) *corev1.Pod {
	labels := ownership.Labels(t.Name(), opts.Installation)
	labels[targets.StepTypeLabel] = spec.Type
	if spec.Team != "" {
		labels[ownership.TeamLabel] = spec.Team
	}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	if spec.Hermetic {
		labels[targets.HermeticLabel] = "true"
	}
	meta := t.Config.Meta
	defaults := opts.Steps.For(meta.Steps)
	mount := []corev1.VolumeMount{{Name: sharedVolume, MountPath: stepagent.Root}}
	no := false
	seal, tokenHash := opts.seal(t.Name(), spec.Name, spec.Team)
	sidecar := opts.sidecar(tokenHash, meta.Steps.AllowPrivileged)
	opts.AgentMount = opts.mountFor(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: t.Namespace(), Labels: labels, Annotations: seal},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			NodeSelector:                 meta.NodeSelector,
			Tolerations:                  meta.Tolerations,
			Volumes:                      []corev1.Volume{{Name: sharedVolume, VolumeSource: stepVolume(defaults)}},
			Containers: []corev1.Container{{
				Name: StepContainer, Image: spec.Image,
				Command:    []string{stepagent.Root + "/" + stepagent.BinPath, "pid1"},
				WorkingDir: stepagent.Root, VolumeMounts: mount,
				Env:             []corev1.EnvVar{{Name: stepagent.RootEnv, Value: stepagent.Root}},
				Resources:       stepResources(spec.Resources, spec.CPUWeight, spec.Check, defaults),
				SecurityContext: stepSecurity(spec.Privileged, meta.Steps.NetRaw),
			}, sidecar},
		},
	}
	if meta.Steps.UserNamespaces && !spec.Privileged {
		pod.Spec.HostUsers = &no
	}
	opts.addAgent(&pod.Spec)
	step := &pod.Spec.Containers[0]
	for _, m := range spec.Mounts {
		// Open to every user before the process: the sidecar writes
		// into them, the container's user too. The init container makes
		// them; without it kubelet does, as it mounts the step container
		// (before the sidecar starts), root's but with the emptyDir's
		// mode, 0777 (kubelet's subpath.SafeMakeDir).
		if len(pod.Spec.InitContainers) > 0 {
			install := &pod.Spec.InitContainers[0]
			install.Command = append(install.Command, m.Volume)
		}
		step.VolumeMounts = append(step.VolumeMounts, corev1.VolumeMount{Name: sharedVolume, MountPath: m.Path,
			SubPath: stepagent.VolumesDir + "/" + m.Volume, ReadOnly: m.ReadOnly})
	}
	for _, name := range append(slices.Clip(meta.ImagePullSecrets), spec.PullSecrets...) {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
	}
	return pod
}

// addAgent gives the step pod's containers the agent at bin/step-agent
// of the emptyDir, as opts.AgentMount says: an image volume mounted over
// the bin folder (read-only: the step cannot change the agent the next
// exec runs), or an init container that copies it there. Either way the
// step's image is not changed and the agent is there before the step
// container starts, as its pid 1.
func (o Options) addAgent(spec *corev1.PodSpec) {
	if o.AgentMount == AgentImageVolume {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: agentVolume,
			VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: o.AgentImage}}})
		bin := corev1.VolumeMount{Name: agentVolume, MountPath: stepagent.Root + "/" + path.Dir(stepagent.BinPath), ReadOnly: true}
		for i := range spec.Containers {
			spec.Containers[i].VolumeMounts = append(spec.Containers[i].VolumeMounts, bin)
		}
		return
	}
	spec.InitContainers = []corev1.Container{{
		Name: installContainer, Image: o.AgentImage,
		Command:         []string{"/step-agent", "install", stepagent.Root + "/" + stepagent.BinPath},
		VolumeMounts:    []corev1.VolumeMount{{Name: sharedVolume, MountPath: stepagent.Root}},
		SecurityContext: agentSecurity(),
		Resources:       sidecarResources,
	}}
}

// seal is the annotations of a new pod of name on target for team (its
// seal and a new nonce: ownership.Key) and the hash of its sidecar's
// token. Its binding is written once it is made (ownership.Bind).
func (o Options) seal(target, name, team string) (map[string]string, string) {
	nonce := ownership.NewNonce()
	return map[string]string{ownership.SealAnnotation: o.Key.Seal(target, name, team), ownership.NonceAnnotation: nonce},
		ownership.TokenHash(o.Key.Token(target, name, nonce))
}

// sidecarSecurity is the volume sidecar's context: root, for it carries
// every file as written (it reads a step's root-only files and gives
// each file its owner, setuid and setgid), with only the capabilities
// that takes (and CAP_MKNOD with devices), not the runtime's default
// set; no privilege escalation, a read-only root filesystem, the
// runtime's seccomp profile. Each of these capabilities is in the Pod
// Security Standards' baseline, which the step container needs anyway.
// It reaches nothing but its pod's emptyDir, and it opens every path of
// a volume beneath the volume (os.Root): a symbolic link a step left
// there leads it nowhere else.
func sidecarSecurity(devices bool) *corev1.SecurityContext {
	no, root := false, int64(0)
	caps := []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"}
	if devices {
		caps = append(caps, "MKNOD")
	}
	yes := true
	return &corev1.SecurityContext{
		Privileged: &no, AllowPrivilegeEscalation: &no, RunAsNonRoot: &no, RunAsUser: &root, RunAsGroup: &root,
		ReadOnlyRootFilesystem: &yes,
		Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: caps},
		SeccompProfile:         &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// agentSecurity is the init container's context: the restricted profile.
func agentSecurity() *corev1.SecurityContext {
	no, yes, uid := false, true, int64(65532)
	return &corev1.SecurityContext{
		Privileged: &no, AllowPrivilegeEscalation: &no, RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid,
		ReadOnlyRootFilesystem: &yes,
		Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:         &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}
