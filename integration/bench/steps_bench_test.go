package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

var benchSteps = envInt("BENCH_STEPS", 100)

// benchNode is where a benchmark's steps run: kwok's fake node, whose
// step kubelet runs each process on this machine, or the real node
// (kubelet, containerd and runc; integration/cluster/node.go).
type benchNode struct {
	name  string
	real  bool
	image string // the tasks' image
	// script prints the time (ns since the epoch) as the process starts
	// and as it is about to exit, and exits.
	script string
}

var (
	kwokNode = benchNode{name: "kwok", image: "busybox:1.37", script: `date +%s%N; echo work; date +%s%N`}
	// busybox's date has no %N: the node's image has stamp.
	realNode   = benchNode{name: "real-node", real: true, image: cluster.BusyboxImage, script: `stamp; echo work; stamp`}
	benchNodes = []benchNode{kwokNode, realNode}
)

// BenchmarkSteps runs short tasks one after another on a local cluster two
// ways in one run, alternating: (a) the floor, what a bare client-go
// program does (create a pod, wait for Running with a watch, exec the
// command); (b) jetway, a step submitted to a real gateway, followed
// through its events. It reports p50 and p99 from submit (pod create) to
// process start and from process exit to the exited event (the exec's
// return), and jetway's ratios to the floor.
//
// It runs on kwok's node and on the real node, one after the other.
func BenchmarkSteps(b *testing.B) {
	for _, node := range benchNodes {
		b.Run(node.name, func(b *testing.B) {
			for range b.N {
				runStepsBench(b, node)
			}
		})
	}
}

func runStepsBench(b *testing.B, node benchNode) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// kwok's node runs the agent from a local folder whatever the pod
	// says: its gateway is the init-container one alone.
	mount := string(steppod.AgentInitContainer)
	if node.real {
		mount = string(steppod.AgentImageVolume)
	}
	bed, gw, stop := stepsGateway(ctx, b, node, "", "--step-agent-mount", mount)
	defer stop()
	// On the real node, a second gateway over the same target makes its
	// step pods with the init container (the fallback on runtimes without
	// image volumes): each step is driven by the gateway it was submitted
	// to.
	var fallbackGW *gatewayProc
	if node.real {
		fallbackGW = bed.gateway(b, "", "--step-agent-mount", string(steppod.AgentInitContainer))
		defer fallbackGW.stop(b)
	}

	var floor, jetway, fallback latencies
	for i := range benchSteps {
		floor.add(b, bed.floorStep(ctx, b, fmt.Sprintf("floor-%d", i)))
		jetway.add(b, jetwayStep(ctx, b, node, gw.base, fmt.Sprintf("jetway-%d", i)))
		if fallbackGW != nil {
			fallback.add(b, jetwayStep(ctx, b, node, fallbackGW.base, fmt.Sprintf("fallback-%d", i)))
		}
	}
	floor.report(b, "floor")
	jetway.report(b, "jetway")
	reportRatios(b, "", jetway, floor)
	if fallbackGW != nil {
		fallback.report(b, "fallback")
		reportRatios(b, "fallback-", fallback, floor)
	}
}

// reportRatios reports l's start and exit p50 and p99 against the
// floor's, each metric's name prefixed.
func reportRatios(b *testing.B, prefix string, l, floor latencies) {
	for _, q := range []float64{0.5, 0.99} {
		name := "p" + strconv.Itoa(int(q*100))
		b.ReportMetric(ratio(l.start, floor.start, q), prefix+"start-"+name+"-ratio")
		b.ReportMetric(ratio(l.exit, floor.exit, q), prefix+"exit-"+name+"-ratio")
	}
	b.Logf("%sratios to the floor: start p50 %.2f p99 %.2f; exit p50 %.2f p99 %.2f", prefix,
		ratio(l.start, floor.start, 0.5), ratio(l.start, floor.start, 0.99), ratio(l.exit, floor.exit, 0.5), ratio(l.exit, floor.exit, 0.99))
}

// stepsTarget is the target stepsGateway makes: its name, and the folder
// of its kubeconfig in the gateway's targets dir.
const stepsTarget = "steps"

// stepsNamespace is the target's namespace.
const stepsNamespace = "bench-steps"

// stepsBed is a local cluster (kwok's with its step kubelet, or the real
// node's), a target on it (namespace bench-steps) and a state namespace
// (bench-state), for any number of gateways sharing them.
type stepsBed struct {
	node       benchNode
	c          *cluster.Cluster
	restCfg    *rest.Config
	dir        string
	bin        string
	stateFlags []string // and the step agent's image on the real node
	stop       func()
}

