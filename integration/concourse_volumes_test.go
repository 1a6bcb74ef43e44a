package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// flyRow is one row of `fly volumes --json` or `fly containers --json`.
type flyRow struct {
	ID         string `json:"id"`
	WorkerName string `json:"worker_name"`
	Type       string `json:"type"`
}

// flyList is what `fly <what> --json` lists.
func flyList(t *testing.T, web *cwn.WebNode, what string) []flyRow {
	t.Helper()
	out, err := web.Fly(what, "--json")
	require.NoError(t, err)
	var rows []flyRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	return rows
}

func flyVolumes(t *testing.T, web *cwn.WebNode) []flyRow { return flyList(t, web, "volumes") }

// TestConcourseVolumesLiveInTheTarget: `fly execute` with an upload on a
// jetway worker: the web node makes its volumes through the worker's
// volume API, jetway keeps them in the target's volume holder pod (the
// uploaded bytes there, whole), and `fly volumes` lists them on that
// worker. The build runs its task in a pod, its input moved in from the
// holder; the web node then collects
// the one-off build's container and the volumes it mounted, and the sweep
// destroys them in the holder, leaving the upload. A restarted gateway
// reports the same volumes.
func TestConcourseVolumesLiveInTheTarget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// The one-off build's container, and so the volumes it mounts, is
	// collected a second after the build.
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second, GCInterval: time.Second,
		Args: []string{"--gc-one-off-grace-period", "1s"}})
	dir := t.TempDir()
	const name = "cwv"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	// Someone who may make pods in a target's namespace plants one where
	// jetway's volume holder would be, with its labels.
	const planted = "cwv-planted"
	placeTarget(ctx, t, clusters[1], dir, planted, "tags: [planted]\n", "")
	holder := steppod.HolderName("jetway")
	labels := teamLabels(planted, "jetway", "")
	labels[targets.VolumeHolderLabel] = "concourse"
	_, err := clusters[1].Client.CoreV1().Pods(planted).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: holder, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "volumes", Image: "example.invalid/thief"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	state := newState(t)
	opts := gatewayOptions{concourse: concourseTSA(t, web), sweep: 500 * time.Millisecond, state: state}
	g := startGateway(t, dir, opts)
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	flyWorker(t, web, planted, 30*time.Second, workerIn("running"))

	work := t.TempDir()
	upload := filepath.Join(work, "in")
	require.NoError(t, os.MkdirAll(upload, 0o755))
	payload := []byte(rand.Text() + "\n")
	require.NoError(t, os.WriteFile(filepath.Join(upload, "payload"), payload, 0o644))
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox\ninputs: [{name: in}]\nrun: {path: cat, args: [in/payload]}\n"))
	fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
	out, err := web.FlyContext(fctx, "execute", "-c", task, "-i", "in="+upload)
	fcancel()
	require.NoError(t, err, out)
	assert.Contains(t, out, strings.TrimSuffix(string(payload), "\n")+"\r\n", "the input, moved into the container's pod (shown on the task's terminal)")

	// The upload is in the holder, whole, under the handle fly lists.
	pod, err := clusters[0].Client.CoreV1().Pods(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, pod.Labels, targets.VolumeHolderLabel)
	root := clusters[0].StepRoot(name, holder)
	var uploaded string
	eventually(t, 10*time.Second, func() error {
		for _, v := range flyVolumes(t, web) {
			if v.WorkerName != name {
				return errorf("volume %s on worker %s", v.ID, v.WorkerName)
			}
			if b, err := os.ReadFile(filepath.Join(root, "volumes", v.ID, "payload")); err == nil {
				assert.Equal(t, string(payload), string(b))
				uploaded = v.ID
			}
		}
		if uploaded == "" {
			return errorf("no volume fly lists holds the upload")
		}
		return nil
	})

	// On the worker with the planted pod no volume is made: the planted
	// pod gets no request, nor is it deleted, and the build says why.
	fctx, fcancel = context.WithTimeout(ctx, 90*time.Second)
	out, err = web.FlyContext(fctx, "execute", "-c", task, "-i", "in="+upload, "--tag", "planted")
	fcancel()
	require.Error(t, err, out)
	assert.Contains(t, out+err.Error(), "pod cwv-planted/"+holder+" carries the volume holder's name and labels but jetway did not make it")
	p, err := clusters[1].Client.CoreV1().Pods(planted).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "example.invalid/thief", p.Spec.Containers[0].Image, "left alone")

	// The volumes of the container that was never made are collected:
	// the sweep destroys them in the holder, which then keeps exactly
	// what the web node lists on the worker.
	destroyed := `jetway_concourse_destroyed_total{kind="volumes",result="destroyed"}`
	var kept []string
	eventually(t, 60*time.Second, func() error {
		if n := metricValue(t, g, destroyed); n < 1 {
			return errorf("%v volumes destroyed", n)
		}
		held, listed := heldVolumes(t, root), listedVolumes(t, web, name)
		if !slices.Equal(held, listed) {
			return errorf("the holder keeps %v, fly lists %v", held, listed)
		}
		kept = held
		return nil
	})
	require.NotEmpty(t, kept, "fly execute's artifact stays")
	t.Logf("kept after the collection: %v", flyVolumes(t, web))

	// Another gateway over the same targets and state reports the same
	// volumes: the web node keeps listing them on the worker.
	g.stop()
	g2 := startGateway(t, dir, opts)
	swept := `jetway_concourse_sweeps_total{kind="volumes",result="ok"}`
	eventually(t, 30*time.Second, func() error {
		if n := metricValue(t, g2, swept); n < 2 {
			return errorf("%v volume sweeps on the new gateway", n)
		}
		return nil
	})
	assert.Equal(t, kept, listedVolumes(t, web, name))
	assert.Equal(t, kept, heldVolumes(t, root))

	// The holder runs no step: the worker lands with it running (its
	// volumes kept). Retiring the landed target deletes the holder, and
	// the worker, which the web node cannot retire once landed (it has no
	// address then), is deleted there.
	_, err = web.Fly("land-worker", "-w", name)
	require.NoError(t, err)
	g2.waitTarget(t, name, time.Minute, inState("landed"))
	flyWorker(t, web, name, 10*time.Second, workerIn("landed"))
	_, err = clusters[0].Client.CoreV1().Pods(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err, "a landed worker keeps its volumes")
	code, body, _ := call(t, http.MethodPut, g2.base+"/api/v1/workers/"+name+"/retire", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, name, 30*time.Second, func(_ wire.Worker, found bool) bool { return !found })
	eventually(t, 30*time.Second, func() error {
		if _, err := clusters[0].Client.CoreV1().Pods(name).Get(ctx, holder, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("the retired target's volume holder is still there (%v)", err)
		}
		return nil
	})
}

