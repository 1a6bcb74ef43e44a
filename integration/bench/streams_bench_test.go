package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

var streamMiB = envInt("BENCH_STREAM_MIB", 1024)

// BenchmarkStreams copies one artifact from a pod on cluster A into a pod
// on cluster B three ways in one run: (a) the floor, a minimal client-go
// port-forward pipe (integration/cmd/pfpipe); (b) jetway's relay through a
// real gateway's POST /api/v1/streams; (c) for reference, two kubectl
// port-forwards with curl piping between them. It reports MB/s and CPU
// seconds per GiB of each, b/a, the gateway's peak RSS, and a CPU profile
// of the relay run in process.
func BenchmarkStreams(b *testing.B) {
	for range b.N {
		runStreamsBench(b)
	}
}

type pathResult struct {
	name    string
	seconds float64
	cpu     float64
}

func runStreamsBench(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cs := cluster.ForTest(b, 2)
	dir := b.TempDir()
	kubeconfigs := map[string]string{}
	vols := map[string]*volumes.Server{}
	key, stateFlags := benchState(ctx, b, cs[0])
	for i, name := range []string{"a", "b"} {
		c := cs[i]
		t, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "bench-" + name, Rules: targets.RBACRules(targets.Required)})
		if err != nil {
			b.Fatal(err)
		}
		kubeconfigs[name] = filepath.Join(dir, name+".kubeconfig")
		if err := writeFile(kubeconfigs[name], t.Kubeconfig); err != nil {
			b.Fatal(err)
		}
		pod := map[string]string{"a": "src", "b": "dst"}[name]
		vs, err := volumes.Start(b.TempDir(), ownership.TokenHash(sidecarToken(key, name, pod)))
		if err != nil {
			b.Fatal(err)
		}
		defer vs.Kill()
		vols[name] = vs
		runBenchPod(ctx, b, c, key, "bench-"+name, name, pod)
		if err := c.ForwardPodPort(ctx, "bench-"+name, pod, streams.VolumePort, "127.0.0.1", vs.Port()); err != nil {
			b.Fatal(err)
		}
	}
	size := int64(streamMiB) << 20
	writeArtifact(b, filepath.Join(vols["a"].Path("art"), "out", "artifact.bin"), size)
	for _, h := range []string{"in-floor", "in-jetway", "in-kubectl", "in-profile", "warm"} {
		if err := os.MkdirAll(vols["b"].Path(h), 0o755); err != nil {
			b.Fatal(err)
		}
	}

	bin := buildGateway(b)
	gw := startGateway(b, bin, dir, stateFlags...)
	defer gw.stop(b)
	req := func(handle string) wire.StreamRequest {
		return wire.StreamRequest{From: wire.Endpoint{Target: "a", Pod: "src", Handle: "art", Path: "out"},
			To: wire.Endpoint{Target: "b", Pod: "dst", Handle: handle, Path: "in"}, Encoding: "raw"}
	}
	// Warm up: kwok serves the forwards, both targets run, paths are open.
	waitFor(b, time.Minute, func() error {
		os.MkdirAll(filepath.Join(vols["a"].Path("warm"), "out"), 0o755)
		_, err := postStream(gw.base, wire.StreamRequest{From: wire.Endpoint{Target: "a", Pod: "src", Handle: "warm", Path: "out"},
			To: wire.Endpoint{Target: "b", Pod: "dst", Handle: "warm", Path: "in"}})
		return err
	})

	var results []pathResult
	b.ResetTimer()
	// (a) the floor
	pfpipe := goBuild(b, "github.com/jetway-ci/jetway/integration/cmd/pfpipe")
	start := time.Now()
	cmd := exec.CommandContext(ctx, pfpipe, "--src-kubeconfig", kubeconfigs["a"], "--src-pod", "src",
		"--src-path", "/volumes/art/stream-out?path=out", "--dst-kubeconfig", kubeconfigs["b"], "--dst-pod", "dst",
		"--dst-path", "/volumes/in-floor/stream-in?path=in", "--src-token", sidecarToken(key, "a", "src"), "--dst-token", sidecarToken(key, "b", "dst"))
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("pfpipe: %v\n%s", err, out)
	}
	results = append(results, pathResult{"a: client-go pipe (floor)", time.Since(start).Seconds(),
		(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()})

	// (b) jetway
	cpu0 := gw.cpu()
	start = time.Now()
	res, err := postStream(gw.base, req("in-jetway"))
	if err != nil {
		b.Fatal(err)
	}
	results = append(results, pathResult{"b: jetway relay", time.Since(start).Seconds(), (gw.cpu() - cpu0).Seconds()})
	if res.Bytes < size {
		b.Fatalf("jetway carried %d bytes of %d", res.Bytes, size)
	}

	// (c) kubectl + curl
	results = append(results, kubectlPipe(ctx, b, kubeconfigs, key))
	b.StopTimer()

	for _, h := range []string{"in-floor", "in-jetway", "in-kubectl"} {
		info, err := os.Stat(filepath.Join(vols["b"].Path(h), "in", "artifact.bin"))
		if err != nil || info.Size() != size {
			b.Fatalf("%s: destination has %v bytes (%v), want %d", h, info, err, size)
		}
	}
	gib := float64(size) / (1 << 30)
	b.Logf("artifact %d MiB, raw encoding, pod on cluster A -> pod on cluster B", streamMiB)
	b.Logf("%-28s %8s %12s", "path", "MB/s", "CPU s/GiB")
	for _, r := range results {
		b.Logf("%-28s %8.1f %12.2f", r.name, float64(size)/1e6/r.seconds, r.cpu/gib)
	}
	ratio := results[0].seconds / results[1].seconds
	b.Logf("b/a throughput ratio %.3f (goal >= 0.9); gateway peak RSS %d KB (goal < 100 MB)", ratio, gw.status("VmHWM"))
	b.ReportMetric(float64(size)/1e6/results[0].seconds, "floor-MB/s")
	b.ReportMetric(float64(size)/1e6/results[1].seconds, "jetway-MB/s")
	b.ReportMetric(float64(size)/1e6/results[2].seconds, "kubectl-MB/s")
	b.ReportMetric(ratio, "jetway/floor")
	b.ReportMetric(float64(gw.status("VmHWM"))/1024, "gateway-peak-RSS-MB")

	profileRelay(ctx, b, kubeconfigs, key, req("in-profile"))
}

