package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/integration/cluster"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steppod"
)

// holderAPI is a gateway's worker volume API for one target, asked as a
// web node's volume client asks it.
type holderAPI struct {
	t   *testing.T
	ctx context.Context
	url string
}

func newHolderAPI(ctx context.Context, t *testing.T, g *gateway, target string) holderAPI {
	t.Helper()
	s := httptest.NewServer(g.holder.API(target))
	t.Cleanup(s.Close)
	return holderAPI{t: t, ctx: ctx, url: s.URL}
}

// call sends a request and returns the status and the error message the
// web node's client reads from the body ({"error": ...}), or the body.
func (a holderAPI) call(method, path string, body io.Reader, hdr ...string) (int, string) {
	a.t.Helper()
	req, err := http.NewRequestWithContext(a.ctx, method, a.url+path, body)
	require.NoError(a.t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(a.t, err)
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return resp.StatusCode, e.Error
	}
	return resp.StatusCode, string(b)
}

func (a holderAPI) create(body string) (int, string) {
	return a.call(http.MethodPost, "/volumes", strings.NewReader(body), "Content-Type", "application/json")
}

// streamIn streams files (name, []byte, ...) into handle as a raw tar,
// with the web node's limit (none: 0, in MB, "%f").
func (a holderAPI) streamIn(handle string, files ...any) (int, string) {
	a.t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		content := files[i+1].([]byte)
		require.NoError(a.t, tw.WriteHeader(&tar.Header{Name: files[i].(string), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}))
		_, err := tw.Write(content)
		require.NoError(a.t, err)
	}
	require.NoError(a.t, tw.Close())
	return a.call(http.MethodPut, "/volumes/"+handle+"/stream-in?limit=0.000000&path=.", &buf, "Content-Encoding", "raw")
}

// readFile is the file at path of handle, streamed out.
func (a holderAPI) readFile(handle, path string) []byte {
	a.t.Helper()
	code, body := a.call(http.MethodPut, "/volumes/"+handle+"/stream-out?path="+path, nil, "Accept-Encoding", "raw")
	require.Equal(a.t, http.StatusOK, code, body)
	tr := tar.NewReader(strings.NewReader(body))
	_, err := tr.Next()
	require.NoError(a.t, err)
	b, err := io.ReadAll(tr)
	require.NoError(a.t, err)
	return b
}

// staticStorage is a StorageClass with no provisioner (binding waits for
// the first pod) and one hostPath PersistentVolume of size in a folder
// the test makes, which it returns with the class's name: a volume that
// outlives the pods that mount it, on the real node's disk.
func staticStorage(ctx context.Context, t *testing.T, c *cluster.Cluster, size string) (string, string) {
	t.Helper()
	name := "holder-" + strings.ToLower(rand.Text()[:8])
	dir := t.TempDir()
	wait, retain := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimRetain
	storage := c.Client.StorageV1().StorageClasses()
	_, err := storage.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &wait, ReclaimPolicy: &retain}, metav1.CreateOptions{})
	require.NoError(t, err)
	pvs := c.Client.CoreV1().PersistentVolumes()
	_, err = pvs.Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              name,
			PersistentVolumeReclaimPolicy: retain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pvs.Delete(ctx, name, metav1.DeleteOptions{})
		_ = storage.Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name, dir
}

