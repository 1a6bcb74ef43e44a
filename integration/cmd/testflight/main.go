// Command testflight runs Concourse v8.2.5's own integration suite
// (testflight, ../shared/concourse/testflight) against jetway: the
// harness's real node (kubelet, containerd, runc) with one jetway target
// on it, registered by bin/gateway as the only worker of the suite's web
// node, with Concourse's mock resource type as jetway's image of it
// (bin/mock-image.tar). `make testflight` builds what it needs and runs
// it; docs/testing.md says how long it takes and what it proves.
//
// In order: the real node; the target's namespace, Role and kubeconfig,
// and a state namespace; testflight.sh with WORKER=none (PostgreSQL and
// the web node alone, with a client the gateway registers its worker
// through); the gateway; `testflight.sh suite` (FOCUS and SKIP pass
// through); then everything stops, in the reverse order, also on Ctrl-C.
// The suite's results are in OUT (results.tsv, summary.txt, suite.log),
// the gateway's log and testflight.sh's beside them; the exit status is
// the suite's. The state folder must be outside any git work tree (see
// -dir).
package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/provision"
	"github.com/jetway-ci/jetway/targets"
)

const (
	// target is the target's (and the worker's) name and namespace.
	target = "testflight"
	// stateNamespace keeps the gateway's step records and leases.
	stateNamespace = "jetway-state"
	// clientID registers the worker through the web node's REST API
	// (testflight.sh's WEB_FLAGS add the client).
	clientID = "jetway"
	// targetYAML lets the target run what a stock worker does: privileged
	// steps (testflight's privileged and devices specs), unprivileged ones
	// in user namespaces (the mock type calls a container privileged when
	// its uid map is the node's) and rootfs images (mirror_self, in nearly
	// every spec), served from its holder, and NET_RAW in unprivileged
	// steps (the hermetic spec's ping), as a stock worker's have.
	targetYAML = "steps:\n  allowPrivileged: true\n  userNamespaces: true\n  netRaw: true\n  volumeHolder: {images: NodePort}\n"
	// mockRev is testflight.sh's MOCK_REV: the shipped mock type is the
	// one its recipe would build, so the script need not build it again.
	mockRev = "2"
)

type options struct {
	shared, bin, dir, out, gateway string
	suiteTimeout                   time.Duration
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("testflight: ")
	root, _ := cluster.ModuleRoot()
	var o options
	flag.StringVar(&o.shared, "shared", filepath.Join(root, "..", "shared", "concourse"), "folder of Concourse's binaries (bin/) and testflight (testflight/)")
	flag.StringVar(&o.bin, "bin", cmp.Or(os.Getenv("JETWAY_BIN_DIR"), filepath.Join(root, "bin")), "jetway's bin folder: gateway, the node's tools and images")
	// Outside any git work tree: fly execute uploads of an input inside
	// one only what git would track, and the suite's inputs are made in
	// its TMPDIR, under the state folder.
	flag.StringVar(&o.dir, "dir", filepath.Join(os.TempDir(), "jetway-testflight"), "state folder, outside any git work tree (made again on each run)")
	flag.StringVar(&o.out, "out", "", "results folder; default DIR/out")
	flag.DurationVar(&o.suiteTimeout, "suite-timeout", 100*time.Minute, "bound on the suite (ginkgo's timeout is 10 minutes less)")
	flag.Parse()
	o.out = cmp.Or(o.out, filepath.Join(o.dir, "out"))
	o.gateway = filepath.Join(o.bin, "gateway")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, o)
	stop()
	if err != nil {
		log.Print(err)
		os.Exit(cmp.Or(code, 1))
	}
	os.Exit(code)
}