// profileRelay runs jetway's relay in this process under the CPU profiler
// and logs where its time goes.
func profileRelay(ctx context.Context, b *testing.B, kubeconfigs map[string]string, key ownership.Key, body wire.StreamRequest) {
	ts := map[string]*targets.Target{}
	for name, path := range kubeconfigs {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{})
		cfg, err := loader.ClientConfig()
		if err != nil {
			b.Fatal(err)
		}
		ns, _, _ := loader.Namespace()
		t, err := targets.NewTarget(&targets.Config{Name: name, Meta: targets.Metadata{Namespace: ns}, REST: cfg}, "jetway")
		if err != nil {
			b.Fatal(err)
		}
		ts[name] = t
	}
	d := portforward.New(portforward.Options{Resolve: func(t string) (*rest.Config, error) { return ts[t].Config.REST, nil }})
	dctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- d.Start(dctx) }()
	defer func() { stop(); <-done }()
	s := streams.New(streams.Options{Dialer: d, Installation: "jetway", Key: key,
		Target: func(t string) (*targets.Target, error) { return ts[t], nil }})
	defer s.Close()
	profile := filepath.Join(os.Getenv("JETWAY_BIN_DIR"), "streams-relay.cpu.pprof")
	f, err := os.Create(profile)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	req := streams.Request{StreamRequest: body, Caller: streams.Caller{Admin: true}}
	_, err = s.Stream(ctx, req, nil)
	pprof.StopCPUProfile()
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", profile).CombinedOutput()
	if err != nil {
		b.Logf("pprof: %v", err)
	}
	b.Logf("relay CPU profile (%s), includes this process's volume servers:\n%s", profile, out)
}

