package steppod

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

// HolderName is the name of the pod keeping a Concourse web node's
// volumes on a target of installation (one per target namespace), and of
// its PersistentVolumeClaim when it has one.
func HolderName(installation string) string {
	sum := sha256.Sum256([]byte(installation))
	return "jetway-volumes-" + hex.EncodeToString(sum[:])[:10]
}

// HolderStorage is where t's volume holder keeps its volumes, as the
// gateway's defaults and t's target.yaml say: class "" is an emptyDir of
// the holder's size; else a claim of that class and size.
func HolderStorage(t *targets.Target, opts Options) (class string, size resource.Quantity) {
	d := opts.Steps.For(t.Config.Meta.Steps)
	if d.HolderStorageClass == "" {
		return "", d.HolderSize
	}
	return d.HolderStorageClass, d.HolderClaimSize
}

// HolderClaim is the PersistentVolumeClaim that keeps t's volume
// holder's volumes, or nil when they live in an emptyDir: ReadWriteOnce,
// of the class and size HolderStorage says, labelled as the holder and
// sealed for no team (ownership.Key.Sealed), so that jetway tells its own
// from one planted in its name.
func HolderClaim(t *targets.Target, opts Options) (*corev1.PersistentVolumeClaim, error) {
	class, size := HolderStorage(t, opts)
	if class == "" {
		return nil, nil
	}
	if size.Sign() <= 0 {
		return nil, fmt.Errorf("the volume holder's claim of class %s has no size: set %s.size in the target's target.yaml, "+
			"or the gateway's volume-holder-size", class, targets.HolderStorageKey)
	}
	name := HolderName(opts.Installation)
	labels := ownership.Labels(t.Name(), opts.Installation)
	labels[targets.VolumeHolderLabel] = "concourse"
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.Namespace(), Labels: labels,
			Annotations: map[string]string{ownership.SealAnnotation: opts.Key.Seal(t.Name(), name, "")}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}, nil
}

// ClaimSize is what claim asks for: the capacity of the holder on it.
func ClaimSize(claim *corev1.PersistentVolumeClaim) resource.Quantity {
	return claim.Spec.Resources.Requests[corev1.ResourceStorage]
}

// HolderClaimName is the claim holder p mounts, "" for an emptyDir.
func HolderClaimName(p *corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.Name == sharedVolume && v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// HolderImagePort names the holder sidecar's port that serves images.
const HolderImagePort = "images"

// HolderPod is the pod keeping a Concourse web node's volumes on t:
// the volume sidecar alone, serving claim (made first, HolderClaim) or,
// when claim is nil, an emptyDir of the holder's size, sealed for no
// team, so that only the gateway, with the pod's token, and jetway's
// admins reach it. It is the step pods' sidecar, so the same image and
// limits; it holds what the web node streams in, not a step.
func HolderPod(t *targets.Target, opts Options, claim *corev1.PersistentVolumeClaim) (*corev1.Pod, error) {
	name := HolderName(opts.Installation)
	labels := ownership.Labels(t.Name(), opts.Installation)
	labels[targets.VolumeHolderLabel] = "concourse"
	meta := t.Config.Meta
	size, storage := opts.Steps.For(meta.Steps).HolderSize, emptyDir(opts.Steps.For(meta.Steps).HolderSize)
	origin := ""
	if claim != nil {
		if claim.Name == "" {
			return nil, errors.New("the volume holder's claim has no name")
		}
		size, origin = ClaimSize(claim), "claim"
		storage = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}
	}
	no := false
	seal, tokenHash := opts.seal(t.Name(), name, "")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.Namespace(), Labels: labels, Annotations: seal},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyAlways,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			NodeSelector:                 meta.NodeSelector,
			Tolerations:                  meta.Tolerations,
			Volumes:                      []corev1.Volume{{Name: sharedVolume, VolumeSource: storage}},
			Containers:                   []corev1.Container{opts.sidecar(tokenHash, meta.Steps.AllowPrivileged)},
		},
	}
	for _, s := range meta.ImagePullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	// Its sidecar alone writes its emptyDir (its claim): it refuses a
	// write past the size limit rather than let the kubelet evict the
	// holder, and every team's volumes with it (or fill the claim); its
	// cow volumes share their parent's files by hard links, which only
	// the sidecar writes, never in place. A step pod's sidecar gets
	// neither: its step writes there too.
	sidecar := &pod.Spec.Containers[0]
	sidecar.Command = append(sidecar.Command, "--link-copies")
	// It serves the rootfs it keeps as images on a port of its own, to
	// pulls with a ticket the gateway registered for that volume alone
	// (steps.volumeHolder.images puts a NodePort Service before it).
	sidecar.Command = append(sidecar.Command, "--images-listen", ":"+strconv.Itoa(stepagent.ImagePort))
	sidecar.Ports = append(sidecar.Ports, corev1.ContainerPort{Name: HolderImagePort, ContainerPort: stepagent.ImagePort})
	if !size.IsZero() {
		sidecar.Command = append(sidecar.Command, "--capacity", strconv.FormatInt(size.Value(), 10))
		if origin != "" {
			sidecar.Command = append(sidecar.Command, "--capacity-of", origin)
		}
	}
	return pod, nil
}
