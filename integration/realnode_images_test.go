package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// imagesPipeline starts a web node and a gateway owning target name on
// the real node, which serves rootfs images from its holder and offers
// types as base resource types, and sets and unpauses pipeline p of
// pipelineYAML there.
func imagesPipeline(ctx context.Context, t *testing.T, name, pipelineYAML string, types ...wire.ResourceType) (*cwn.WebNode, *gateway) {
	t.Helper()
	client := cwn.Client{ID: "jetway", Secret: name + "-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		keepGrace: 5 * time.Second, images: true, targetYAML: "steps:\n  volumeHolder: {images: NodePort}\n", resourceTypes: types})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(pipelineYAML))
	flyOK(ctx, t, web, time.Minute, "set-pipeline", "-n", "-p", "p", "-c", pipeline)
	flyOK(ctx, t, web, time.Minute, "unpause-pipeline", "-p", "p")
	return web, g
}

// builtImagePipelineYAML builds a rootfs in one task (the node's busybox,
// plus a root-only file, a file of another owner, a hard link and a
// marker) with a metadata.json giving env and user, and runs the next
// task in it, as `image:` of that output; and runs a task in a
// registry-image get, with its layers and without. MIRROR is the node
// registry's address.
const builtImagePipelineYAML = `
resources:
- name: busybox
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
jobs:
- name: unpacked
  plan:
  - get: busybox
  - task: in-the-get
    image: busybox
    config:
      platform: linux
      run: {path: sh, args: [-c, 'echo "ran in the unpacked get"']}
- name: layer-free
  plan:
  - get: busybox
    params: {skip_download: true}
  - task: in-the-registry
    image: busybox
    config:
      platform: linux
      run: {path: sh, args: [-c, 'echo "ran in the registry image"']}
- name: built
  plan:
  - task: build
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      outputs: [{name: image}]
      run:
        path: sh
        args:
        - -ec
        - |
          mkdir -p image/rootfs/tmp image/rootfs/home
          for d in bin sbin usr etc lib; do [ -e /$d ] && cp -a /$d image/rootfs/; done
          chmod 1777 image/rootfs/tmp
          echo built-in-a-task > image/rootfs/marker
          ln image/rootfs/marker image/rootfs/marker-link
          echo secret > image/rootfs/root-only; chmod 600 image/rootfs/root-only
          echo theirs > image/rootfs/home/theirs; chown 1234:1234 image/rootfs/home/theirs
          echo '{"env":["GREETING=from the metadata","PATH=/usr/sbin:/usr/bin:/sbin:/bin"],"user":"1234"}' > image/metadata.json
          echo built
  - task: use
    image: image
    config:
      platform: linux
      run:
        path: sh
        args:
        - -c
        - |
          echo "greeting: $GREETING"
          echo "uid: $(id -u)"
          cat /marker
          stat -c 'links %h' /marker-link
          stat -c 'theirs %u %a' /home/theirs
          stat -c 'root-only %u %a' /root-only
          cat /root-only 2>/dev/null || echo "root-only unreadable"
`

// TestRealNodeConcourseBuiltImage: a rootfs a task built runs as the
// next task's image on a jetway target on the real node, through an
// unmodified web node and real fly (issue 42 item 1): with its
// metadata.json's env and user, every file as the task wrote it (owners,
// modes, a hard link), pulled by the node's containerd from the target's
// volume holder through its NodePort Service (the node's kube-proxy),
// with a pull secret of the container's own that goes with its pod; a
// second build too. A task in a registry-image get with its layers runs
// the holder's image of them, so the node does not download them from
// the registry a second time; one without its layers, the registry's.
func TestRealNodeConcourseBuiltImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const name = "rn-built"
	rn := startRealNode(t)
	web, g := imagesPipeline(ctx, t, name, strings.ReplaceAll(builtImagePipelineYAML, "MIRROR", rn.RegistryMirror()),
		wire.ResourceType{Type: "registry-image", Image: rn.NodeImage("registry-image-image.tar"), Version: "test"})
	out := flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "p/built", "--watch")
	for _, want := range []string{"greeting: from the metadata", "uid: 1234", "built-in-a-task", "links 2",
		"theirs 1234 644", "root-only 0 600", "root-only unreadable", "succeeded"} {
		assert.Contains(t, out, want)
	}
	logs := g.logs.String()
	assert.Regexp(t, `"image":"localhost:[0-9]+/jetway/[0-9a-f-]+@sha256:[0-9a-f]{64}"`, logs, "the pod ran the holder's image of the rootfs")

	// The holder's Service and its EndpointSlice, owned by the holder.
	holder := steppod.HolderName("jetway")
	svc, err := rn.Client.CoreV1().Services(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "NodePort", string(svc.Spec.Type))
	assert.Empty(t, svc.Spec.Selector, "no selector a planted pod could match")
	require.Len(t, svc.OwnerReferences, 1)
	assert.Equal(t, holder, svc.OwnerReferences[0].Name)
	eventually(t, 2*time.Minute, func() error {
		list, err := rn.Client.CoreV1().Secrets(name).List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return errorf("%d pull secrets left, the first %s", len(list.Items), list.Items[0].Name)
		}
		return nil
	})

	again := flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "p/built", "--watch")
	assert.Contains(t, again, "built-in-a-task")
	assert.Contains(t, again, "succeeded")
	assert.Equal(t, 2, strings.Count(g.logs.String(), `"image":"localhost:`), "a container in the built image per build")

	// A registry-image get with its layers: the task runs the holder's
	// image of its rootfs, so the node does not download the layers from
	// the registry again (item 3); without its layers, the registry's.
	flyOK(ctx, t, web, 2*time.Minute, "check-resource", "-r", "p/busybox")
	out = flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "p/unpacked", "--watch")
	assert.Contains(t, out, "ran in the unpacked get")
	assert.Equal(t, 3, strings.Count(g.logs.String(), `"image":"localhost:`), "the get's rootfs, served by the holder")
	assert.NotContains(t, g.logs.String(), `"image":"`+cluster.NodeRegistry+`/busybox@sha256:`)
	out = flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "p/layer-free", "--watch")
	assert.Contains(t, out, "ran in the registry image")
	assert.Contains(t, g.logs.String(), `"image":"`+cluster.NodeRegistry+`/busybox@sha256:`, "no rootfs to serve: the registry's image")
}