func newStepsBed(ctx context.Context, b *testing.B, node benchNode) *stepsBed {
	bed := &stepsBed{node: node, dir: b.TempDir(), bin: buildGateway(b), stop: func() {}}
	if node.real {
		c, err := cluster.Start(ctx, cluster.Options{Name: "bench-real", RealNode: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Stop)
		bed.c = c
	} else {
		bed.c = cluster.ForTest(b, 1)[0]
		agent := buildStepAgent(b)
		kctx, stopKubelet := context.WithCancel(ctx)
		var kwg sync.WaitGroup
		kwg.Go(func() {
			if err := bed.c.RunStepPods(kctx, agent); err != nil {
				b.Error(err)
			}
		})
		bed.stop = func() { stopKubelet(); kwg.Wait() }
	}
	c := bed.c
	// With the image grants, for a target.yaml that serves images.
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: stepsNamespace,
		Rules: targets.RBACRules(slices.Concat(targets.Required, targets.ImagePermissions))})
	if err != nil {
		b.Fatal(err)
	}
	state, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "bench-state", Rules: targets.RBACRules(steps.StatePermissions)})
	if err != nil {
		b.Fatal(err)
	}
	stateFile := filepath.Join(b.TempDir(), "state.kubeconfig")
	if err := writeFile(stateFile, state.Kubeconfig); err != nil {
		b.Fatal(err)
	}
	bed.stateFlags = []string{"--state-kubeconfig", stateFile, "--state-namespace", "bench-state"}
	if node.real {
		bed.stateFlags = append(bed.stateFlags, "--step-agent-image", c.NodeImage("step-agent-image.tar"))
	}
	if err := os.MkdirAll(filepath.Join(bed.dir, stepsTarget), 0o700); err != nil {
		b.Fatal(err)
	}
	if err := writeFile(filepath.Join(bed.dir, stepsTarget, "kubeconfig"), tg.Kubeconfig); err != nil {
		b.Fatal(err)
	}
	if bed.restCfg, err = clientcmd.RESTConfigFromKubeConfig(tg.Kubeconfig); err != nil {
		b.Fatal(err)
	}
	return bed
}

// gateway starts a gateway over the bed (one more replica) with flags and
// waits for the target to run. token is a team's or an admin's, for flags
// that name an --auth-tokens-file; "" for none.
func (bed *stepsBed) gateway(b *testing.B, token string, flags ...string) *gatewayProc {
	gw := startGateway(b, bed.bin, bed.dir, append(slices.Clone(bed.stateFlags), flags...)...)
	gw.token = token
	waitFor(b, time.Minute, func() error {
		for _, t := range gw.targets(b) {
			if t.State == "running" {
				return nil
			}
		}
		return fmt.Errorf("target not running yet")
	})
	return gw
}

// stepsGateway starts a steps bed on node and a gateway over it with
// flags, and waits for the target to run. token is a team's or an
// admin's, for flags that name an --auth-tokens-file; "" for none.
func stepsGateway(ctx context.Context, b *testing.B, node benchNode, token string, flags ...string) (*stepsBed, *gatewayProc, func()) {
	bed := newStepsBed(ctx, b, node)
	gw := bed.gateway(b, token, flags...)
	return bed, gw, func() { gw.stop(b); bed.stop() }
}

// sample is one task's latencies; made is jetway's alone: from the
// process's exit to the exited event's own time (made in the gateway),
// without its delivery to the client.
type sample struct{ start, exit, made time.Duration }

type latencies struct{ start, exit, made []time.Duration }

func (l *latencies) add(b *testing.B, s sample) {
	l.start = append(l.start, s.start)
	l.exit = append(l.exit, s.exit)
	l.made = append(l.made, s.made)
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ratio(a, b []time.Duration, q float64) float64 {
	return float64(quantile(a, q)) / float64(quantile(b, q))
}

func (l *latencies) report(b *testing.B, name string) {
	for _, q := range []float64{0.5, 0.99} {
		p := "p" + strconv.Itoa(int(q*100))
		b.ReportMetric(float64(quantile(l.start, q).Microseconds())/1000, name+"-start-"+p+"-ms")
		b.ReportMetric(float64(quantile(l.exit, q).Microseconds())/1000, name+"-exit-"+p+"-ms")
	}
	b.Logf("%s: start p50 %s p99 %s; exit p50 %s p99 %s", name, quantile(l.start, 0.5), quantile(l.start, 0.99),
		quantile(l.exit, 0.5), quantile(l.exit, 0.99))
	if name != "floor" {
		b.ReportMetric(float64(quantile(l.made, 0.5).Microseconds())/1000, name+"-exit-made-p50-ms")
		b.ReportMetric(float64(quantile(l.made, 0.99).Microseconds())/1000, name+"-exit-made-p99-ms")
		b.Logf("%s: exit to the exited event's making (in the gateway) p50 %s p99 %s",
			name, quantile(l.made, 0.5), quantile(l.made, 0.99))
	}
	if testing.Verbose() {
		exits := slices.Clone(l.exit)
		slices.Sort(exits)
		b.Logf("%s: exits, sorted: %v", name, exits)
	}
}

// stamps reads the two times a benchNode's script prints.
func stamps(b *testing.B, name, out string) (time.Time, time.Time) {
	f := strings.Fields(out)
	if len(f) != 3 {
		b.Fatalf("%s: unexpected output %q", name, out)
	}
	at := func(s string) time.Time {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("%s: unexpected output %q", name, out)
		}
		return time.Unix(0, n)
	}
	return at(f[0]), at(f[2])
}