var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 7788`)

// kubectlPipe pipes curl through two kubectl port-forwards.
func kubectlPipe(ctx context.Context, b *testing.B, kubeconfigs map[string]string, key ownership.Key) pathResult {
	kubectl := filepath.Join(os.Getenv("JETWAY_BIN_DIR"), "kubectl")
	ports := map[string]string{}
	var procs []*exec.Cmd
	for name, pod := range map[string]string{"a": "src", "b": "dst"} {
		cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfigs[name], "port-forward", "pod/"+pod, ":7788")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatalf("kubectl: %v", err)
		}
		procs = append(procs, cmd)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := forwarding.FindStringSubmatch(sc.Text()); m != nil {
				ports[name] = m[1]
				break
			}
		}
		go func() {
			for sc.Scan() {
			}
		}()
	}
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	var before time.Duration
	for _, p := range procs {
		before += procCPU(p.Process.Pid)
	}
	start := time.Now()
	pipe := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", fmt.Sprintf(
		`curl -fsS -X PUT -H 'Accept-Encoding: raw' -H 'Authorization: Bearer %s' 'http://127.0.0.1:%s/volumes/art/stream-out?path=out' | `+
			`curl -fsS -X PUT -H 'Content-Encoding: raw' -H 'Authorization: Bearer %s' -T - 'http://127.0.0.1:%s/volumes/in-kubectl/stream-in?path=in'`,
		sidecarToken(key, "a", "src"), ports["a"], sidecarToken(key, "b", "dst"), ports["b"]))
	if out, err := pipe.CombinedOutput(); err != nil {
		b.Fatalf("curl pipe: %v\n%s", err, out)
	}
	wall := time.Since(start)
	var after time.Duration
	for _, p := range procs {
		after += procCPU(p.Process.Pid)
	}
	cpu := after - before + pipe.ProcessState.UserTime() + pipe.ProcessState.SystemTime()
	return pathResult{"c: kubectl + curl", wall.Seconds(), cpu.Seconds()}
}

func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	var utime, stime int64
	fmt.Sscan(fields[11], &utime)
	fmt.Sscan(fields[12], &stime)
	return time.Duration(utime+stime) * time.Second / 100
}

func writeArtifact(b *testing.B, path string, size int64) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	for written := int64(0); written < size; written += int64(len(buf)) {
		_, _ = rand.Read(buf)
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// sidecarToken is the sidecar token of the bench's pod name on target: its
// nonce is the pod's name (runBenchPod).
func sidecarToken(key ownership.Key, target, name string) string {
	return key.Token(target, name, name)
}

// runBenchPod runs a step pod of target (jetway's ownership labels, seal,
// nonce and binding, so streams may touch it) and waits for it to run.
func runBenchPod(ctx context.Context, b *testing.B, c *cluster.Cluster, key ownership.Key, ns, target, name string) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: ownership.Labels(target, "jetway"),
		Annotations: map[string]string{ownership.SealAnnotation: key.Seal(target, name, ""), ownership.NonceAnnotation: name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: "example.invalid/step"}}}}
	created, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ownership.Bind(ctx, c.Client.CoreV1().Pods(ns), key, target, created); err != nil {
		b.Fatal(err)
	}
	waitFor(b, time.Minute, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s/%s not running: %v", ns, name, err)
		}
		return nil
	})
}

func waitFor(b *testing.B, within time.Duration, check func() error) {
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("after %s: %v", within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func postStream(base string, req wire.StreamRequest) (wire.StreamResult, error) {
	body, _ := json.Marshal(req)
	resp, err := http.Post(base+"/api/v1/streams", "application/json", bytes.NewReader(body))
	if err != nil {
		return wire.StreamResult{}, err
	}
	defer resp.Body.Close()
	var res wire.StreamResult
	if resp.StatusCode != http.StatusOK {
		var e map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return res, fmt.Errorf("%s: %v", resp.Status, e)
	}
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

// benchState makes a state namespace on c for a gateway's flags, and the
// installation's pod key there (as a gateway makes it), which the bench
// seals its pods with.
func benchState(ctx context.Context, b *testing.B, c *cluster.Cluster) (ownership.Key, []string) {
	state, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "bench-state", Rules: targets.RBACRules(steps.StatePermissions)})
	if err != nil {
		b.Fatal(err)
	}
	key, err := ownership.LoadKey(ctx, c.Client.CoreV1(), "bench-state", "jetway")
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "state.kubeconfig")
	if err := writeFile(file, state.Kubeconfig); err != nil {
		b.Fatal(err)
	}
	return key, []string{"--state-kubeconfig", file, "--state-namespace", "bench-state"}
}