// mirroredImagePipelineYAML runs tasks in the rootfs of Concourse's mock
// resource type as testflight does in nearly every spec: an
// image_resource of type mock with mirror_self, whose get copies the
// resource container's own root into rootfs/ with a metadata.json
// (MIRRORED_VERSION in its env, user root), and the same as a get used
// as a task's image:.
const mirroredImagePipelineYAML = `
resources:
- name: mirrored
  type: mock
  source: {mirror_self: true, initial_version: v1}
jobs:
- name: image-resource
  plan:
  - task: in-the-mirror
    config:
      platform: linux
      image_resource:
        type: mock
        source: {mirror_self: true, initial_version: v2}
      run: {path: sh, args: [-c, 'echo "mirrored $MIRRORED_VERSION as $(id -u)"; ls /opt/resource | tr "\n" " "; echo']}
- name: get-as-image
  plan:
  - get: mirrored
  - task: in-the-get
    image: mirrored
    config:
      platform: linux
      run: {path: bash, args: [-c, 'echo "got $MIRRORED_VERSION in bash $BASH_VERSION"']}
`

// TestRealNodeConcourseMirroredImage: a task whose image is a mock
// resource's mirror_self get, as an image_resource and as a get used as
// image:, runs on a jetway target on the real node (issue 42): the web
// node runs the mock type's check and get in jetway's image of
// Concourse's mock resource type, and each task then runs in the rootfs
// the get copied, with its metadata's env, served by the target's holder.
func TestRealNodeConcourseMirroredImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rn := startRealNode(t)
	web, g := imagesPipeline(ctx, t, "rn-mirror", mirroredImagePipelineYAML,
		wire.ResourceType{Type: "mock", Image: rn.NodeImage("mock-image.tar"), Version: "0.14.2"})
	out := flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "p/image-resource", "--watch")
	assert.Contains(t, out, "mirrored v2 as 0")
	assert.Contains(t, out, "check in out")
	assert.Contains(t, out, "succeeded")
	assert.Regexp(t, `"image":"localhost:[0-9]+/jetway/[0-9a-f-]+@sha256:[0-9a-f]{64}"`, g.logs.String(), "the pod ran the holder's image of the mirrored rootfs")

	flyOK(ctx, t, web, 2*time.Minute, "check-resource", "-r", "p/mirrored")
	out = flyOK(ctx, t, web, 4*time.Minute, "trigger-job", "-j", "p/get-as-image", "--watch")
	assert.Regexp(t, `got v1 in bash [0-9]`, out)
	assert.Contains(t, out, "succeeded")

	// fly intercept into the check container, in the mock type's image,
	// as testflight's team-scoping spec does.
	out = flyOK(ctx, t, web, time.Minute, "intercept", "-c", "p/mirrored", "hostname")
	assert.Contains(t, out, "concourse-", "the check container's pod's name")
}
