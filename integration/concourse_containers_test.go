package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	gclient "code.cloudfoundry.org/garden/client"
	gconn "code.cloudfoundry.org/garden/client/connection"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/internal/pty"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

func flyContainers(t *testing.T, web *cwn.WebNode) []flyRow { return flyList(t, web, "containers") }

// containerPods are the pods of a web node's container handle in ns.
func containerPods(ctx context.Context, t *testing.T, c corev1Pods, handle string) []corev1.Pod {
	t.Helper()
	list, err := c.List(ctx, metav1.ListOptions{LabelSelector: labels.Set{concourse.ContainerLabel: handle}.String()})
	require.NoError(t, err)
	return list.Items
}

// TestConcourseContainersArePods: the web node's Garden Create on a
// jetway worker makes a pod in the target (fly execute, real web node,
// real fly): the task's image, its container limits as the pod's
// resources, its bind mounts as mounts of the pod's volume; its params
// are kept in the state namespace, never in the pod. `fly containers`
// lists it on its worker. Its properties are durable: a restarted gateway
// answers them, through Garden's own client, and a list filters by them.
// The web node's garbage collector destroys the container after the
// one-off build's grace period: pod and record are gone.
func TestConcourseContainersArePods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "containers-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second,
		Args: []string{"--gc-one-off-grace-period", "20s", "--gc-hijack-grace-period", "20s"}})
	dir := t.TempDir()
	const name = "cwc"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	opts := gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), sweep: 500 * time.Millisecond, state: newState(t)}
	g := startGateway(t, dir, opts)
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))

	work := t.TempDir()
	secret := rand.Text()
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox#1.36\nparams: {SECRET: "+secret+", NAME: jetway}\n"+
		"container_limits: {cpu: 512, memory: 104857600}\nrun: {path: sh, args: [-c, 'echo \"hello $NAME\"']}\n"))
	failing := filepath.Join(work, "failing.yml")
	writeFile(t, failing, []byte("platform: linux\nrootfs_uri: docker:///busybox#1.36\nrun: {path: sh, args: [-c, 'echo to-stderr >&2; exit 3']}\n"))
	execute := func(task string) (string, error) {
		fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
		defer fcancel()
		return web.FlyContext(fctx, "execute", "-c", task)
	}
	// RFC 075's hello world, with a param: the task runs in its pod.
	out, err := execute(task)
	require.NoError(t, err, out)
	assert.Contains(t, out, "hello jetway\r\n", "a task runs on a terminal, as on Garden")
	assert.Contains(t, out, "succeeded")
	// fly intercept runs a command in the build's container (without a
	// terminal: fly's stdin here is none).
	build := regexp.MustCompile(`executing build (\d+)`).FindStringSubmatch(out)
	require.NotNil(t, build, out)
	ictx, icancel := context.WithTimeout(ctx, 60*time.Second)
	iout, err := web.FlyContext(ictx, "intercept", "-b", build[1], "--", "sh", "-c", `echo "intercepted $NAME in $(pwd)"`)
	icancel()
	require.NoError(t, err, iout)
	assert.Regexp(t, `intercepted jetway in \S+\n`, iout)
	interceptOnATerminal(ctx, t, web, "-b", build[1])

	// The container is a pod of the task's image, limits and mounts,
	// listed by fly on its worker.
	var handle string
	for _, c := range flyContainers(t, web) {
		if c.WorkerName == name && c.Type == "task" {
			handle = c.ID
		}
	}
	require.NotEmpty(t, handle, "fly containers lists the task's container on %s: %v", name, flyContainers(t, web))
	pods := clusters[0].Client.CoreV1().Pods(name)
	found := containerPods(ctx, t, pods, handle)
	require.Len(t, found, 1)
	pod := found[0]
	step := pod.Spec.Containers[0]
	assert.Equal(t, "busybox:1.36", step.Image)
	assert.True(t, step.Resources.Limits.Memory().Equal(resource.MustParse("104857600")), "memory %v", step.Resources.Limits)
	assert.True(t, step.Resources.Requests.Cpu().Equal(resource.MustParse("500m")), "512 shares: half a core, %v", step.Resources.Requests)
	assert.True(t, step.Resources.Limits.Cpu().IsZero(), "shares are a weight, as Garden's: no CPU limit, %v", step.Resources.Limits)
	var mounts []string
	for _, m := range step.VolumeMounts {
		mounts = append(mounts, m.MountPath)
	}
	assert.Contains(t, mounts, "/scratch")
	assert.True(t, slices.ContainsFunc(mounts, func(m string) bool { return strings.HasPrefix(m, "/tmp/build/") }), "the build dir: %v", mounts)
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), secret, "a param never reaches the pod")
	assert.False(t, *step.SecurityContext.Privileged, "not privileged")

	// Garden's own client, as the web node's: properties are durable.
	// gardenOf is the Garden client of worker, once fly lists it running
	// at an address other than old.
	gardenOf := func(worker, old string) (gclient.Client, string) {
		w := flyWorker(t, web, worker, 30*time.Second, func(w wire.Worker, found bool) bool {
			return found && w.State == "running" && w.GardenAddr != old
		})
		return gclient.New(gconn.New("tcp", w.GardenAddr)), w.GardenAddr
	}
	gc, addr := gardenOf(name, "")
	c, err := gc.Lookup(handle)
	require.NoError(t, err)
	require.NoError(t, c.SetProperty("jetway:test", "kept"))
	_, err = gc.Lookup("no-such-container")
	assert.ErrorAs(t, err, &garden.ContainerNotFoundError{})
	g.stop()
	g = startGateway(t, dir, opts)
	gc, _ = gardenOf(name, addr)
	eventually(t, 30*time.Second, func() error {
		c, err := gc.Lookup(handle)
		if err != nil {
			return err
		}
		v, err := c.Property("jetway:test")
		if err != nil || v != "kept" {
			return errorf("property after a restart: %q, %v", v, err)
		}
		return nil
	})
	c, err = gc.Lookup(handle)
	require.NoError(t, err)
	props, err := c.Properties()
	require.NoError(t, err)
	assert.Equal(t, "kept", props["jetway:test"])
	listed, err := gc.Containers(garden.Properties{"jetway:test": "kept"})
	require.NoError(t, err)
	var handles []string
	for _, c := range listed {
		handles = append(handles, c.Handle())
	}
	assert.Equal(t, []string{handle}, handles, "a list filtered by properties")

	// fly abort ends a running task: Stop reaches its process. Before,
	// fly intercept runs a command beside it.
	sleeper := filepath.Join(work, "sleeper.yml")
	writeFile(t, sleeper, []byte("platform: linux\nrootfs_uri: docker:///busybox\nrun: {path: sh, args: [-c, 'echo sleeping; exec sleep 600']}\n"))
	runs := `jetway_concourse_garden_calls_total{call="run",result="ok"}`
	ran := metricValue(t, g, runs)
	aborted := make(chan string, 1)
	go func() {
		fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
		defer fcancel()
		out, err := web.FlyContext(fctx, "execute", "-c", sleeper)
		aborted <- fmt.Sprintf("%s%v", out, err)
	}()
	sleeping := awaitStartedBuild(t, web)
	eventually(t, 30*time.Second, func() error {
		if n := metricValue(t, g, runs); n <= ran {
			return errorf("the sleeper's process is not run yet (%v runs)", n)
		}
		return nil
	})
	// fly intercept into the running task: a second process of its
	// container, beside the task's.
	ictx, icancel = context.WithTimeout(ctx, 60*time.Second)
	iout, err = web.FlyContext(ictx, "intercept", "-b", sleeping, "--", "sh", "-c", `echo "beside the task in $(pwd)"`)
	icancel()
	require.NoError(t, err, iout)
	assert.Regexp(t, `beside the task in \S+\n`, iout)
	_, err = web.Fly("abort-build", "-b", sleeping)
	require.NoError(t, err)
	select {
	case out := <-aborted:
		assert.Contains(t, out, "interrupted")
	case <-time.After(60 * time.Second):
		t.Fatal("fly execute did not end after fly abort-build")
	}

	// An input moved into the pod and an output moved back out: fly
	// downloads what the task wrote.
	upload, download := filepath.Join(work, "in"), filepath.Join(work, "out")
	payload := rand.Text() + "\n"
	writeFile(t, filepath.Join(upload, "payload"), []byte(payload))
	require.NoError(t, os.MkdirAll(download, 0o755))
	copyTask := filepath.Join(work, "copy.yml")
	writeFile(t, copyTask, []byte("platform: linux\nrootfs_uri: docker:///busybox\ninputs: [{name: in}]\noutputs: [{name: out}]\n"+
		"run: {path: sh, args: [-c, 'cat in/payload > out/copy && echo copied']}\n"))
	fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
	out, err = web.FlyContext(fctx, "execute", "-c", copyTask, "-i", "in="+upload, "-o", "out="+download)
	fcancel()
	require.NoError(t, err, out)
	assert.Contains(t, out, "copied")
	got, err := os.ReadFile(filepath.Join(download, "copy"))
	require.NoError(t, err, out)
	assert.Equal(t, payload, string(got))
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_concourse_volume_moves_total{direction="out"}`), 1.0)

	// A failing task fails the build, its stderr in the build's log.
	out, err = execute(failing)
	require.Error(t, err, out)
	assert.Contains(t, out, "to-stderr")
	assert.Contains(t, out, "failed")

	// The web node collects the one-off build's container after its
	// grace period: the sweep destroys it, pod and record.
	eventually(t, 90*time.Second, func() error {
		if slices.ContainsFunc(flyContainers(t, web), func(c flyRow) bool { return c.ID == handle }) {
			return errorf("fly still lists %s", handle)
		}
		if p := containerPods(ctx, t, pods, handle); len(p) > 0 && p[0].DeletionTimestamp == nil {
			return errorf("its pod is still there")
		}
		if _, err := gc.Lookup(handle); !errors.As(err, &garden.ContainerNotFoundError{}) {
			return errorf("Garden still finds it: %v", err)
		}
		return nil
	})
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_concourse_destroyed_total{kind="containers",result="destroyed"}`), 1.0)
}

