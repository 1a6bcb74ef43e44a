package concourse

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// A stock worker runs any rootfs the web node hands it; a pod runs only
// an image its node's runtime pulls. So a rootfs in a volume (a task's
// built image, a mirror_self get's, an unpacked resource type's) is
// served by the volume holder that keeps it, as a one-layer OCI image
// (volumes.Server.ServeImages), and the container's pod names it
// localhost:<nodePort>/jetway/<handle>@sha256:<manifest>: the holder's
// NodePort Service (steps.volumeHolder.images) makes the holder answer on
// every node's loopback, where container runtimes pull over plain HTTP.
// The Service has no selector, which a pod planted in the namespace could
// match: its EndpointSlice names the holder pod's address alone, and both
// are owned by the holder pod, so they go with it. A pull needs a ticket
// the gateway registered with the holder for that volume alone, given to
// the pod's kubelet in the pod's own pull secret (pullcreds.go), which
// goes with the pod.

// servedImageGrace is how long a container's pull of a holder's image
// may meet a node port nothing answers: the node's kube-proxy writes its
// rules a moment after the Service is made, and the kubelet pulls again
// after its back-off (10 s, then 20 s).
const servedImageGrace = time.Minute

// nodePortNotYet reports whether a kubelet's pull message for image says
// a holder's node port refused the connection.
func nodePortNotYet(image, msg string) bool {
	return strings.HasPrefix(image, "localhost:") && strings.Contains(image, "/jetway/") && strings.Contains(msg, "connection refused")
}

// imageTicketTTL is how long a container's pull ticket opens its image:
// its pod's start, its image pull and the pull's retries.
const imageTicketTTL = 2 * time.Hour

// imagePuller is the user name a pull ticket is given with (the holder
// reads the password alone).
const imagePuller = "jetway"

