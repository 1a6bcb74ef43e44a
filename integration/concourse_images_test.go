package integration

import (
	"context"
	"encoding/json"
	"maps"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	gclient "code.cloudfoundry.org/garden/client"
	gconn "code.cloudfoundry.org/garden/client/connection"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// TestConcourseRootfsImages: a container whose image is a rootfs in a
// volume (no registry-image get's) runs the holder's image of it, on a
// target whose target.yaml says steps.volumeHolder.images: its pod names
// localhost:<nodePort>/jetway/<volume>@sha256:<manifest>, with a pull
// secret of its own for that host; the holder's Service has no selector,
// and its EndpointSlice names the holder pod's address alone, both owned
// by the holder. A Service of that name planted before, with a selector
// any pod could match, is replaced. A target without the setting refuses
// the container naming the key; one with it but without the grants is
// not running, naming them.
func TestConcourseRootfsImages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const name, off, ungranted = "cri", "cri-off", "cri-ungranted"
	const yaml = "steps:\n  volumeHolder: {images: NodePort}\n"
	placeTargetGranting(ctx, t, clusters[0], dir, name, yaml, "", slices.Concat(targets.Required, targets.ImagePermissions))
	placeTarget(ctx, t, clusters[0], dir, off, "{}\n", "")
	placeTarget(ctx, t, clusters[1], dir, ungranted, yaml, "")
	holder := steppod.HolderName("jetway")
	// Planted: a Service of the holder's name selecting any pod that
	// says it is a holder.
	planted, err := clusters[0].Client.CoreV1().Services(name).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: holder},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{targets.VolumeHolderLabel: "concourse"},
			Ports: []corev1.ServicePort{{Name: "images", Port: 7789}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, name, 30*time.Second, running)
	g.waitTarget(t, off, 30*time.Second, running)
	tg := g.waitTarget(t, ungranted, 30*time.Second, func(tg api.Target) bool { return tg.State != "running" && len(tg.MissingPermissions) > 0 })
	assert.Contains(t, strings.Join(tg.MissingPermissions, " "), "services", "the grants the setting needs are checked")

	// volume makes a volume holding a rootfs and its metadata.json on
	// target; run creates a container whose image is its rootfs.
	volume := func(target, handle string) string {
		srv := httptest.NewServer(g.holder.API(target))
		defer srv.Close()
		v := createVolume(t, srv.URL, map[string]any{"handle": handle, "strategy": map[string]any{"type": "empty"}})
		streamIn(t, srv.URL, v.Handle, map[string]string{"rootfs/bin/hello": "#!/bin/sh\necho hello\n",
			"metadata.json": `{"env":["GREETING=hi"],"user":"1234"}`})
		return v.Path
	}
	run := func(target, handle, path string) (*corev1.Pod, error) {
		gsrv := httptest.NewServer(g.containers.API(target))
		defer gsrv.Close()
		gc := gclient.New(gconn.New("tcp", strings.TrimPrefix(gsrv.URL, "http://")))
		if _, err := gc.Create(garden.ContainerSpec{Handle: handle, RootFSPath: "raw://" + path + "/rootfs"}); err != nil {
			return nil, err
		}
		p := containerPods(ctx, t, clusters[0].Client.CoreV1().Pods(target), handle)
		require.Len(t, p, 1)
		return &p[0], nil
	}

	_, err = run(off, "cri-refused", volume(off, "cri-off-vol"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "set "+targets.HolderImagesKey+": NodePort in its target.yaml")

	vol := volume(name, "cri-vol")
	p, err := run(name, "cri-served", vol)
	require.NoError(t, err)
	image := p.Spec.Containers[0].Image
	m := regexp.MustCompile(`^localhost:([0-9]+)/jetway/cri-vol@sha256:[0-9a-f]{64}$`).FindStringSubmatch(image)
	require.NotNil(t, m, image)
	require.Len(t, p.Spec.ImagePullSecrets, 1, "a pull secret of its own")
	eventually(t, 30*time.Second, func() error {
		s, err := clusters[0].Client.CoreV1().Secrets(name).Get(ctx, p.Spec.ImagePullSecrets[0].Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var cfg struct {
			Auths map[string]json.RawMessage `json:"auths"`
		}
		require.NoError(t, json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &cfg))
		assert.Equal(t, []string{"localhost:" + m[1]}, slices.Collect(maps.Keys(cfg.Auths)), "for the holder's node port alone")
		return nil
	})

	hp, err := clusters[0].Client.CoreV1().Pods(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	svc, err := clusters[0].Client.CoreV1().Services(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, planted.UID, svc.UID, "the planted Service is replaced")
	assert.Empty(t, svc.Spec.Selector, "no selector a planted pod could match")
	assert.Equal(t, m[1], strconv.Itoa(int(svc.Spec.Ports[0].NodePort)), "the pod pulls through the holder's node port")
	require.Len(t, svc.OwnerReferences, 1)
	assert.Equal(t, hp.UID, svc.OwnerReferences[0].UID, "owned by the holder, so it goes with it")
	slice, err := clusters[0].Client.DiscoveryV1().EndpointSlices(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, slice.Endpoints, 1)
	assert.Equal(t, []string{hp.Status.PodIP}, slice.Endpoints[0].Addresses, "the holder's address alone")
	assert.Equal(t, holder, slice.Labels["kubernetes.io/service-name"])
	assert.Equal(t, hp.UID, slice.OwnerReferences[0].UID)

	// The same volume again: the same image, its layer made once.
	again, err := run(name, "cri-served-again", vol)
	require.NoError(t, err)
	assert.Equal(t, image, again.Spec.Containers[0].Image, "the same volume, the same image")
}