// run starts everything, runs the suite and stops everything; it returns
// the suite's exit status.
func run(ctx context.Context, o options) (int, error) {
	if err := os.RemoveAll(o.dir); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return 0, err
	}
	if err := seedTestflight(o); err != nil {
		return 0, err
	}

	log.Print("starting the real node")
	sctx, cancel := context.WithTimeout(ctx, cluster.StartupTimeout)
	c, err := cluster.Start(sctx, cluster.Options{Name: "testflight", RealNode: true})
	cancel()
	if err != nil {
		return 0, fmt.Errorf("real node: %w", err)
	}
	defer func() { log.Print("stopping the real node"); c.Stop() }()
	targetsDir := filepath.Join(o.dir, "targets")
	if err := placeTarget(ctx, c, targetsDir); err != nil {
		return 0, err
	}

	secret := filepath.Join(o.dir, "client-secret")
	if err := os.WriteFile(secret, []byte(rand.Text()), 0o600); err != nil {
		return 0, err
	}
	web, err := startWebNode(ctx, o, secret)
	if err != nil {
		return 0, err
	}
	defer web.stop()

	gw, err := startGateway(ctx, o, c, targetsDir, secret, web.url)
	if err != nil {
		return 0, err
	}
	defer gw.stop()
	if err := waitWorker(ctx, o, web.url, gw); err != nil {
		return 0, err
	}

	log.Printf("running the suite (its log: %s)", filepath.Join(o.out, "suite.log"))
	start := time.Now()
	sctx, cancel = context.WithTimeout(ctx, o.suiteTimeout)
	defer cancel()
	suite := testflightCmd(sctx, o, "suite")
	suite.Env = append(suite.Env, "ATC_URL="+web.url,
		"GINKGO_TIMEOUT="+(o.suiteTimeout-10*time.Minute).String())
	suite.Stdout, suite.Stderr = os.Stdout, os.Stderr
	suite.Cancel = func() error { return suite.Process.Signal(syscall.SIGTERM) }
	suite.WaitDelay = 30 * time.Second
	err = suite.Run()
	log.Printf("suite ran %s; results: %s", time.Since(start).Round(time.Second), o.out)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, err
}

// seedTestflight copies the prebuilt suite, its sources and the mock
// type into testflight.sh's build folder with the mock's recipe version,
// which testflight.sh itself does not copy: without it the script would
// build the mock type again from a mock-resource checkout this machine
// need not have.
func seedTestflight(o options) error {
	shipped := filepath.Join(o.shared, "testflight")
	b := filepath.Join(o.dir, "tf")
	if err := os.MkdirAll(b, 0o755); err != nil {
		return err
	}
	cp := exec.Command("cp", "-a", filepath.Join(shipped, "src"), filepath.Join(shipped, "resource-types"),
		filepath.Join(shipped, "testflight.test"), b)
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("copy %s: %v: %s", shipped, err, out)
	}
	// The copy must be newer than its sources, or the script compiles
	// the suite again.
	now := time.Now()
	if err := os.Chtimes(filepath.Join(b, "testflight.test"), now, now); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b, "mock-rev"), []byte(mockRev+"\n"), 0o644)
}

// testflightCmd runs testflight.sh's cmd with the state and build
// folders under o.dir.
func testflightCmd(ctx context.Context, o options, cmd string) *exec.Cmd {
	c := exec.CommandContext(ctx, filepath.Join(o.shared, "testflight", "testflight.sh"), cmd)
	c.Env = append(os.Environ(), "W="+filepath.Join(o.dir, "w"), "B="+filepath.Join(o.dir, "tf"), "OUT="+o.out,
		"CONCOURSE_BIN_DIR="+filepath.Join(o.shared, "bin"))
	return c
}

// placeTarget makes the target's namespace, its service account with
// every permission the target's settings need and its kubeconfig in
// targetsDir, its NetworkPolicies as `gateway target add` makes them
// (the node enforces them: a hermetic step reaches nothing), and the
// state namespace.
func placeTarget(ctx context.Context, c *cluster.Cluster, targetsDir string) error {
	perms := append(slices.Clip(targets.Required), targets.ImagePermissions...)
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: target, Rules: targets.RBACRules(perms)})
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	dir := filepath.Join(targetsDir, target)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), tg.Kubeconfig, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "target.yaml"), []byte(targetYAML), 0o600); err != nil {
		return err
	}
	access := provision.Access{Target: target, Namespace: target}
	for _, p := range access.NetworkPolicies(provision.DefaultEgressDeny()) {
		if _, err := c.Client.NetworkingV1().NetworkPolicies(target).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("network policy %s: %w", p.Name, err)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: stateNamespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("state namespace: %w", err)
	}
	return nil
}

// proc is a started process in its own process group, with its log.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	url  string
}

