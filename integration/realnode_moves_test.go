package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
)

// movesPipeline: a task writes SIZE random bytes, the next copies them
// into an output of its own, the last checks them: a 1 GiB input and a
// 1 GiB output for the task in the middle. Job lose writes 1 MiB and
// waits before reading it, for the test to delete the writer's pod.
const movesPipeline = `
jobs:
- name: moves
  plan:
  - task: write
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      outputs: [{name: big}]
      run: {path: sh, args: [-ec, 'head -c SIZE /dev/urandom > big/data; sha256sum big/data | cut -d" " -f1 > big/sum; echo written']}
  - task: copy
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: big}]
      outputs: [{name: res}]
      run: {path: sh, args: [-ec, 'cp big/data big/sum res/; echo copied']}
  - task: check
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: res}]
      run: {path: sh, args: [-ec, 'test "$(sha256sum res/data | cut -d" " -f1)" = "$(cat res/sum)"; echo intact']}
- name: lose
  plan:
  - task: write
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      outputs: [{name: big}]
      run: {path: sh, args: [-ec, 'head -c 1048576 /dev/urandom > big/data; sha256sum big/data | cut -d" " -f1 > big/sum; echo written']}
  - task: wait
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      run: {path: sh, args: [-ec, 'echo waiting; sleep 25']}
  - task: read
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: big}]
      run: {path: sh, args: [-ec, 'cat big/sum']}
`

// TestRealNodeConcourseMovesEachByteOnce (issue 41, item 2): through a
// real web node and fly on the real node, a build whose middle task has
// a 1 GiB input and a 1 GiB output moves each byte into a pod once per
// task that reads it, out of a pod once per volume read, and not at all
// within the holder (a copy of an input there is made of links): 2 GiB in
// (the copy's input, the check's input) and 2 GiB out (the writer's
// output, the copy's output), where copying every writable mount back
// after each process moved 4 GiB out. The copies of inputs are never
// copied back: once the build ended and the web node destroyed its
// containers and their volumes, they were dropped unread, and the pods
// kept for them are gone. Then, a held volume whose pod is deleted
// before the volume is read fails the step that reads it, naming the
// pod, is not reported at the next sweep, and the next build succeeds.
func TestRealNodeConcourseMovesEachByteOnce(t *testing.T) {
	const name, size = "rn-moves", 1 << 30
	needDisk(t, 8*size) // at most: the writer's output, its copy in the holder, the copy's input and output, and theirs
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "moves-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: 2 * time.Second})
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		keepGrace: 3 * time.Minute, sweep: 2 * time.Second})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	fly := func(within time.Duration, args ...string) (string, error) {
		fctx, fcancel := context.WithTimeout(ctx, within)
		defer fcancel()
		return web.FlyContext(fctx, args...)
	}
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte(strings.ReplaceAll(movesPipeline, "SIZE", strconv.Itoa(size))))
	for _, args := range [][]string{{"set-pipeline", "-n", "-p", "moves", "-c", pipeline}, {"unpause-pipeline", "-p", "moves"}} {
		out, err := fly(time.Minute, args...)
		require.NoError(t, err, out)
	}

	metric := func(series string) float64 { return metricValue(t, g, series) }
	series := []string{
		`jetway_concourse_volume_moved_bytes_total{direction="in"}`, `jetway_concourse_volume_moved_bytes_total{direction="out"}`,
		`jetway_concourse_volume_moves_total{direction="out"}`, `jetway_concourse_volume_copied_bytes_total`,
		`jetway_concourse_volume_holds_total{outcome="held"}`, `jetway_concourse_volume_holds_total{outcome="settled"}`,
		`jetway_concourse_volume_holds_total{outcome="dropped"}`, `jetway_concourse_volume_holds_total{outcome="lost"}`,
		`jetway_concourse_volume_move_seconds_sum{direction="in"}`, `jetway_concourse_volume_move_seconds_sum{direction="out"}`,
	}
	before := map[string]float64{}
	for _, s := range series {
		before[s] = metric(s)
	}
	delta := func(s string) float64 { return metric(s) - before[s] }

	out, err := fly(6*time.Minute, "trigger-job", "-j", "moves/moves", "--watch")
	require.NoError(t, err, out)
	assert.Contains(t, out, "intact")
	const slack = 1 << 20 // tar headers, the tasks' small files
	in, moved := delta(series[0]), delta(series[1])
	assert.InDelta(t, 2*size+slack/2, in, slack/2, "into the pods: the copy's input and the check's, once each")
	assert.InDelta(t, 2*size+slack/2, moved, slack/2, "out of the pods: the writer's output and the copy's, once each")
	assert.Equal(t, 2.0, delta(series[2]), "two volumes copied out: those read")
	assert.Zero(t, delta(series[3]), "the copies of inputs in the holder are links: no byte copied")
	t.Logf("moved in %.0f MiB, out %.0f MiB; copied in the holder %.0f MiB", in/(1<<20), moved/(1<<20), delta(series[3])/(1<<20))
	// A pod's mounts move in at once: the small ones' seconds count too.
	secIn, secOut := delta(series[8]), delta(series[9])
	t.Logf("moves took %.1f s in (%.0f MiB/s), %.1f s out (%.0f MiB/s)", secIn, in/secIn/(1<<20), secOut, moved/secOut/(1<<20))

	// The web node destroys the build's containers and then its volumes:
	// the copies of the inputs and the tasks' build dirs (and nothing
	// else) are dropped unread, and the pods kept for what they held go,
	// well before KeepGrace.
	pods := startRealNode(t).Client.CoreV1().Pods(name)
	eventually(t, 2*time.Minute, func() error {
		if n := delta(series[6]); n < 5 {
			return fmt.Errorf("%v held volumes dropped", n)
		}
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d containers' pods left, %s first", len(list.Items), list.Items[0].Name)
		}
		return nil
	})
	assert.Equal(t, 7.0, delta(series[4]), "held: the output of each writer, the copy of each input, each task's build dir")
	assert.Equal(t, 2.0, delta(series[5]), "settled: only what was read")
	assert.Equal(t, 5.0, delta(series[6]), "dropped: the copies of the inputs, the build dirs")
	assert.Equal(t, 2.0, delta(series[2]), "nothing copied out after the build")

	// A held volume whose pod goes before it is read.
	lost := make(chan string, 1)
	go func() {
		out, _ := fly(5*time.Minute, "trigger-job", "-j", "moves/lose", "--watch")
		lost <- out
	}()
	var writer string
	eventually(t, 3*time.Minute, func() error {
		if delta(series[4]) < 9 { // 7, then the writer's output and build dir
			return fmt.Errorf("the writer's output is not held yet")
		}
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
		if err != nil {
			return err
		}
		if len(list.Items) < 2 {
			return fmt.Errorf("%d containers' pods: the wait has not begun", len(list.Items))
		}
		first := slices.MinFunc(list.Items, func(a, b corev1.Pod) int {
			return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
		})
		writer = first.Name // the build's first container: the writer's
		return nil
	})
	require.NoError(t, pods.Delete(ctx, writer, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}), "gone at once")
	out = <-lost
	assert.Contains(t, out, "its files were in the pod "+writer, "the step that reads it names the pod")
	assert.Contains(t, out, "which is deleted")
	assert.Contains(t, out, "errored")
	assert.GreaterOrEqual(t, delta(series[7]), 1.0, "lost")

	out, err = fly(6*time.Minute, "trigger-job", "-j", "moves/lose", "--watch")
	require.NoError(t, err, "the web node made the volume again: %s", out)
	assert.Contains(t, out, "succeeded")
}
