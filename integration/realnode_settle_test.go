package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/volumes"
)

// settlePipeline: job fetch gets SIZE random bytes (the test resource's
// in writes them, printing their SHA-256) and reads nothing; job use gets
// the same version with the same params, which the web node finds in the
// get's volume on the worker, and checks what a task reads of it.
const settlePipeline = `
resource_types:
- name: test-type
  type: registry-image
  check_every: never
  source: {repository: ` + cluster.NodeRegistry + `/busybox, tag: "1", mirror: MIRROR}
resources:
- name: big
  type: test-type
  check_every: never
  source: {uri: git://big}
jobs:
- name: fetch
  plan:
  - get: big
    params: {bytes: SIZE}
- name: use
  plan:
  - get: big
    params: {bytes: SIZE}
  - task: read
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: big}]
      run: {path: sh, args: [-ec, 'test "$(sha256sum big/big | cut -d" " -f1)" = "$(cat big/big.sum)"; echo "read intact $(cat big/big.sum)"']}
`

// TestRealNodeConcourseSettleOutlivesAKilledReplica (issue 41): two
// gateway processes share a target on the real node. A get's files stay
// in its pod after the build (held: nobody read them); once the web node
// destroyed the get's container and concourse-keep-grace passed, the
// replica that registers the target copies them into the holder at its
// sweep (settles them). That replica is SIGKILLed mid-copy. The other
// takes the registration over and settles the volume itself; the copy the
// dead one left is reported to the web node once the volume is settled,
// and destroyed; the kept pod goes; and the next build finds the get's
// files in the worker's cache, intact, without fetching them again.
func TestRealNodeConcourseSettleOutlivesAKilledReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const name, size = "rn-settle", 256 << 20 // over a second to copy on this machine: time to kill mid-copy
	rn := startRealNode(t)
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second, GCInterval: time.Second})
	dir := t.TempDir()
	placeTarget(ctx, t, rn, dir, name, "{}\n", "")
	types := filepath.Join(t.TempDir(), "types.yaml")
	writeFile(t, types, []byte("registry-image: "+rn.NodeImage("registry-image-image.tar")+"\n"))
	rs := replicas(t, dir, "--concourse-tsa", web.TSAAddr, "--concourse-tsa-public-key", web.TSAPublicKey,
		"--concourse-worker-key", web.WorkerKey, "--concourse-resource-types", types,
		"--step-agent-image", rn.NodeImage("step-agent-image.tar"), "--step-agent-mount", string(steppod.AgentImageVolume),
		"--concourse-sweep-interval", "1s", "--concourse-keep-grace", "3s")
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	bases := []string{rs[0].base(), rs[1].base()}
	i := oneRegisters(t, bases, []string{name}, 30*time.Second)
	owner, other := rs[i], rs[1-i]

	fly := func(within time.Duration, args ...string) string {
		t.Helper()
		return flyOK(ctx, t, web, within, args...)
	}
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	yaml := strings.NewReplacer("MIRROR", rn.RegistryMirror(), "SIZE", strconv.Itoa(size)).Replace(settlePipeline)
	writeFile(t, pipeline, []byte(yaml))
	fly(time.Minute, "set-pipeline", "-n", "-p", "settle", "-c", pipeline)
	fly(time.Minute, "unpause-pipeline", "-p", "settle")
	fly(2*time.Minute, "check-resource", "-r", "settle/big")

	out := fly(3*time.Minute, "trigger-job", "-j", "settle/fetch", "--watch")
	m := regexp.MustCompile(`in wrote \d+ bytes, sha256 ([0-9a-f]{64})`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	sum := m[1]

	pods := rn.Client.CoreV1().Pods(name)
	// The owner starts settling the get's volume once the web node has
	// destroyed the get's container and keep-grace has passed: its copy
	// appears in the holder, named <volume>-settle-<random>. Killed then.
	holder, err := pods.Get(ctx, steppod.HolderName("jetway"), metav1.GetOptions{})
	require.NoError(t, err)
	root, err := rn.EmptyDirPath(holder.UID, holder.Spec.Volumes[0].Name)
	require.NoError(t, err)
	settling := func() []string {
		copies, _ := filepath.Glob(filepath.Join(root, "volumes", "*-settle-*"))
		return copies
	}
	var copies []string
	deadline := time.Now().Add(time.Minute)
	for copies = settling(); len(copies) == 0; copies = settling() {
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(filepath.Join(root, "volumes"))
			require.Failf(t, "no copy made to settle the get's volume within a minute", "holder volumes: %v", entries)
		}
		time.Sleep(20 * time.Millisecond) // polls a file system: there is nothing to wait on
	}
	owner.kill(t)
	volume := strings.SplitN(filepath.Base(copies[0]), "-settle-", 2)[0]
	require.False(t, settled(owner, volume), "killed too late: %s had settled the volume %s", owner.name, volume)
	var meta struct{ Held *volumes.Held }
	b, err := os.ReadFile(filepath.Join(root, "meta", volume+".json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &meta))
	require.NotNil(t, meta.Held, "the volume %s is still held", volume)
	get := meta.Held.Pod // the get's container's pod, kept for the volume

	// The other replica registers the target, settles the volume with a
	// copy of its own, and the dead one's copy is destroyed by the web
	// node once reported; the kept pod is deleted.
	oneRegisters(t, []string{other.base()}, []string{name}, time.Minute)
	eventually(t, 2*time.Minute, func() error {
		if !settled(other, volume) {
			return errorf("%s has not settled the volume %s", other.name, volume)
		}
		if left := settling(); len(left) > 0 {
			return errorf("copies made to settle a volume left in the holder: %v", left)
		}
		if _, err := pods.Get(ctx, get, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("the get's pod %s is still there (%v)", get, err)
		}
		return nil
	})
	assert.Equal(t, 1, other.logged("destroyed what the web node named", `"handle":"`+filepath.Base(copies[0])+`"`),
		"the dead replica's copy, reported once the volume was settled, destroyed by the web node")
	_, err = os.Stat(filepath.Join(root, "volumes", volume))
	require.NoError(t, err, "the get's volume is in the holder")

	out = fly(3*time.Minute, "trigger-job", "-j", "settle/use", "--watch")
	assert.Contains(t, out, "read intact "+sum, "the get's files as fetched")
	assert.NotContains(t, out, "in wrote", "found in the worker's cache, not fetched again")
	assert.Contains(t, out, "succeeded")
}

// settled says whether a process of r logged that it copied volume out
// of the pod that held it (at debug level, as replicas log).
func settled(r *replica, volume string) bool {
	return r.logged("volume moved", `"volume":"`+volume+`"`, `"into_pod":false`) > 0
}