// start starts cmd with its output in logPath.
func start(name string, cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends TERM to the process and waits for it, a minute at most
// (testflight.sh tears down its web node and PostgreSQL on TERM), then
// KILLs its group.
func (p *proc) stop() {
	log.Printf("stopping %s", p.name)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// startWebNode starts testflight.sh with WORKER=none and waits until it
// says its web node answers, with a client whose secret is in secret.
func startWebNode(ctx context.Context, o options, secret string) (*proc, error) {
	s, err := os.ReadFile(secret)
	if err != nil {
		return nil, err
	}
	cmd := testflightCmd(context.Background(), o, "run")
	cmd.Env = append(cmd.Env, "WORKER=none",
		"WEB_FLAGS=--add-client "+clientID+":"+string(s)+" --system-claim-value concourse-worker --system-claim-value "+clientID)
	logPath := filepath.Join(o.out, "testflight-web.log")
	log.Printf("starting PostgreSQL and the web node (testflight.sh, log: %s)", logPath)
	p, err := start("the web node", cmd, logPath)
	if err != nil {
		return nil, err
	}
	p.url = "http://127.0.0.1:" + cmp.Or(os.Getenv("WEB_PORT"), "18450")
	if err := awaitLine(ctx, p, "then run:", 10*time.Minute); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// awaitLine waits until p's log has a line containing s.
func awaitLine(ctx context.Context, p *proc, s string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if f, err := os.Open(p.log); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if strings.Contains(sc.Text(), s) {
					f.Close()
					return nil
				}
			}
			f.Close()
		}
		if p.exited() {
			return fmt.Errorf("%s exited:\n%s", p.name, tail(p.log, 10))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not say %q within %s:\n%s", p.name, s, within, tail(p.log, 10))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// startGateway starts bin/gateway owning the target, registering it with
// the web node at url through its REST API, offering the mock type.
func startGateway(ctx context.Context, o options, c *cluster.Cluster, targetsDir, secret, url string) (*proc, error) {
	types := filepath.Join(o.dir, "resource-types.yaml")
	mock := c.NodeImage("mock-image.tar")
	if mock == "" {
		return nil, errors.New("the real node has no mock-image.tar (run `make node-images`)")
	}
	if err := os.WriteFile(types, []byte("mock: "+mock+"\n"), 0o644); err != nil {
		return nil, err
	}
	state, err := os.ReadFile(c.AdminKubeconfig())
	if err != nil {
		return nil, err
	}
	stateKubeconfig := filepath.Join(o.dir, "state.kubeconfig")
	if err := os.WriteFile(stateKubeconfig, state, 0o600); err != nil {
		return nil, err
	}
	listen, err := cluster.FreeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.gateway, "run", "--listen", listen, "--no-auth", "--targets-dir", targetsDir,
		"--health-interval", "5s",
		// A stock worker reserves nothing for a container; with the
		// defaults' requests the node's two cores would hold 20 pods,
		// and the suite keeps more check containers than that.
		"--step-default-cpu-request", "0", "--step-default-memory-request", "0", "--step-ephemeral-storage-request", "0",
		"--state-kubeconfig", stateKubeconfig, "--state-namespace", stateNamespace,
		"--step-agent-image", c.NodeImage("step-agent-image.tar"),
		"--concourse-url", url, "--concourse-insecure", "--concourse-client-id", clientID,
		"--concourse-client-secret-file", secret, "--concourse-worker-address", "127.0.0.1",
		"--concourse-web-node-networks", "127.0.0.1/32", "--concourse-resource-types", types,
		// The stock worker it is compared with offers the mock type alone
		// (testflight.sh's resource-types), and these nodes cannot pull
		// Docker Hub's images of the bundled ones.
		"--concourse-bundled-resource-types=false")
	logPath := filepath.Join(o.out, "gateway.log")
	log.Printf("starting the gateway on %s (log: %s)", listen, logPath)
	p, err := start("the gateway", cmd, logPath)
	if err != nil {
		return nil, err
	}
	p.url = "http://" + listen
	return p, nil
}

// waitWorker waits until the gateway lists the target running and fly
// lists it as a running worker of the web node.
func waitWorker(ctx context.Context, o options, url string, gw *proc) error {
	fly := filepath.Join(o.shared, "bin", "fly")
	home := filepath.Join(o.dir, "fly-home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	flyCmd := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, fly, append([]string{"-t", "tf"}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+home)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := flyCmd("login", "-c", url, "-u", "test", "-p", "test"); err != nil {
		return fmt.Errorf("fly login: %v: %s", err, out)
	}
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		if gw.exited() {
			return fmt.Errorf("the gateway exited:\n%s", tail(gw.log, 10))
		}
		out, err := flyCmd("workers")
		if err == nil {
			for line := range strings.Lines(out) {
				if f := strings.Fields(line); len(f) > 0 && f[0] == target && strings.Contains(line, "running") {
					log.Printf("worker %s running:\n%s", target, out)
					return nil
				}
			}
		}
		last = out
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("fly workers did not list %s running within 3m:\n%s\ngateway:\n%s\n%s", target, last, tail(gw.log, 10), gatewayTargets(gw.url))
}

// gatewayTargets is the gateway's own list of targets, for an error.
func gatewayTargets(base string) string {
	resp, err := http.Get(base + "/api/v1/workers")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return string(b)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