// claimHolder starts a gateway with target name on the real node, its
// volume holder on a claim of a static hostPath volume (staticStorage),
// and makes volume "kept" there holding payload; it returns the holder's
// pod and the volume's folder on the node.
func claimHolder(ctx context.Context, t *testing.T, name string, o gatewayOptions) (g *gateway, api holderAPI, first *corev1.Pod, dir string, payload []byte) {
	t.Helper()
	rn := startRealNode(t)
	class, dir := staticStorage(ctx, t, rn, "64Mi")
	o.agentImage, o.claims = rn.NodeImage("step-agent-image.tar"), true
	g = targetGateway(ctx, t, rn, name, "steps: {volumeHolder: {storage: {class: "+class+", size: 32Mi}}}\n", o)
	api = newHolderAPI(ctx, t, g, name)
	code, msg := api.create(`{"handle":"kept","strategy":{"type":"empty"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	payload = randomBytes(t, 1<<20)
	code, msg = api.streamIn("kept", "payload", payload)
	require.Equal(t, http.StatusNoContent, code, msg)
	first, err := rn.Client.CoreV1().Pods(name).Get(ctx, steppod.HolderName("jetway"), metav1.GetOptions{})
	require.NoError(t, err)
	return g, api, first, dir, payload
}

// TestRealNodeHolderOnAClaimKeepsItsVolumes: a target whose volume holder
// keeps its volumes on a claim (steps.volumeHolder.storage: a static
// hostPath volume of a no-provisioner class): the first create makes the
// claim (bound to that volume) and the holder mounting it, whose
// capacity is the claim's size; a volume streamed in lands on the
// volume's folder. The holder pod deleted (as kubectl does), the next
// sweep's lists never report the volume gone: they fail until a new
// holder, made by them on the same claim, runs and lists it; its file
// streams out whole.
func TestRealNodeHolderOnAClaimKeepsItsVolumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "rn-claim"
	g, api, first, dir, payload := claimHolder(ctx, t, name, gatewayOptions{})
	rn := startRealNode(t)
	holder := steppod.HolderName("jetway")
	pods := rn.Client.CoreV1().Pods(name)
	assert.Equal(t, holder, steppod.HolderClaimName(first), "the holder mounts its claim, no emptyDir")
	assert.Contains(t, strings.Join(first.Spec.Containers[0].Command, " "), "--capacity 33554432 --capacity-of claim", "the claim's size")
	claim, err := rn.Client.CoreV1().PersistentVolumeClaims(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ClaimBound, claim.Status.Phase)
	assert.Equal(t, *claim.Spec.StorageClassName, claim.Spec.VolumeName, "bound to its class's one volume (staticStorage names both alike)")
	got, err := os.ReadFile(filepath.Join(dir, "volumes", "kept", "payload"))
	require.NoError(t, err, "the volume is on the claim's volume")
	assert.Equal(t, payload, got)

	require.NoError(t, pods.Delete(ctx, holder, metav1.DeleteOptions{}))
	eventually(t, 2*time.Minute, func() error {
		listed, err := g.holder.List(ctx, name)
		if err != nil {
			return err // not reported: the web node keeps the volume
		}
		require.Contains(t, listed, "kept", "a list of the holder's volumes without it tells the web node it is gone")
		p, err := pods.Get(ctx, holder, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID == first.UID {
			return errorf("the deleted holder still answers")
		}
		return nil
	})
	assert.Equal(t, payload, api.readFile("kept", "payload"), "the new holder has the volume, whole")
	assert.Equal(t, 1.0, metricValue(t, g, `jetway_concourse_volume_holders_replaced_total{reason="deleted",volumes="kept"}`))
	assert.Contains(t, g.logs.String(), "volume holder pod made again: it was gone; the volumes on its claim wait for it")
	assert.NotContains(t, g.logs.String(), "the volumes it held are gone")
}

// TestRealNodeHolderClaimPending: a target whose holder asks for a claim
// of a StorageClass that does not exist: the holder stays Pending, and a
// volume call fails once the holder's wait ends, naming the claim, the
// class and what to check, as the gateway's log does.
func TestRealNodeHolderClaimPending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const name, class = "rn-claim-pending", "jetway-no-such-class"
	rn := startRealNode(t)
	g := targetGateway(ctx, t, rn, name, "steps: {volumeHolder: {storage: {class: "+class+", size: 16Mi}}}\n",
		gatewayOptions{agentImage: rn.NodeImage("step-agent-image.tar"), claims: true, holderReady: 5 * time.Second})
	api := newHolderAPI(ctx, t, g, name)

	code, msg := api.create(`{"handle":"v","strategy":{"type":"empty"}}`)
	assert.Equal(t, http.StatusInternalServerError, code, msg)
	holder := steppod.HolderName("jetway")
	assert.Contains(t, msg, "its claim "+name+"/"+holder+" is Pending: no volume is bound to it; "+
		`does StorageClass "`+class+`" exist, and can it provide 16Mi ReadWriteOnce on a node the holder may run on?`)
	assert.Contains(t, g.logs.String(), `"msg":"volume holder not running"`)
	p, err := rn.Client.CoreV1().Pods(name).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.PodPending, p.Status.Phase)
}

// TestRealNodeHolderStorageChanges: a target's holder setting changed
// from an emptyDir to a claim and back. Each change replaces the running
// holder at the next create, counted with reason storage: the emptyDir's
// volumes are gone with it; going back, the claim is deleted with the
// volumes on it.
func TestRealNodeHolderStorageChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "rn-claim-switch"
	rn := startRealNode(t)
	class, dir := staticStorage(ctx, t, rn, "64Mi")
	g := targetGateway(ctx, t, rn, name, "{}\n", gatewayOptions{agentImage: rn.NodeImage("step-agent-image.tar"), claims: true})
	api := newHolderAPI(ctx, t, g, name)
	holder := steppod.HolderName("jetway")
	pods := rn.Client.CoreV1().Pods(name)
	claims := rn.Client.CoreV1().PersistentVolumeClaims(name)
	storage := func(yaml, want string) {
		t.Helper()
		writeFile(t, filepath.Join(g.dir, name, "target.yaml"), []byte(yaml))
		eventually(t, time.Minute, func() error {
			tg, err := g.registry.Target(name)
			if err != nil {
				return err
			}
			if got := tg.Config.Meta.Steps.VolumeHolder.StorageClass(""); got != want {
				return errorf("the target's holder storage class is %q, want %q", got, want)
			}
			return nil
		})
	}
	replaced := `jetway_concourse_volume_holders_replaced_total{reason="storage",volumes="lost"}`

	code, msg := api.create(`{"handle":"in-empty-dir","strategy":{"type":"empty"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	first, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	require.Empty(t, steppod.HolderClaimName(first), "an emptyDir's holder")

	storage("steps: {volumeHolder: {storage: {class: "+class+", size: 32Mi}}}\n", class)
	code, msg = api.create(`{"handle":"on-claim","strategy":{"type":"empty"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	second, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, first.UID, second.UID, "replaced")
	assert.Equal(t, holder, steppod.HolderClaimName(second), "on its claim")
	assert.DirExists(t, filepath.Join(dir, "volumes", "on-claim"))
	listed, err := g.holder.List(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, []string{"on-claim"}, listed, "the emptyDir's volume went with it")
	assert.Equal(t, 1.0, metricValue(t, g, replaced))
	assert.Contains(t, g.logs.String(), "volume holder pod replaced: its storage is now a claim")

	storage("{}\n", "")
	code, msg = api.create(`{"handle":"in-empty-dir-again","strategy":{"type":"empty"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	third, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, second.UID, third.UID, "replaced")
	assert.Empty(t, steppod.HolderClaimName(third), "an emptyDir's holder again")
	listed, err = g.holder.List(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, []string{"in-empty-dir-again"}, listed)
	eventually(t, time.Minute, func() error {
		if _, err := claims.Get(ctx, holder, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("the claim is still there (%v)", err)
		}
		return nil
	})
	assert.Equal(t, 2.0, metricValue(t, g, replaced))
	assert.Contains(t, g.logs.String(), "volume holder pod replaced: its storage is now an emptyDir; its claim is deleted")
}

// TestRealNodeHolderOnAClaimOutlivesADrain: a drain of the node of a
// holder on a node-local claim, as kubectl drain does it (the node
// cordoned, the holder evicted through the Eviction API): the new holder
// waits, Pending, on the same claim while the node is cordoned, and the
// lists meanwhile fail (so no sweep reports the volumes gone); once the
// node is uncordoned, the volumes are there, whole.
func TestRealNodeHolderOnAClaimOutlivesADrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "rn-claim-drain"
	g, api, first, _, payload := claimHolder(ctx, t, name, gatewayOptions{holderReady: 5 * time.Second})
	rn := startRealNode(t)
	holder := steppod.HolderName("jetway")
	pods := rn.Client.CoreV1().Pods(name)
	nodes := rn.Client.CoreV1().Nodes()
	cordon := func(on bool) {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
		_, err := nodes.Patch(context.Background(), rn.NodeName(), ktypes.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	cordon(true)
	t.Cleanup(func() { cordon(false) }) // whatever happens: the suite's other tests need the node
	require.NoError(t, pods.EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: holder, Namespace: name}}))

	// A list (the sweep's) makes the holder again; it fails while the
	// new one waits, so nothing is reported gone.
	eventually(t, time.Minute, func() error {
		listed, lerr := g.holder.List(ctx, name)
		p, err := pods.Get(ctx, holder, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID == first.UID || p.Status.Phase != corev1.PodPending {
			return errorf("no new holder waiting yet (%s, %s)", p.UID, p.Status.Phase)
		}
		if lerr == nil {
			return errorf("a list answered %v while the holder waits", listed)
		}
		return nil
	})

	cordon(false)
	eventually(t, 2*time.Minute, func() error {
		listed, err := g.holder.List(ctx, name)
		if err != nil {
			return err
		}
		require.Contains(t, listed, "kept", "a list without it tells the web node it is gone")
		return nil
	})
	assert.Equal(t, payload, api.readFile("kept", "payload"), "the new holder has the volume, whole")
	assert.Equal(t, 1.0, metricValue(t, g, `jetway_concourse_volume_holders_replaced_total{reason="deleted",volumes="kept"}`))
}

// holderBuilds is a real web node with a target name on the real node
// (target.yaml targetYAML) registered as its worker, sweeping every 2 s,
// whose missing volumes the web node forgets a second after a sweep
// leaves them out; and a folder with an input, in/payload.
func holderBuilds(ctx context.Context, t *testing.T, name, targetYAML string) (*cwn.WebNode, *gateway, string) {
	t.Helper()
	client := cwn.Client{ID: "jetway", Secret: name + "-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second,
		Args: []string{"--gc-missing-grace-period", "1s", "--gc-one-off-grace-period", "1s"}})
	g := nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		sweep: 2 * time.Second, targetYAML: targetYAML})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	work := t.TempDir()
	writeFile(t, filepath.Join(work, "in", "payload"), []byte(rand.Text()+"\n"))
	return web, g, work
}

// taskArgs are fly's arguments to execute a busybox task running
// script with input in from work, and the args given (an input they
// name, -i NAME=DIR, is one of the task's).
func taskArgs(t *testing.T, work, script string, args ...string) []string {
	t.Helper()
	inputs := "{name: in}"
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-i" {
			inputs += ", {name: " + strings.SplitN(args[i+1], "=", 2)[0] + "}"
		}
	}
	task := filepath.Join(work, "task-"+strings.ToLower(rand.Text()[:6])+".yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\n"+
		"inputs: ["+inputs+"]\noutputs: [{name: out}]\nrun: {path: sh, args: [-ec, "+yamlQuote(script)+"]}\n"))
	return append([]string{"execute", "-c", task, "-i", "in=" + filepath.Join(work, "in")}, args...)
}