// floorStep: create a pod, wait for Running with a watch, exec with
// client-go (retrying while the node does not take execs yet, as jetway
// does), delete the pod.
func (bed *stepsBed) floorStep(ctx context.Context, b *testing.B, name string) sample {
	c, cfg := bed.c, bed.restCfg
	labels := ownership.Labels("steps", "bench")
	labels[steps.HandleLabel] = name
	labels[targets.StepTypeLabel] = "task"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: stepsNamespace, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: bed.node.image, Command: []string{"sleep", "3600"}}}}}
	pods := c.Client.CoreV1().Pods(stepsNamespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	submit := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && p.Status.Phase == corev1.PodRunning {
			break
		}
	}
	var out bytes.Buffer
	for {
		out.Reset()
		err = execOnce(ctx, cfg, name, bed.node.script, &out)
		// A kwok node sometimes answers a first exec with nothing at all
		// (seen: nil error, empty output); try again, as for an error.
		if err == nil && len(strings.Fields(out.String())) == 3 || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // the node does not take execs yet
	}
	returned := time.Now()
	if err != nil {
		b.Fatal(err)
	}
	started, exiting := stamps(b, name, out.String())
	zero := int64(0) // sleep, the pod's first process, ignores TERM
	_ = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	return sample{start: started.Sub(submit), exit: returned.Sub(exiting)}
}

func execOnce(ctx context.Context, cfg *rest.Config, pod, script string, out *bytes.Buffer) error {
	client, err := rest.RESTClientFor(withCore(cfg))
	if err != nil {
		return err
	}
	req := client.Post().Namespace(stepsNamespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "step", Command: []string{"sh", "-c", script}, Stdout: true, Stderr: true},
			scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return err
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: out, Stderr: out})
}

func withCore(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.APIPath, c.GroupVersion = "/api", &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return c
}

// jetwayStep submits the task to the gateway and follows its events.
func jetwayStep(ctx context.Context, b *testing.B, node benchNode, base, handle string) sample {
	c, err := client.New(client.Options{URL: base})
	if err != nil {
		b.Fatal(err)
	}
	submit := time.Now()
	if _, created, err := c.SubmitStep(ctx, wire.Request{Handle: handle, Type: "task", Image: node.image,
		Run: wire.Run{Path: "sh", Args: []string{"-c", node.script}}}); err != nil || !created {
		b.Fatalf("submit %s: created %v, %v", handle, created, err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/steps/"+handle+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out strings.Builder
	var exited, made time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var e wire.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			b.Fatal(err)
		}
		switch e.Type {
		case wire.EventStdout:
			out.WriteString(e.Data)
		case wire.EventExited:
			exited, made = time.Now(), e.Time
		case wire.EventFailed:
			b.Fatalf("step %s failed: %+v", handle, e)
		}
	}
	started, exiting := stamps(b, handle, out.String())
	del, _ := http.NewRequest(http.MethodDelete, base+"/api/v1/steps/"+handle, nil)
	relStart := time.Now()
	if resp, err := http.DefaultClient.Do(del); err == nil {
		resp.Body.Close()
	}
	if os.Getenv("BENCH_DEBUG") != "" {
		b.Logf("%s: start %s, exit %s, release %s, total %s", handle, started.Sub(submit), exited.Sub(exiting), time.Since(relStart), time.Since(submit))
	}
	return sample{start: started.Sub(submit), exit: exited.Sub(exiting), made: made.Sub(exiting)}
}

func buildStepAgent(b *testing.B) string {
	return goBuild(b, "github.com/jetway-ci/jetway/cmd/step-agent")
}
