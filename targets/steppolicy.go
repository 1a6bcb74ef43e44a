package targets

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// StepPolicy is the `steps:` section of a target's target.yaml: what its
// operator allows its step pods beyond the gateway's defaults, and the
// sizes and requests that replace the gateway's flags on this target.
// A size or request left out is the gateway's (its step-* flags); 0
// means none on this target.
type StepPolicy struct {
	// AllowPrivileged lets a step that asks for it (Concourse's
	// `privileged: true` tasks) run in a privileged container here.
	// Targets without it refuse such steps, naming this key.
	AllowPrivileged bool `json:"allowPrivileged,omitempty"`
	// UserNamespaces runs every unprivileged step pod in a user
	// namespace of its own (hostUsers: false): root in the step is a
	// high, unprivileged uid on its node, as in a stock Concourse
	// worker's unprivileged containers. Needs the node's runtime to
	// support it (docs/steps.md, "User namespaces"). A privileged
	// step runs with the host's users whatever this says.
	UserNamespaces bool `json:"userNamespaces,omitempty"`
	// NetRaw leaves unprivileged steps CAP_NET_RAW, as a stock Concourse
	// worker does (busybox's ping needs it). jetway drops it otherwise:
	// a raw socket can forge packets from other addresses on the pod
	// network.
	NetRaw bool `json:"netRaw,omitempty"`
	// VolumeSizeLimit is the sizeLimit of the step pod's emptyDir (the
	// build dir, inputs and outputs): past it the kubelet evicts the pod.
	VolumeSizeLimit *resource.Quantity `json:"volumeSizeLimit,omitempty"`
	// EphemeralStorageRequest is the step container's ephemeral-storage
	// request: what the scheduler keeps free on the node for it.
	EphemeralStorageRequest *resource.Quantity `json:"ephemeralStorageRequest,omitempty"`
	// DefaultCPURequest and DefaultMemoryRequest are the step
	// container's requests when the step names no cpu (memory).
	DefaultCPURequest    *resource.Quantity `json:"defaultCPURequest,omitempty"`
	DefaultMemoryRequest *resource.Quantity `json:"defaultMemoryRequest,omitempty"`
	// CheckCPURequest and CheckMemoryRequest are a Concourse check
	// container's requests: it idles between checks, the web node keeps
	// it for the next, and a pipeline has one per resource.
	CheckCPURequest    *resource.Quantity `json:"checkCPURequest,omitempty"`
	CheckMemoryRequest *resource.Quantity `json:"checkMemoryRequest,omitempty"`
	// VolumeHolder is the Concourse volume holder's own.
	VolumeHolder VolumeHolderPolicy `json:"volumeHolder,omitzero"`
}

// VolumeHolderPolicy is `steps.volumeHolder`: the Concourse volume
// holder's settings, apart from a step pod's.
type VolumeHolderPolicy struct {
	// Size is the sizeLimit of the holder's emptyDir, which holds every
	// volume of the web node's on the target: its sidecar refuses a write
	// past it (less a margin), so no request gets the holder evicted.
	Size *resource.Quantity `json:"size,omitempty"`
	// Storage keeps the holder's volumes on a PersistentVolumeClaim of
	// its own instead of an emptyDir, so that a holder made again (its
	// pod deleted, evicted, drained to another node) has them still.
	// Left out: the gateway's volume-holder-storage-class; a class of ""
	// (`storage: {}`): an emptyDir on this target whatever the gateway's.
	Storage *HolderStorage `json:"storage,omitempty"`
	// Images is how the holder serves a rootfs it keeps (a task's built
	// image, a mirror_self get's) to the target's nodes as an image a
	// container runs: ImagesNodePort, or "" for not at all (a container
	// whose image is such a rootfs is refused, naming this key).
	Images string `json:"images,omitempty"`
}

// Values of steps.volumeHolder.images.
const (
	// ImagesNodePort: a NodePort Service of the holder's own, which each
	// node's container runtime pulls from as localhost:<nodePort> (plain
	// HTTP, as containerd and CRI-O take localhost): needs kube-proxy
	// answering NodePorts on the node's loopback (its iptables mode, the
	// default) and ImagePermissions.
	ImagesNodePort = "NodePort"
)

// HolderImagesKey is the target.yaml key of how the holder serves a
// rootfs as an image, as messages name it.
const HolderImagesKey = "steps.volumeHolder.images"

// HolderStorage is `steps.volumeHolder.storage`: the claim that keeps a
// Concourse volume holder's volumes.
type HolderStorage struct {
	// Class is the claim's StorageClass; "": no claim, an emptyDir.
	Class string `json:"class,omitempty"`
	// Size is the claim's size, and so the holder's capacity; left out:
	// the holder's size (steps.volumeHolder.size, else the gateway's
	// volume-holder-size).
	Size *resource.Quantity `json:"size,omitempty"`
}

// StorageClass is the StorageClass of the claim the holder keeps its
// volumes on, gatewayClass (the gateway's volume-holder-storage-class)
// unless the target says otherwise: "" for an emptyDir.
func (p VolumeHolderPolicy) StorageClass(gatewayClass string) string {
	if p.Storage != nil {
		return p.Storage.Class
	}
	return gatewayClass
}

// HolderStorageKey is the target.yaml key of the holder's claim, as
// messages name it.
const HolderStorageKey = "steps.volumeHolder.storage"

// PrivilegedKey is the target.yaml key that allows privileged steps, as
// messages name it.
const PrivilegedKey = "steps.allowPrivileged"

func (p StepPolicy) validate() error {
	var errs []error
	for _, q := range []struct {
		key string
		v   *resource.Quantity
	}{
		{"volumeSizeLimit", p.VolumeSizeLimit}, {"ephemeralStorageRequest", p.EphemeralStorageRequest},
		{"defaultCPURequest", p.DefaultCPURequest}, {"defaultMemoryRequest", p.DefaultMemoryRequest},
		{"checkCPURequest", p.CheckCPURequest}, {"checkMemoryRequest", p.CheckMemoryRequest},
		{"volumeHolder.size", p.VolumeHolder.Size}, {"volumeHolder.storage.size", p.VolumeHolder.storageSize()},
	} {
		if q.v != nil && q.v.Sign() < 0 {
			errs = append(errs, fmt.Errorf("steps.%s must not be negative, got %s", q.key, q.v))
		}
	}
	if im := p.VolumeHolder.Images; im != "" && im != ImagesNodePort {
		errs = append(errs, fmt.Errorf("%s is %q: it is %q (a NodePort Service of the holder's) or left out", HolderImagesKey, im, ImagesNodePort))
	}
	if st := p.VolumeHolder.Storage; st != nil {
		if st.Class != "" {
			for _, msg := range validation.IsDNS1123Subdomain(st.Class) {
				errs = append(errs, fmt.Errorf("%s.class %q is not a StorageClass name: %s", HolderStorageKey, st.Class, msg))
			}
		}
		if st.Size != nil && st.Size.Sign() == 0 && st.Class != "" {
			errs = append(errs, fmt.Errorf("%s.size must be more than 0: a claim has a size", HolderStorageKey))
		}
	}
	return errors.Join(errs...)
}

func (p VolumeHolderPolicy) storageSize() *resource.Quantity {
	if p.Storage == nil {
		return nil
	}
	return p.Storage.Size
}