// servedImage is the image of the rootfs at path rootfs in volume handle
// of cluster target t, served by t's volume holder, and the credential
// that pulls it.
func (c *Containers) servedImage(ctx context.Context, t *targets.Target, rootfs, handle string) (string, *pullCredential, error) {
	if t.Config.Meta.Steps.VolumeHolder.Images == "" {
		return "", nil, fmt.Errorf("image %s: volume %s holds a rootfs, not a registry's image, and worker %s serves no rootfs as an image: "+
			"set %s: %s in its target.yaml (docs/concourse.md, Images built in a task), or push the rootfs to a registry and use a registry-image get of it",
			rootfs, handle, t.Name(), targets.HolderImagesKey, targets.ImagesNodePort)
	}
	holder, err := c.imageHolder(t)
	if err != nil {
		return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
	}
	nodePort, err := holderImageService(ctx, t, holder)
	if err != nil {
		return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	password := hex.EncodeToString(secret)
	manifest, err := c.registerImage(ctx, t.Name(), handle, password)
	if err != nil {
		return "", nil, fmt.Errorf("image %s: %w", rootfs, err)
	}
	repo := fmt.Sprintf("localhost:%d/jetway/%s", nodePort, handle)
	return repo + "@" + manifest, &pullCredential{Repository: repo, Digest: manifest, Username: imagePuller, Password: password}, nil
}

// serveImages makes the Service of t's running holder pod name, once
// per pod, where the target serves images: made as the holder starts,
// the nodes' kube-proxy has its rules in place before a container pulls
// through it (a pull a moment after the Service is made meets a port
// nothing answers yet). One that fails is made again by the first
// container that needs it (servedImage), which says why.
func (h *Holder) serveImages(ctx context.Context, t *targets.Target, name string) {
	p := t.CachedPod(name)
	if t.Config.Meta.Steps.VolumeHolder.Images == "" || p == nil || p.Status.PodIP == "" {
		return
	}
	if _, ok := h.served.Load(p.UID); ok {
		return
	}
	if _, err := holderImageService(ctx, t, p); err != nil {
		h.logger().Warn("volume holder's images not served", "target", t.Name(), "pod", name, "error", err.Error())
		return
	}
	h.served.Store(p.UID, true)
}

// unpackedGet is the holder's image of a registry-image get's rootfs/
// (fetched with its layers), ok false where there is none to serve: the
// target serves no images, or the get skipped its layers. So the layers
// come from the registry once, to the get, whether or not the pipeline
// says skip_download; the node pulls them from the holder, not the
// registry again. A holder that cannot serve it leaves the pull to the
// registry, as without the setting, and says why in the log.
func (c *Containers) unpackedGet(ctx context.Context, target, rootfs, handle string) (string, *pullCredential, bool) {
	t, err := listed(c.Holder.Targets, target)
	if err != nil || t == nil || t.Config.Meta.Steps.VolumeHolder.Images == "" {
		return "", nil, false
	}
	ref, cred, err := c.servedImage(ctx, t, rootfs, handle)
	switch {
	case errors.Is(err, errNoRootfs):
		return "", nil, false
	case err != nil:
		c.logger().Warn("registry-image get's rootfs not served: its image is pulled from its registry", "target", target,
			"volume", handle, "error", err.Error())
		return "", nil, false
	}
	return ref, cred, true
}

// errNoRootfs: the volume has no rootfs folder to serve (a get that
// skipped its layers).
var errNoRootfs = errors.New("no rootfs folder")

// imageHolder is t's volume holder pod, running with an address and
// serving images.
func (c *Containers) imageHolder(t *targets.Target) (*corev1.Pod, error) {
	name, err := c.Holder.holderPod(t, c.Holder.Pod())
	if err != nil {
		return nil, err
	}
	p := t.CachedPod(name)
	if p == nil || p.Status.PodIP == "" {
		return nil, fmt.Errorf("the volume holder pod %s/%s has no address yet", t.Namespace(), name)
	}
	serves := slices.ContainsFunc(p.Spec.Containers, func(ct corev1.Container) bool {
		return slices.ContainsFunc(ct.Ports, func(pt corev1.ContainerPort) bool { return pt.Name == steppod.HolderImagePort })
	})
	if !serves {
		return nil, fmt.Errorf("the volume holder pod %s/%s was made by a jetway that served no image: "+
			"it serves them once it is made again (delete it; its volumes go with it unless it keeps them on a claim)", t.Namespace(), name)
	}
	return p, nil
}

// registerImage registers a pull ticket for the rootfs of volume handle
// with target's holder: the secret whose SHA-256 it is opens that image
// alone, until it expires. It is the image's manifest digest.
func (c *Containers) registerImage(ctx context.Context, target, handle, secret string) (string, error) {
	send, err := c.Holder.volumes(target)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(secret))
	body, _ := json.Marshal(map[string]string{"path": "rootfs", "ticket_sha256": hex.EncodeToString(sum[:]),
		"expires": time.Now().Add(imageTicketTTL).UTC().Format(time.RFC3339)})
	ctx, cancel := context.WithTimeout(ctx, imageRegistration)
	defer cancel()
	resp, err := send(ctx, http.MethodPost, "/volumes/"+url.PathEscape(handle)+"/image", nil,
		http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("serve volume %s as an image: %w", handle, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("serve volume %s as an image: the volume holder answered %s: %s", handle, resp.Status, bytes.TrimSpace(b))
		if resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("%w: %w", errNoRootfs, err)
		}
		return "", err
	}
	var img struct {
		Manifest string `json:"manifest"`
	}
	if err := json.Unmarshal(b, &img); err != nil || img.Manifest == "" {
		return "", fmt.Errorf("serve volume %s as an image: the volume holder answered no manifest digest: %q", handle, b)
	}
	return img.Manifest, nil
}

// imageRegistration bounds the registration: the first one of a volume
// reads all of its rootfs once, for the layer's digest (a few seconds
// a GiB).
const imageRegistration = 10 * time.Minute

