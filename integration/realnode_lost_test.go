package integration

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
)

// TestRealNodeConcourseContainerPodLost: a container's pod gone on its
// own, through a real web node and real fly on the real node.
//   - Mid-build, evicted as `kubectl drain` evicts it (the Eviction API):
//     the build fails within seconds naming the pod and why, not after
//     minutes of waiting for a pod that never comes back.
//   - Between builds, deleted (as pod garbage collection or a person
//     would): the finished build's container, kept by the web node for
//     fly intercept, is no longer reported, so the web node forgets it
//     past its missing grace; an intercept before that fails at once
//     naming why; the next build runs in a new pod. Past the gateway's
//     concourse-lost-grace its record is deleted too.
func TestRealNodeConcourseContainerPodLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const name = "rn-lost"
	client := cwn.Client{ID: "jetway", Secret: name + "-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second,
		Args: []string{"--gc-missing-grace-period", "15s", "--gc-one-off-grace-period", "10m"}})
	state := newState(t)
	nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: state,
		sweep: 2 * time.Second, lostGrace: 20 * time.Second})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	rn := startRealNode(t)
	pods := rn.Client.CoreV1().Pods(name)
	work := t.TempDir()
	writeFile(t, work+"/in/payload", []byte("payload\n"))

	// Mid-build: evicted, as a drain evicts it.
	done := flyAsync(ctx, web, 4*time.Minute, taskArgs(t, work, "echo started; sleep 600")...)
	build := awaitStartedBuild(t, web)
	awaitBuildSays(ctx, t, web, build, "started")
	evicted := onlyContainerPod(ctx, t, pods)
	require.NoError(t, pods.EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: evicted.Name, Namespace: name}}))
	evictedAt := time.Now()
	var res flyResult
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("fly execute does not end")
	}
	require.Error(t, res.err, res.out)
	assert.Regexp(t, `container \S+ is lost: its pod `+evicted.Name+` (is being deleted \(EvictionByEvictionAPI|was deleted|has ended)`, res.out,
		"the build names the pod and why")
	assert.Less(t, time.Since(evictedAt), time.Minute, "at once, not after minutes")
	t.Logf("the evicted build: %s", res.out)

	// Between builds: the finished build's container, deleted.
	out, err := flyTask(ctx, t, web, work, "echo first")
	require.NoError(t, err, out)
	build = regexp.MustCompile(`executing build (\d+)`).FindStringSubmatch(out)[1]
	gone := onlyContainerPod(ctx, t, pods)
	handle := gone.Labels[concourse.ContainerLabel]
	require.True(t, slices.ContainsFunc(flyContainers(t, web), func(r flyRow) bool { return r.ID == handle }), "the web node keeps it for intercept")
	require.NoError(t, pods.Delete(ctx, gone.Name, metav1.DeleteOptions{}))
	eventually(t, time.Minute, func() error {
		if _, err := pods.Get(ctx, gone.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("pod %s is not deleted yet (%v)", gone.Name, err)
		}
		return nil
	})
	ictx, icancel := context.WithTimeout(ctx, time.Minute)
	start := time.Now()
	iout, err := web.FlyContext(ictx, "intercept", "-b", build, "--", "sh", "-c", "echo intercepted")
	icancel()
	require.Error(t, err, iout)
	// As the sweep found it first: deleted, or still being deleted.
	assert.Regexp(t, "container "+handle+" is lost: its pod "+gone.Name+" (was|is being) deleted", err.Error()+iout, "intercept names why")
	assert.Less(t, time.Since(start), 30*time.Second, "at once")

	// Not reported: the web node forgets it past its missing grace.
	eventually(t, time.Minute, func() error {
		if slices.ContainsFunc(flyContainers(t, web), func(r flyRow) bool { return r.ID == handle }) {
			return errorf("the web node still lists container %s", handle)
		}
		return nil
	})
	out, err = flyTask(ctx, t, web, work, "echo second")
	require.NoError(t, err, out)
	assert.Contains(t, out, "second")

	// Past the lost grace, its record is gone.
	records := clusters[0].Client.CoreV1().Secrets(state.namespace)
	eventually(t, time.Minute, func() error {
		list, err := records.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, s := range list.Items {
			if strings.Contains(string(s.Data["spec"]), handle) {
				return errorf("container %s's record %s is still there", handle, s.Name)
			}
		}
		return nil
	})
}

// awaitStartedBuild is the ID of a started build of the web node's, once
// there is one.
func awaitStartedBuild(t *testing.T, web *cwn.WebNode) string {
	t.Helper()
	var id string
	eventually(t, time.Minute, func() error {
		out, err := web.Fly("builds", "--json")
		if err != nil {
			return err
		}
		var bs []struct {
			ID     int    `json:"id"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal([]byte(out), &bs); err != nil {
			return err
		}
		for _, b := range bs {
			if b.Status == "started" {
				id = strconv.Itoa(b.ID)
				return nil
			}
		}
		return errorf("no build started: %s", out)
	})
	return id
}

// awaitBuildSays waits until build's output has want.
func awaitBuildSays(ctx context.Context, t *testing.T, web *cwn.WebNode, build, want string) {
	t.Helper()
	eventually(t, 2*time.Minute, func() error {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		out, _ := web.FlyContext(wctx, "watch", "-b", build)
		if !strings.Contains(out, want) {
			return errorf("build %s has not said %q yet: %s", build, want, out)
		}
		return nil
	})
}

// onlyContainerPod is the one container pod in pods, once it is there.
func onlyContainerPod(ctx context.Context, t *testing.T, pods corev1Pods) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	eventually(t, time.Minute, func() error {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
		if err != nil {
			return err
		}
		live := slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
		if len(live) != 1 {
			return errorf("%d container pods", len(live))
		}
		pod = live[0]
		return nil
	})
	return pod
}