// TestConcourseContainerImagesAndPolicy: what a container's pod runs and
// whether it is made, through Garden's own client and the worker's volume
// API as jetway serves them (no web node, whose sweeps would collect the
// volumes made here by hand). Images from volumes: a copy of a base
// type's import runs the image the operator mapped, a copy of a
// registry-image get's volume its repository@digest, anything else is
// refused saying why. A privileged container is refused on a target whose
// policy does not allow it, naming the key, and made on one that does. A
// bad handle is refused. Garden's Destroy deletes the pod and the record.
func TestConcourseContainerImagesAndPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const name, trusted = "cwi", "cwi-priv"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	placeTarget(ctx, t, clusters[1], dir, trusted, "steps: {allowPrivileged: true}\n", "")
	const baseImage = "registry.example/jetway/mock-resource:1.0"
	g := startGateway(t, dir, gatewayOptions{resourceTypes: []wire.ResourceType{{Type: "mock", Image: baseImage, Version: "1"}}})
	g.waitTarget(t, name, 30*time.Second, inState("running"))
	g.waitTarget(t, trusted, 30*time.Second, inState("running"))
	serve := func(h http.Handler) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	gardenOf := func(target string) gclient.Client {
		return gclient.New(gconn.New("tcp", strings.TrimPrefix(serve(g.containers.API(target)), "http://")))
	}
	gc := gardenOf(name)
	bc := serve(g.holder.API(name))
	pods := clusters[0].Client.CoreV1().Pods(name)

	// An async create is answered once the volume is made: the web
	// node's first poll, at once, finds it.
	resp, err := http.Post(bc+"/volumes-async", "application/json", strings.NewReader(`{"handle":"cwi-async","strategy":{"type":"empty"}}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, err = http.Get(bc + "/volumes-async/cwi-async")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), `"handle":"cwi-async"`)

	imported := createVolume(t, bc, map[string]any{"handle": "cwi-import", "strategy": map[string]any{"type": "import", "path": baseImage}})
	copied := createVolume(t, bc, map[string]any{"handle": "cwi-import-cow", "strategy": map[string]any{"type": "cow", "volume": imported.Handle}})
	got := createVolume(t, bc, map[string]any{"handle": "cwi-get", "strategy": map[string]any{"type": "empty"}})
	streamIn(t, bc, got.Handle, map[string]string{"repository": "registry.example/team/app\n",
		"digest": "sha256:" + strings.Repeat("ab", 32) + "\n", "rootfs/etc/hostname": "x\n"})
	gotCopy := createVolume(t, bc, map[string]any{"handle": "cwi-get-cow", "strategy": map[string]any{"type": "cow", "volume": got.Handle}})
	built := createVolume(t, bc, map[string]any{"handle": "cwi-built", "strategy": map[string]any{"type": "empty"}})
	other := createVolume(t, bc, map[string]any{"handle": "cwi-other", "strategy": map[string]any{"type": "import", "path": "/somewhere/else"}})
	imageOf := func(handle, rootfs string) string {
		_, err := gc.Create(garden.ContainerSpec{Handle: handle, RootFSPath: rootfs})
		require.NoError(t, err, rootfs)
		p := containerPods(ctx, t, pods, handle)
		require.Len(t, p, 1)
		return p[0].Spec.Containers[0].Image
	}
	assert.Equal(t, baseImage, imageOf("cwi-base", "raw://"+copied.Path), "a base type's import runs the image mapped")
	assert.Equal(t, "registry.example/team/app@sha256:"+strings.Repeat("ab", 32), imageOf("cwi-image", "raw://"+gotCopy.Path+"/rootfs"),
		"a registry-image get's volume runs its repository@digest")
	assert.Equal(t, "busybox:1.36", imageOf("cwi-docker", "docker:///busybox#1.36"))

	// The web node reads metadata.json before it runs an image from a
	// volume: a get without the layers (skip_download) wrote none, and
	// gets metadata that adds nothing to the image's own, in the
	// encoding asked for; any other volume's missing file stays missing.
	layerFree := createVolume(t, bc, map[string]any{"handle": "cwi-layer-free", "strategy": map[string]any{"type": "empty"}})
	streamIn(t, bc, layerFree.Handle, map[string]string{"repository": "registry.example/team/app\n", "digest": "sha256:" + strings.Repeat("cd", 32) + "\n"})
	metadata := func(handle, encoding string) (int, string) {
		req, err := http.NewRequest(http.MethodPut, bc+"/volumes/"+handle+"/stream-out?path=metadata.json", nil)
		require.NoError(t, err)
		req.Header.Set("Accept-Encoding", encoding)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body io.Reader = resp.Body
		if resp.StatusCode == http.StatusOK && encoding == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			require.NoError(t, err)
			body = zr
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(body)
			return resp.StatusCode, string(b)
		}
		tr := tar.NewReader(body)
		h, err := tr.Next()
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		return resp.StatusCode, h.Name + ": " + string(b)
	}
	for _, enc := range []string{"gzip", "raw"} {
		code, got := metadata(layerFree.Handle, enc)
		assert.Equal(t, http.StatusOK, code, got)
		assert.Equal(t, "metadata.json: {\"env\":[],\"user\":\"\"}\n", got, enc)
	}
	code, body := metadata(built.Handle, "gzip")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, `{"error":"no such file or directory"}`, body)
	for rootfs, want := range map[string]string{
		"raw://" + built.Path + "/rootfs": "worker cwi serves no rootfs as an image: set " + targets.HolderImagesKey,
		"raw:///no/such/volume":           "has no volume at /no/such/volume",
		"raw://" + other.Path:             `is no base resource type's import (imported from "/somewhere/else")`,
		"oci:///some/layout":              "jetway runs docker:///REPOSITORY#TAG",
		"":                                "jetway runs docker:///REPOSITORY#TAG",
	} {
		h := "cwi-bad-" + strings.ToLower(rand.Text()[:6])
		_, err := gc.Create(garden.ContainerSpec{Handle: h, RootFSPath: rootfs})
		require.Error(t, err, rootfs)
		assert.Contains(t, err.Error(), want, rootfs)
		_, err = gc.Lookup(h)
		assert.ErrorAs(t, err, &garden.ContainerNotFoundError{}, "nothing is kept of a refused container")
		assert.Empty(t, containerPods(ctx, t, pods, h))
	}
	_, err = gc.Create(garden.ContainerSpec{Handle: "bad handle!", RootFSPath: "docker:///busybox"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `container handle "bad handle!"`)
	_, err = gc.Create(garden.ContainerSpec{Handle: "cwi-docker", RootFSPath: "docker:///busybox"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a container with handle cwi-docker already exists on worker cwi")

	// Privileged: refused where the policy does not allow it, naming the
	// key; made where it does.
	_, err = gc.Create(garden.ContainerSpec{Handle: "cwi-root", RootFSPath: "docker:///busybox", Privileged: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "worker cwi does not run privileged containers")
	assert.Contains(t, err.Error(), targets.PrivilegedKey)
	_, err = gardenOf(trusted).Create(garden.ContainerSpec{Handle: "cwi-root", RootFSPath: "docker:///busybox", Privileged: true})
	require.NoError(t, err)
	p := containerPods(ctx, t, clusters[1].Client.CoreV1().Pods(trusted), "cwi-root")
	require.Len(t, p, 1)
	assert.True(t, *p[0].Spec.Containers[0].SecurityContext.Privileged)

	// Garden's destroy deletes the pod and forgets the container.
	require.NoError(t, gc.Destroy("cwi-base"))
	_, err = gc.Lookup("cwi-base")
	assert.ErrorAs(t, err, &garden.ContainerNotFoundError{})
	eventually(t, 10*time.Second, func() error {
		if p := containerPods(ctx, t, pods, "cwi-base"); len(p) > 0 && p[0].DeletionTimestamp == nil {
			return errorf("the destroyed container's pod is still there")
		}
		return nil
	})
	assert.ErrorAs(t, gc.Destroy("cwi-base"), &garden.ContainerNotFoundError{}, "destroyed once")
	for _, h := range []string{"cwi-image", "cwi-docker"} {
		require.NoError(t, gc.Destroy(h))
	}
	require.NoError(t, gardenOf(trusted).Destroy("cwi-root"))
}

type corev1Pods = interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
}

// bcVolume is a volume as the volume API answers it.
type bcVolume struct {
	Handle string `json:"handle"`
	Path   string `json:"path"`
}

// createVolume makes a volume through a worker's volume API, as the web
// node does (synchronously).
func createVolume(t *testing.T, url string, req map[string]any) bcVolume {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(url+"/volumes", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(b))
	var v bcVolume
	require.NoError(t, json.Unmarshal(b, &v))
	return v
}

// streamIn writes files into a volume through a worker's volume API, as
// an uncompressed tar.
func streamIn(t *testing.T, url, handle string, files map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, content := range files {
		if dir := filepath.Dir(name); dir != "." {
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755}))
		}
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content))}))
		_, err := tw.Write([]byte(content))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	req, err := http.NewRequest(http.MethodPut, url+"/volumes/"+handle+"/stream-in?path=.", &buf)
	require.NoError(t, err)
	req.Header.Set("Content-Encoding", "raw")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, string(b))
}