// heldVolumes are the volumes in a holder's root, sorted.
func heldVolumes(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "volumes"))
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// listedVolumes are the volumes fly lists on worker, sorted.
func listedVolumes(t *testing.T, web *cwn.WebNode, worker string) []string {
	t.Helper()
	var out []string
	for _, v := range flyVolumes(t, web) {
		if v.WorkerName == worker {
			out = append(out, v.ID)
		}
	}
	slices.Sort(out)
	return out
}

// TestASweepListsNoVolumesOfAHolderNotYetBound: between the create of a
// target's volume holder and its binding (ownership.Bind), the pod is
// sealed but not bound; a sweep that lists it then gets no volumes, and a
// lookup not found, not an error: a pod not bound to jetway's create
// never got a request, so it holds none of the web node's volumes (CI saw
// the sweep fail in that moment, and a web node's first check on a new
// target failed its lookup with a 500).
func TestASweepListsNoVolumesOfAHolderNotYetBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "holder-binding"
	g, _ := holderWithAVolume(ctx, t, ns)
	api := httptest.NewServer(g.holder.API(ns))
	defer api.Close()

	// As it is a moment after its create: sealed, its binding not written.
	pods := clusters[1].Client.CoreV1().Pods(ns)
	holder := steppod.HolderName("jetway")
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, ownership.BoundAnnotation)
	_, err := pods.Patch(ctx, holder, k8stypes.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() error {
		listed, err := g.holder.List(ctx, ns)
		if err != nil {
			return err
		}
		if len(listed) != 0 {
			return errorf("listed %q of a holder not bound", listed)
		}
		return nil
	})
	resp, err := http.Get(api.URL + "/volumes/v1")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a lookup in a holder not bound: %s", b)
}

