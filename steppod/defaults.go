package steppod

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Defaults are what a step pod gets unless its target's target.yaml
// (`steps:`, targets.StepPolicy) says otherwise: the gateway's step-*
// flags. A zero quantity is none.
//
// Why each: a step pod's emptyDir without a limit, or a step that writes
// to its container's own filesystem without a request, can fill the
// node's disk, and the kubelet then evicts pods by how far each is over
// its request: with a request and a size limit it is the step that
// filled the disk that goes, alone. A container without requests is
// BestEffort, the first the kubelet evicts under memory pressure, and the
// scheduler packs it anywhere, so its use crowds out the other tenants of
// the node: default requests make every step Burstable and counted.
type Defaults struct {
	// VolumeSizeLimit is the sizeLimit of the step pod's emptyDir (the
	// build dir, its inputs and outputs, the agent's log): past it the
	// kubelet evicts the pod.
	VolumeSizeLimit resource.Quantity
	// EphemeralStorageRequest is the step container's ephemeral-storage
	// request (its writable layer and logs; the emptyDir is bounded by
	// VolumeSizeLimit).
	EphemeralStorageRequest resource.Quantity
	// CPURequest and MemoryRequest are the step container's requests when
	// the step asks for no cpu (memory); a step that asks gets what it
	// asked as request and limit.
	CPURequest, MemoryRequest resource.Quantity
	// CheckCPURequest and CheckMemoryRequest are those of a Concourse
	// check container (Spec.Check) instead.
	CheckCPURequest, CheckMemoryRequest resource.Quantity
	// HolderSize is the sizeLimit of a Concourse volume holder's emptyDir
	// and its sidecar's capacity: every volume of the web node's on the
	// target, so its own setting, not a step's.
	HolderSize resource.Quantity
	// HolderStorageClass is the StorageClass of the claim that keeps a
	// Concourse volume holder's volumes instead of an emptyDir (""
	// none); the claim is HolderSize big. After For, the target's.
	HolderStorageClass string
	// HolderClaimSize is the size of that claim, set by For: the
	// target's steps.volumeHolder.storage.size, else HolderSize.
	HolderClaimSize resource.Quantity
}

// For is d with what the target's policy sets instead.
func (d Defaults) For(p targets.StepPolicy) Defaults {
	pick := func(def resource.Quantity, target *resource.Quantity) resource.Quantity {
		if target != nil {
			return target.DeepCopy()
		}
		return def.DeepCopy()
	}
	out := Defaults{
		VolumeSizeLimit:         pick(d.VolumeSizeLimit, p.VolumeSizeLimit),
		EphemeralStorageRequest: pick(d.EphemeralStorageRequest, p.EphemeralStorageRequest),
		CPURequest:              pick(d.CPURequest, p.DefaultCPURequest),
		MemoryRequest:           pick(d.MemoryRequest, p.DefaultMemoryRequest),
		CheckCPURequest:         pick(d.CheckCPURequest, p.CheckCPURequest),
		CheckMemoryRequest:      pick(d.CheckMemoryRequest, p.CheckMemoryRequest),
		HolderSize:              pick(d.HolderSize, p.VolumeHolder.Size),
		HolderStorageClass:      p.VolumeHolder.StorageClass(d.HolderStorageClass),
	}
	if out.HolderStorageClass != "" {
		var size *resource.Quantity
		if p.VolumeHolder.Storage != nil {
			size = p.VolumeHolder.Storage.Size
		}
		out.HolderClaimSize = pick(out.HolderSize, size)
	}
	return out
}

// stepSecurity is the step container's security context. The step's image
// decides its user (Concourse tasks often run as root), but it gets no
// privilege beyond that: no escalation (no_new_privs), the runtime's
// default seccomp profile, and the runtime's default capabilities minus
// NET_RAW (raw sockets forge packets and spoof other pods on the node;
// nothing a build needs but ping), unless netRaw (steps.netRaw) keeps
// it, as a stock worker does. A privileged step, on a target whose policy
// allows it, gets a privileged container and none of that: the runtime
// gives a privileged container every capability and no seccomp filter
// whatever else is set, and Kubernetes refuses privileged with
// allowPrivilegeEscalation false.
func stepSecurity(privileged, netRaw bool) *corev1.SecurityContext {
	if privileged {
		yes := true
		return &corev1.SecurityContext{Privileged: &yes}
	}
	no := false
	sc := &corev1.SecurityContext{
		Privileged: &no, AllowPrivilegeEscalation: &no,
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if netRaw {
		sc.Capabilities = nil
	}
	return sc
}

// stepVolume is the emptyDir step pods share, bounded by d.
func stepVolume(d Defaults) corev1.VolumeSource { return emptyDir(d.VolumeSizeLimit) }

// emptyDir is an emptyDir of limit (zero: none).
func emptyDir(limit resource.Quantity) corev1.VolumeSource {
	dir := &corev1.EmptyDirVolumeSource{}
	if !limit.IsZero() {
		l := limit.DeepCopy()
		dir.SizeLimit = &l
	}
	return corev1.VolumeSource{EmptyDir: dir}
}

// stepResources are the step container's resources: the cpu and memory
// a step asks for as both requests and limits, so it gets what it asked
// for and no more (cpuWeight: its cpu as a request alone); d's requests
// (a check's: check) for what it does not ask; and d's ephemeral-storage
// request.
func stepResources(r wire.Resources, cpuWeight, check bool, d Defaults) corev1.ResourceRequirements {
	if check {
		d.CPURequest, d.MemoryRequest = d.CheckCPURequest, d.CheckMemoryRequest
	}
	req, lim := corev1.ResourceList{}, corev1.ResourceList{}
	for _, res := range []struct {
		name  corev1.ResourceName
		asked string
		def   resource.Quantity
	}{
		{corev1.ResourceCPU, r.CPU, d.CPURequest},
		{corev1.ResourceMemory, r.Memory, d.MemoryRequest},
		{corev1.ResourceEphemeralStorage, "", d.EphemeralStorageRequest},
	} {
		switch {
		case res.asked != "" && res.name == corev1.ResourceCPU && cpuWeight:
			req[res.name] = resource.MustParse(res.asked)
		case res.asked != "":
			q := resource.MustParse(res.asked)
			req[res.name], lim[res.name] = q, q.DeepCopy()
		case !res.def.IsZero():
			req[res.name] = res.def.DeepCopy()
		}
	}
	out := corev1.ResourceRequirements{}
	if len(req) > 0 {
		out.Requests = req
	}
	if len(lim) > 0 {
		out.Limits = lim
	}
	return out
}