// flyTask runs the task (taskArgs) within two minutes.
func flyTask(ctx context.Context, t *testing.T, web *cwn.WebNode, work, script string, args ...string) (string, error) {
	t.Helper()
	r := <-flyAsync(ctx, web, 2*time.Minute, taskArgs(t, work, script, args...)...)
	return r.out, r.err
}

// TestRealNodeConcourseHolderDeletedMidBuild: the volume holder (an
// emptyDir) deleted while a build's task runs (or while its volumes are
// copied into its pod): the task's output cannot go back to it, and the
// build fails naming the holder; the next sweep
// reports none of the volumes it held, so the web node forgets them; the
// next build makes a new holder and succeeds.
func TestRealNodeConcourseHolderDeletedMidBuild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const name = "rn-holder-gone"
	web, _, work := holderBuilds(ctx, t, name, "{}\n")
	rn := startRealNode(t)
	holder := steppod.HolderName("jetway")
	pods := rn.Client.CoreV1().Pods(name)

	done := flyAsync(ctx, web, 2*time.Minute, taskArgs(t, work, "echo started; sleep 15; cp in/payload out/")...)
	// Its input is in the task's pod once the pod runs.
	eventually(t, 90*time.Second, func() error {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.Name != holder && p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}
		return errorf("the task's pod does not run yet")
	})
	held := listedVolumes(t, web, name)
	require.NotEmpty(t, held)
	first, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, pods.Delete(ctx, holder, metav1.DeleteOptions{}))

	var res flyResult
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("fly execute does not end")
	}
	// The pod runs before its volumes are copied in: the holder may go
	// during that copy (the task never starts) or while the task runs (its
	// output cannot go back). Either way the build names the holder.
	require.Error(t, res.err, res.out)
	assert.Contains(t, res.out, "is not in target "+name+"'s volume holder pod "+holder+": it went with the holder", "the build says why")

	eventually(t, time.Minute, func() error {
		if left := slices.DeleteFunc(listedVolumes(t, web, name), func(v string) bool { return !slices.Contains(held, v) }); len(left) > 0 {
			return errorf("the web node still lists %v of the lost holder's volumes", left)
		}
		return nil
	})

	out, err := flyTask(ctx, t, web, work, "cat in/payload")
	require.NoError(t, err, out)
	p, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, first.UID, p.UID, "a new holder")
}