// TestConcourseProcesses: processes in a web node's container, through
// Garden's own client: exit status, stdout and stderr apart, the
// container's and the process's environment, the working dir in the
// container's mounts, stdin to its end (a resource script's request), an
// unknown process, Stop as abort (TERM), and a process that outlives its
// gateway: a new gateway's Attach replays its output from the start and
// follows it to its exit status.
func TestConcourseProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const name = "cwp"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	opts := gatewayOptions{state: newState(t)}
	g := startGateway(t, dir, opts)
	g.waitTarget(t, name, 30*time.Second, inState("running"))
	gardenOf := func(g *gateway) gclient.Client {
		srv := httptest.NewServer(g.containers.API(name))
		t.Cleanup(srv.Close)
		return gclient.New(gconn.New("tcp", strings.TrimPrefix(srv.URL, "http://")))
	}
	gc := gardenOf(g)
	c, err := gc.Create(garden.ContainerSpec{Handle: "cwp-1", RootFSPath: "docker:///busybox",
		BindMounts: []garden.BindMount{{SrcPath: "/v/w", DstPath: "/tmp/build/w", Mode: garden.BindMountModeRW}},
		Env:        []string{"FROM_CONTAINER=c"}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, gardenOf(g).Destroy("cwp-1")) }()

	var stdout, stderr bytes.Buffer
	p, err := c.Run(garden.ProcessSpec{ID: "task", Path: "sh", Dir: "/tmp/build/w", Env: []string{"FROM_PROCESS=p"},
		Args: []string{"-c", `echo "out $FROM_CONTAINER $FROM_PROCESS"; pwd; echo err >&2; exit 3`}},
		garden.ProcessIO{Stdout: &stdout, Stderr: &stderr})
	require.NoError(t, err)
	assert.Equal(t, "task", p.ID())
	status, err := p.Wait()
	require.NoError(t, err)
	assert.Equal(t, 3, status)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.Len(t, lines, 2, stdout.String())
	assert.Equal(t, "out c p", lines[0])
	assert.True(t, strings.HasSuffix(lines[1], "/volumes/m0"), "the working dir is the mount's folder: %s", lines[1])
	assert.Contains(t, stderr.String(), "err\n")

	stdout.Reset()
	p, err = c.Run(garden.ProcessSpec{ID: "resource", Path: "cat"},
		garden.ProcessIO{Stdin: strings.NewReader(`{"source":{"uri":"x"}}`), Stdout: &stdout, Stderr: io.Discard})
	require.NoError(t, err)
	status, err = p.Wait()
	require.NoError(t, err)
	assert.Equal(t, 0, status)
	assert.Equal(t, `{"source":{"uri":"x"}}`, stdout.String(), "stdin to its end")

	_, err = c.Attach("no-such-process", garden.ProcessIO{})
	assert.ErrorAs(t, err, &garden.ProcessNotFoundError{})

	// Stop ends the container's processes: TERM.
	p, err = c.Run(garden.ProcessSpec{ID: "sleeper", Path: "sleep", Args: []string{"600"}}, garden.ProcessIO{Stdout: io.Discard, Stderr: io.Discard})
	require.NoError(t, err)
	require.NoError(t, c.Stop(false))
	status, err = p.Wait()
	require.NoError(t, err)
	assert.Equal(t, 128+15, status, "ended by TERM")

	// A process outlives its gateway; a new one replays and follows it.
	started := make(chan struct{})
	slow := &notifyWriter{match: "one\n", seen: started}
	_, err = c.Run(garden.ProcessSpec{ID: "slow", Path: "sh", Args: []string{"-c", "echo one; sleep 3; echo two; exit 4"}},
		garden.ProcessIO{Stdout: slow, Stderr: io.Discard})
	require.NoError(t, err)
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the process never printed its first line")
	}
	g.stop()
	g = startGateway(t, dir, opts)
	g.waitTarget(t, name, 30*time.Second, inState("running"))
	c, err = gardenOf(g).Lookup("cwp-1")
	require.NoError(t, err)
	stdout.Reset()
	p, err = c.Attach("slow", garden.ProcessIO{Stdout: &stdout, Stderr: io.Discard})
	require.NoError(t, err)
	status, err = p.Wait()
	require.NoError(t, err)
	assert.Equal(t, 4, status)
	assert.Equal(t, "one\ntwo\n", stdout.String(), "replayed from its start, then followed")
}