// TestAReplacedHolderIsGoneBeforeItsSuccessor: a running volume holder
// pod that is replaced (here: unbound past the bind grace) is deleted with
// a short grace, not forced, and its successor of the same name is made
// only once the old pod's object is gone, which its kubelet deletes once
// it stopped the pod. A forced delete let the new holder's requests reach
// the old pod's sidecar, still running: the kubelet finds the pod to
// port-forward to by name, among the pods it runs. That sidecar refused
// the new pod's token ("no valid credential"), as the real node showed
// once in three runs of a storage change.
func TestAReplacedHolderIsGoneBeforeItsSuccessor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "holder-replaced"
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[1], dir, ns, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{holderBindGrace: time.Second})
	g.waitTarget(t, ns, 10*time.Second, running)
	api := httptest.NewServer(g.holder.API(ns))
	defer api.Close()
	createVolume(t, api.URL, map[string]any{"handle": "v1", "strategy": map[string]string{"type": "empty"}})

	pods := clusters[1].Client.CoreV1().Pods(ns)
	holder := steppod.HolderName("jetway")
	old, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + holder, ResourceVersion: old.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, ownership.BoundAnnotation)
	_, err = pods.Patch(ctx, holder, k8stypes.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)
	// The next create finds it unbound once the gateway's cache has the
	// patch (a create before that still finds it bound, and uses it).
	tg, err := g.holder.Targets.Target(ns)
	require.NoError(t, err)
	eventually(t, 30*time.Second, func() error {
		if p := tg.CachedPod(holder); p == nil || p.Annotations[ownership.BoundAnnotation] != "" {
			return errorf("the gateway's cache has the holder bound still")
		}
		return nil
	})

	createVolume(t, api.URL, map[string]any{"handle": "v2", "strategy": map[string]string{"type": "empty"}})
	replacedGently(t, w, old.UID)
}

// replacedGently reads w, a watch of one pod name from before the pod of
// uid was replaced, until a pod of another UID shows: it must come after
// the old one was gone, which must have been deleted with a second's
// grace (not forced).
func replacedGently(t *testing.T, w watch.Interface, uid k8stypes.UID) {
	t.Helper()
	var grace *int64
	deleted := false
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		require.True(t, ok, "a watch event of %T", ev.Object)
		if p.UID == uid {
			if p.DeletionTimestamp != nil && grace == nil {
				grace = p.DeletionGracePeriodSeconds
			}
			deleted = deleted || ev.Type == watch.Deleted
			continue
		}
		require.True(t, deleted, "a new pod (uid %s) was made while the old one (uid %s) was still there", p.UID, uid)
		break
	}
	require.NotNil(t, grace, "the old pod was deleted at once (forced), never seen terminating")
	assert.Equal(t, int64(1), *grace, "its grace")
}

// TestALostHolderIsReplaced: a volume holder pod that ended (evicted, as
// the kubelet leaves a pod whose emptyDir went past its limit) never runs
// again: the next sweep lists none of its volumes (so the web node marks
// them missing and makes them again), deletes it and makes a new, empty
// holder, and the web node's next create and lookups work; the one that
// was lost answers 404. Two replicas sweep at once: one new holder.
func TestALostHolderIsReplaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "holder-lost"
	g, dir := holderWithAVolume(ctx, t, ns)
	api := httptest.NewServer(g.holder.API(ns))
	defer api.Close()
	// A second replica sweeps the same target at the same moments.
	b := startGateway(t, dir, gatewayOptions{identity: "replica-b"})
	b.waitTarget(t, ns, 10*time.Second, running)

	pods := clusters[1].Client.CoreV1().Pods(ns)
	holder := steppod.HolderName("jetway")
	p, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	lostUID := p.UID
	p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
	p.Status.Message = "Pod ephemeral local storage usage exceeds the total limit of containers 10Gi."
	_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err)

	eventually(t, 30*time.Second, func() error {
		var lists [2][]string
		var errs [2]error
		var wg sync.WaitGroup
		for i, r := range []*gateway{g, b} {
			wg.Go(func() { lists[i], errs[i] = r.holder.List(ctx, ns) })
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			return err
		}
		if len(lists[0])+len(lists[1]) != 0 {
			return errorf("listed %q of a holder that ended", lists)
		}
		p, err := pods.Get(ctx, holder, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID == lostUID {
			return errorf("the holder that ended is still there (%s)", p.Status.Phase)
		}
		return nil
	})
	logs := g.logs.String() + b.logs.String() // either replica replaces it
	assert.Contains(t, logs, "volume holder pod replaced")
	assert.Contains(t, logs, `"reason":"Evicted"`)

	createVolume(t, api.URL, map[string]any{"handle": "v2", "strategy": map[string]string{"type": "empty"}})
	resp, err := http.Get(api.URL + "/volumes/v1")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the lost volume is gone")
	for _, r := range []*gateway{g, b} {
		listed, err := r.holder.List(ctx, ns)
		require.NoError(t, err)
		assert.Equal(t, []string{"v2"}, listed, "one new holder, which both replicas use")
	}
}