// TestRealNodeConcourseHolderKilledMidBuild: the volume holder's sidecar
// SIGKILLed (as an OOM kill would) while a build's task runs: the kubelet
// starts it again in the same pod, on the same emptyDir, and nothing is
// lost: the task's output is copied out once the holder answers again,
// fly execute downloads it whole, and the holder is neither replaced nor
// made again; the next build runs on it.
func TestRealNodeConcourseHolderKilledMidBuild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "rn-holder-killed"
	web, g, work := holderBuilds(ctx, t, name, "{}\n")
	rn := startRealNode(t)
	holder := steppod.HolderName("jetway")
	pods := rn.Client.CoreV1().Pods(name)

	out := filepath.Join(work, "out")
	done := flyAsync(ctx, web, 3*time.Minute, taskArgs(t, work, "echo started; sleep 8; cp in/payload out/", "-o", "out="+out)...)
	eventually(t, 90*time.Second, func() error {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.Name != holder && p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}
		return errorf("the task's pod does not run yet")
	})
	first, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, rn.KillContainer(ctx, name, holder, first.Spec.Containers[0].Name))

	var res flyResult
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("fly execute does not end")
	}
	require.NoError(t, res.err, res.out)
	assert.Contains(t, res.out, "started")
	want, err := os.ReadFile(filepath.Join(work, "in", "payload"))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(out, "payload"))
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "the output, copied out after the holder came back")

	p, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, first.UID, p.UID, "the same holder")
	require.Len(t, p.Status.ContainerStatuses, 1)
	assert.Equal(t, int32(1), p.Status.ContainerStatuses[0].RestartCount, "its sidecar started again once")
	assert.NotContains(t, scrape(t, g.reg), "jetway_concourse_volume_holders_replaced_total{", "not replaced, for any reason")

	res2, err := flyTask(ctx, t, web, work, "cat in/payload")
	require.NoError(t, err, res2)
	assert.Contains(t, res2, strings.TrimSpace(string(want)))
}

