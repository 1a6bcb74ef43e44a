package integration

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// privatePipelineYAML gets an image that the node's registry serves only
// with credentials, as a task's image: (from a get without its layers,
// and from a get with them) and as an image_resource; and the same
// repository with a wrong password. MIRROR is the registry's address,
// PASSWORD the right password.
const privatePipelineYAML = `
resources:
- name: private
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/private/busybox, tag: "1", mirror: MIRROR, username: ` + cluster.PrivateUser + `, password: PASSWORD}
- name: wrong
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/private/busybox, tag: "1", mirror: MIRROR, username: ` + cluster.PrivateUser + `, password: not-the-password}
jobs:
- name: private
  plan:
  - get: private
    params: {skip_download: true}
  - task: without-layers
    image: private
    config:
      platform: linux
      run: {path: sh, args: [-c, 'echo "ran in the private image"']}
- name: layers
  plan:
  - get: private
  - task: with-layers
    image: private
    config:
      platform: linux
      run: {path: sh, args: [-c, 'echo "ran in the private image, fetched with its layers"']}
- name: image-resource
  plan:
  - task: from-image-resource
    config:
      platform: linux
      image_resource:
        type: registry-image
        source: {repository: ` + cluster.NodeRegistry + `/private/busybox, tag: "1", mirror: MIRROR, username: ` + cluster.PrivateUser + `, password: PASSWORD}
      run: {path: sh, args: [-c, 'echo "ran in a private image_resource"']}
- name: wrong
  plan:
  - get: wrong
`

// TestRealNodeConcoursePrivateImage: a registry-image resource whose
// source has a username and password, in a pipeline set with fly on a
// jetway target on the real node, through an unmodified web node. No pull
// secret is made by hand: the get's source gives the credentials, and
// each task's pod pulls its image (by digest, from a registry that
// answers 401 without them) with a pull secret of its own, which goes
// with the pod; the password reaches no log. The same repository with a
// wrong password fails its check, naming the registry's answer.
func TestRealNodeConcoursePrivateImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "private-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	const name = "rn-private"
	rn := startRealNode(t)
	// A task's pod holds its build dir for the web node, kept past its
	// destroy for keepGrace: its pull secret goes with it.
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		keepGrace: 5 * time.Second, resourceTypes: []wire.ResourceType{{Type: "registry-image", Image: rn.NodeImage("registry-image-image.tar"), Version: "test"}}})
	flyWorker(t, web, name, time.Minute, workerIn("running"))

	// Every pull secret made in the target namespace, as it comes.
	secrets := rn.Client.CoreV1().Secrets(name)
	w, err := secrets.Watch(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
	require.NoError(t, err)
	var mu sync.Mutex
	made := map[string]*corev1.Secret{}
	var watching sync.WaitGroup
	watching.Go(func() {
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*corev1.Secret); ok && ev.Type == watch.Added {
				mu.Lock()
				made[s.Name] = s
				mu.Unlock()
			}
		}
	})
	defer watching.Wait()
	defer w.Stop()

	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	yaml := strings.NewReplacer("MIRROR", rn.RegistryMirror(), "PASSWORD", cluster.PrivatePassword).Replace(privatePipelineYAML)
	writeFile(t, pipeline, []byte(yaml))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "p", "-c", pipeline)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "p")
	flyOK(ctx, t, web, 2*time.Minute, "check-resource", "-r", "p/private")

	for job, want := range map[string]string{
		"private":        "ran in the private image\r\n",
		"layers":         "ran in the private image, fetched with its layers",
		"image-resource": "ran in a private image_resource",
	} {
		out := flyOK(ctx, t, web, 3*time.Minute, "trigger-job", "-j", "p/"+job, "--watch")
		assert.Contains(t, out, want, job)
		assert.Contains(t, out, "succeeded", job)
	}
	assert.Contains(t, g.logs.String(), `"image":"`+cluster.NodeRegistry+`/private/busybox@sha256:`)

	// Each task's pod had its own pull secret, for the registry alone, and
	// each went with its pod.
	mu.Lock()
	n := len(made)
	for _, s := range made {
		assert.Equal(t, corev1.SecretTypeDockerConfigJson, s.Type)
		assert.Contains(t, string(s.Data[corev1.DockerConfigJsonKey]), `"`+cluster.NodeRegistry+`":`)
		require.Len(t, s.OwnerReferences, 1, s.Name)
		assert.Equal(t, "Pod", s.OwnerReferences[0].Kind)
		assert.Equal(t, s.Name, s.OwnerReferences[0].Name, "owned by the pod of its name")
	}
	mu.Unlock()
	assert.GreaterOrEqual(t, n, 3, "a pull secret per task")
	eventually(t, 2*time.Minute, func() error {
		list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return errorf("%d pull secrets left, the first %s", len(list.Items), list.Items[0].Name)
		}
		return nil
	})
	assert.NotContains(t, g.logs.String(), cluster.PrivatePassword, "the password reaches no log")
	// One per in that ran: the image_resource's get may take the layers
	// job's from the web node's resource cache (the same source, version
	// and params).
	kept := metricValue(t, g, `jetway_concourse_pull_credentials_total{event="kept"}`)
	assert.True(t, kept == 2 || kept == 3, "kept %v times", kept)
	assert.Equal(t, float64(n), metricValue(t, g, `jetway_concourse_pull_credentials_total{event="used"}`), "one per pull secret")

	fctx, fcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer fcancel()
	out, err := web.FlyContext(fctx, "check-resource", "-r", "p/wrong")
	require.Error(t, err, out)
	assert.Contains(t, out, cluster.NodeRegistry+" answered 401 Unauthorized")
}