// notifyWriter closes seen once what was written contains match.
type notifyWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	match string
	seen  chan struct{}
	once  sync.Once
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.match) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// interceptOnATerminal: `fly intercept` from a terminal, without a
// command, gets a shell on a terminal in the container fly's args select
// (bash, or sh where the image has no bash: fly tries sh when bash is not
// found), of the user's window size, resized with the user's window; what
// is typed is its stdin, and fly exits with the shell's exit status.
func interceptOnATerminal(ctx context.Context, t *testing.T, web *cwn.WebNode, container ...string) {
	t.Helper()
	ictx, icancel := context.WithTimeout(ctx, 90*time.Second)
	defer icancel()
	term, err := web.FlyOnTerminal(ictx, pty.Size{Columns: 91, Rows: 21}, slices.Concat([]string{"intercept"}, container)...)
	require.NoError(t, err)
	code, werr := -1, error(nil)
	defer func() {
		if code == -1 {
			_, _ = term.Wait(ictx)
		}
	}()
	// Typed again until a shell answers: what is typed while fly tries
	// bash, where the image has none, goes with that try.
	var at int
	require.Eventually(t, func() bool {
		if term.Type("stty size; test -t 0 && test -t 1 && echo on-a-$((6*7))-tty\n") != nil {
			return false
		}
		at, err = term.AwaitShown("21 91\r\n", 0, 2*time.Second)
		return err == nil
	}, time.Minute, time.Millisecond, "the shell answers: %s", term.Shown())
	_, err = term.AwaitShown("on-a-42-tty\r\n", at, 10*time.Second)
	require.NoError(t, err)
	// fly sends the new size when its window changes (SIGWINCH): asked
	// again until the shell sees it, as the signal and the keys race in
	// fly.
	require.NoError(t, term.Resize(pty.Size{Columns: 133, Rows: 44}))
	require.Eventually(t, func() bool {
		if term.Type("stty size\n") != nil {
			return false
		}
		_, err := term.AwaitShown("44 133\r\n", at, 500*time.Millisecond)
		return err == nil
	}, 30*time.Second, time.Millisecond, "the shell's terminal takes the new size: %s", term.Shown())
	require.NoError(t, term.Type("exit 5\n"))
	code, werr = term.Wait(ictx)
	require.NoError(t, werr)
	assert.Equal(t, 5, code, "fly exits with the shell's status: %s", term.Shown())
}