// TestARequestToAGonePodEndsAtOnce: a request in flight to a volume
// holder whose pod is deleted ends as soon as the gateway's watch shows
// the pod gone, and says so, not at its timeout. kwok's forward, like
// some kubelets', keeps the stream to a killed process open until its
// client ends it: a list racing a holder's replacement hung for its
// whole 30 s (TestALostHolderIsReplaced on CI).
func TestARequestToAGonePodEndsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "holder-gone-mid-request"
	g, _ := holderWithAVolume(ctx, t, ns)
	holder := steppod.HolderName("jetway")

	// A stream-out larger than every buffer on its way, read in part:
	// the holder is still sending when it goes. (Sparse: no disk.)
	big := filepath.Join(clusters[1].StepRoot(ns, holder), "volumes", "v1", "big")
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(1<<30))
	require.NoError(t, f.Close())
	resp, err := g.holder.Server(ctx, ns, holder, http.MethodPut, "/volumes/v1/stream-out",
		url.Values{"path": {"."}}, http.Header{"Accept-Encoding": {"raw"}}, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = io.CopyN(io.Discard, resp.Body, 1<<20)
	require.NoError(t, err)

	require.NoError(t, clusters[1].Client.CoreV1().Pods(ns).Delete(ctx, holder, metav1.DeleteOptions{}))
	read := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		read <- err
	}()
	select {
	case err := <-read:
		require.Error(t, err, "the whole stream read from a holder deleted under it")
		assert.ErrorIs(t, err, targets.ErrPodGone)
		assert.ErrorContains(t, err, "pod "+ns+"/"+holder)
	case <-time.After(30 * time.Second):
		t.Fatal("the request to a deleted pod still waits 30 s later")
	}
}

// holderWithAVolume is a gateway whose target ns (on clusters[1]) has a
// volume holder holding one volume, v1, made through the web node's API,
// and its targets directory.
func holderWithAVolume(ctx context.Context, t *testing.T, ns string) (*gateway, string) {
	t.Helper()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[1], dir, ns, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, ns, 10*time.Second, running)
	api := httptest.NewServer(g.holder.API(ns))
	defer api.Close()
	createVolume(t, api.URL, map[string]any{"handle": "v1", "strategy": map[string]string{"type": "empty"}})
	listed, err := g.holder.List(ctx, ns)
	require.NoError(t, err)
	require.Equal(t, []string{"v1"}, listed)
	return g, dir
}

// TestAHolderThatNeverRanHoldsNoVolume: a volume holder made but not yet
// running (here never scheduled: its target's nodeSelector matches no
// node) holds none of the web node's volumes, and its worker's volume
// API says so: an empty list and not found, not an error, which failed
// the worker's heartbeat and dropped its registration with the web node
// while a lost holder was made again (a clean clone's run of
// TestRealNodeConcourseHolderDeletedMidBuild).
func TestAHolderThatNeverRanHoldsNoVolume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "holder-never-ran"
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, ns, "nodeSelector: {pool: none}\n", "")
	g := startGateway(t, dir, gatewayOptions{holderReady: 2 * time.Second})
	g.waitTarget(t, ns, 10*time.Second, running)
	api := httptest.NewServer(g.holder.API(ns))
	defer api.Close()
	resp, err := http.Post(api.URL+"/volumes", "application/json", strings.NewReader(`{"handle":"v1","strategy":{"type":"empty"}}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NotEqual(t, http.StatusCreated, resp.StatusCode, "the holder never runs: %s", b)
	_, err = clusters[0].Client.CoreV1().Pods(ns).Get(ctx, steppod.HolderName("jetway"), metav1.GetOptions{})
	require.NoError(t, err, "the holder was made")

	resp, err = http.Get(api.URL + "/volumes")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.JSONEq(t, "[]", string(b))
	resp, err = http.Get(api.URL + "/volumes/v1")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}
