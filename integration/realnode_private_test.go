package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// TestRealNodePrivateImage: a pod whose image needs credentials
// (NodeRegistry/private/busybox, by digest) runs on a real kubelet when its
// imagePullSecrets name a kubernetes.io/dockerconfigjson Secret keyed by the
// image's registry host, though containerd reaches that registry through a
// hosts.toml mirror on another host: containerd sends the pod's credentials
// to the mirror. Without a Secret, or with a wrong password, the pull
// fails with the registry's 401. Every pod pulls (PullAlways): an image a
// pod pulled before is no proof that the next one may.
func TestRealNodePrivateImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	ns, err := rn.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rn-private-"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	releaseOnCleanup(t, rn, ns.Name)
	// The namespace's default service account, which pods need.
	_, err = rn.CreateTarget(ctx, cluster.TargetOptions{Namespace: ns.Name})
	require.NoError(t, err)
	digest := servedDigest(ctx, t, rn, "busybox", "1")
	image := cluster.NodeRegistry + "/" + cluster.PrivateRepository + "busybox@" + digest

	for name, password := range map[string]string{"right": cluster.PrivatePassword, "wrong": "not-the-password"} {
		_, err := rn.Client.CoreV1().Secrets(ns.Name).Create(ctx, pullSecret(t, name, cluster.PrivateUser, password), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for pod, secret := range map[string]string{"with-secret": "right", "without-secret": "", "wrong-password": "wrong"} {
		createPrivatePod(ctx, t, rn, ns.Name, pod, image, secret)
	}

	t.Run("with the secret", func(t *testing.T) {
		pod := waitRunning(ctx, t, rn.Client, ns.Name, "with-secret")
		require.Len(t, pod.Status.ContainerStatuses, 1)
		assert.True(t, strings.HasSuffix(pod.Status.ContainerStatuses[0].ImageID, "@"+digest),
			"busybox's manifest, pulled by digest: %q", pod.Status.ContainerStatuses[0].ImageID)
	})
	t.Run("without a secret", func(t *testing.T) {
		waiting := waitPullFailure(ctx, t, rn, ns.Name, "without-secret")
		// The registry's 401 with a Basic challenge, which containerd
		// cannot answer without credentials.
		assert.Contains(t, waiting.Message, "may require authorization", "%+v", waiting)
		assert.Contains(t, waiting.Message, "no basic auth credentials", "%+v", waiting)
	})
	t.Run("with a wrong password", func(t *testing.T) {
		waiting := waitPullFailure(ctx, t, rn, ns.Name, "wrong-password")
		assert.Contains(t, waiting.Message, "401 Unauthorized", "%+v", waiting)
		assert.Contains(t, waiting.Message, rn.RegistryMirror()+"/v2/"+cluster.PrivateRepository+"busybox/", "the mirror answered")
	})
}

// servedDigest is the digest of the manifest NodeRegistry serves for
// repository:tag, read from the registry as a client would.
func servedDigest(ctx context.Context, t *testing.T, rn *cluster.Cluster, repository, tag string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, rn.RegistryMirror()+"/v2/"+repository+"/manifests/"+tag, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s:%s", repository, tag)
	digest := resp.Header.Get("Docker-Content-Digest")
	require.True(t, strings.HasPrefix(digest, "sha256:"), "%q", digest)
	return digest
}

// pullSecret is a kubernetes.io/dockerconfigjson Secret with user and
// password for NodeRegistry, keyed by its host as `kubectl create secret
// docker-registry --docker-server registry.jetway.test` writes it.
func pullSecret(t *testing.T, name, user, password string) *corev1.Secret {
	t.Helper()
	config, err := json.Marshal(map[string]any{"auths": map[string]any{cluster.NodeRegistry: map[string]string{
		"username": user, "password": password,
		"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password)),
	}}})
	require.NoError(t, err)
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: config}}
}

// createPrivatePod creates a pod that sleeps in image, pulled with the
// pull secret named secret ("" for none).
func createPrivatePod(ctx context.Context, t *testing.T, rn *cluster.Cluster, ns, name, image, secret string) {
	t.Helper()
	no, grace := false, int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullAlways,
				Command: []string{"sleep", "600"},
			}}},
	}
	if secret != "" {
		pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: secret}}
	}
	_, err := rn.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
}

// waitPullFailure waits until the pod's container waits because its image
// pull failed (ErrImagePull, or ImagePullBackOff, whose message carries
// the pull's error), and returns why.
func waitPullFailure(ctx context.Context, t *testing.T, rn *cluster.Cluster, ns, name string) *corev1.ContainerStateWaiting {
	t.Helper()
	var waiting *corev1.ContainerStateWaiting
	eventually(t, 60*time.Second, func() error {
		pod, err := rn.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, s := range pod.Status.ContainerStatuses {
			if w := s.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				waiting = w
				return nil
			}
		}
		return fmt.Errorf("pod %s/%s is %q: %+v", ns, name, pod.Status.Phase, pod.Status.ContainerStatuses)
	})
	return waiting
}