// holderImageService makes, or finds, the NodePort Service of t's volume
// holder pod and its EndpointSlice naming the holder alone, and is the
// Service's node port. A Service of the name that is not this holder's
// (its last holder's, not yet collected, or made by someone else) is
// replaced.
func holderImageService(ctx context.Context, t *targets.Target, holder *corev1.Pod) (int32, error) {
	svc, err := ensureHolderService(ctx, t, holder)
	if err == nil {
		err = ensureHolderEndpoints(ctx, t, holder)
	}
	if apierrors.IsForbidden(err) {
		return 0, fmt.Errorf("serve the volume holder's images on the target's nodes (%s): %w: "+
			"grant create, get and delete on services and create, get and update on endpointslices (discovery.k8s.io) in %s",
			targets.HolderImagesKey, err, t.Namespace())
	}
	if err != nil {
		return 0, fmt.Errorf("serve the volume holder's images on the target's nodes (%s): %w", targets.HolderImagesKey, err)
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == steppod.HolderImagePort && p.NodePort > 0 {
			return p.NodePort, nil
		}
	}
	return 0, fmt.Errorf("the volume holder's Service %s/%s has no node port for %q", t.Namespace(), svc.Name, steppod.HolderImagePort)
}

// ownedBy reports whether m is owned by the pod whose UID is uid.
func ownedBy(m metav1.Object, uid string) bool {
	return slices.ContainsFunc(m.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return string(o.UID) == uid })
}

// holderOwner makes holder the owner of what serves its images.
func holderOwner(holder *corev1.Pod) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: holder.Name, UID: holder.UID}}
}

func ensureHolderService(ctx context.Context, t *targets.Target, holder *corev1.Pod) (*corev1.Service, error) {
	svcs := t.Core.Services(t.Namespace())
	svc, err := svcs.Get(ctx, holder.Name, metav1.GetOptions{})
	switch {
	case err == nil && ownedBy(svc, string(holder.UID)):
		return svc, nil
	case err == nil:
		err = svcs.Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &svc.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("replace the Service %s of another pod: %w", svc.Name, err)
		}
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: holder.Name, Labels: maps.Clone(holder.Labels), OwnerReferences: holderOwner(holder)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{
			Name: steppod.HolderImagePort, Protocol: corev1.ProtocolTCP,
			Port: stepagent.ImagePort, TargetPort: intstr.FromInt32(stepagent.ImagePort)}}},
	}
	svc, err = svcs.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) { // another replica's, a moment before
		if svc, err = svcs.Get(ctx, holder.Name, metav1.GetOptions{}); err == nil && !ownedBy(svc, string(holder.UID)) {
			err = fmt.Errorf("the Service %s is another pod's", holder.Name)
		}
	}
	return svc, err
}

func ensureHolderEndpoints(ctx context.Context, t *targets.Target, holder *corev1.Pod) error {
	family := discoveryv1.AddressTypeIPv4
	if strings.Contains(holder.Status.PodIP, ":") {
		family = discoveryv1.AddressTypeIPv6
	}
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: holder.Name, OwnerReferences: holderOwner(holder), Labels: map[string]string{
			discoveryv1.LabelServiceName: holder.Name, discoveryv1.LabelManagedBy: "jetway"}},
		AddressType: family,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{holder.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To(holder.Spec.NodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: holder.Namespace, Name: holder.Name, UID: holder.UID},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(steppod.HolderImagePort), Protocol: ptr.To(corev1.ProtocolTCP),
			Port: ptr.To[int32](stepagent.ImagePort)}},
	}
	eps := t.Discovery.EndpointSlices(t.Namespace())
	have, err := eps.Get(ctx, holder.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = eps.Create(ctx, want, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case ownedBy(have, string(holder.UID)) && len(have.Endpoints) == 1 &&
		slices.Equal(have.Endpoints[0].Addresses, want.Endpoints[0].Addresses):
		return nil
	}
	// Another holder's, or changed: it names this holder alone again.
	want.ResourceVersion = have.ResourceVersion
	_, err = eps.Update(ctx, want, metav1.UpdateOptions{})
	return err
}