// TestRealNodeConcourseHolderPastItsLimit: a volume holder of 16Mi
// (steps.volumeHolder.size). An upload bigger than that through fly is
// refused, naming the capacity, and takes nothing: the holder's emptyDir
// stays under its limit on the node's disk, so the kubelet has nothing
// to evict, and the next build runs on the same holder. Then the
// emptyDir filled past its limit behind the sidecar's back, on the
// node's disk: the kubelet evicts the holder, the next sweep replaces it
// (reason evicted, its volumes lost) and the next build succeeds.
func TestRealNodeConcourseHolderPastItsLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const name, limit = "rn-holder-full", 16 << 20
	web, g, work := holderBuilds(ctx, t, name, "steps: {volumeHolder: {size: 16Mi}}\n")
	rn := startRealNode(t)
	holder := steppod.HolderName("jetway")
	pods := rn.Client.CoreV1().Pods(name)

	big := t.TempDir()
	writeFile(t, filepath.Join(big, "big"), randomBytes(t, 24<<20))
	out, err := flyTask(ctx, t, web, work, "ls in", "-i", "big="+big)
	require.Error(t, err, out)
	assert.Contains(t, out+err.Error(), "capacity of 16.0 MiB (16777216 bytes)", "the user sees the capacity")
	assert.Contains(t, out+err.Error(), "steps.volumeHolder.size")
	first, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	usage, err := rn.EmptyDirUsage(first.UID, first.Spec.Volumes[0].Name)
	require.NoError(t, err)
	assert.Less(t, usage, int64(limit), "nothing of the upload is kept: nothing to evict")

	out, err = flyTask(ctx, t, web, work, "cat in/payload")
	require.NoError(t, err, out)
	p, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, first.UID, p.UID, "the same holder")
	require.Len(t, p.Status.ContainerStatuses, 1)
	assert.Zero(t, p.Status.ContainerStatuses[0].RestartCount)
	assert.Equal(t, corev1.PodRunning, p.Status.Phase)

	// Filled behind the sidecar's back: what no request can do.
	dir, err := rn.EmptyDirPath(first.UID, first.Spec.Volumes[0].Name)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "filler"), randomBytes(t, 24<<20), 0o600))
	evicted := `jetway_concourse_volume_holders_replaced_total{reason="evicted",volumes="lost"}`
	eventually(t, 4*time.Minute, func() error {
		if n := metricValue(t, g, evicted); n < 1 {
			return errorf("not replaced as evicted yet")
		}
		return nil
	})
	assert.Contains(t, g.logs.String(), `"as":"evicted"`)
	out, err = flyTask(ctx, t, web, work, "cat in/payload")
	require.NoError(t, err, out)
	p, err = pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, first.UID, p.UID, "a new holder")
}
