package concourse

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/wire"
)

// A stock Concourse v8.2.5 worker, `concourse worker --runtime containerd`,
// registered through a web node's TSA: the reference jetway is compared
// with (../shared/concourse/STOCK-WORKER.md). Its tasks run in real
// containers of Debian's containerd and runc, on Concourse's own CNI
// network; their image is a busybox folder (StockWorker.Rootfs, for
// `rootfs_uri: raw:///...`).
//
// Some of its names are fixed, not flags: containerd's socket
// StockSocket, the bridge StockBridge, the iptables chain
// CONCOURSE-OPERATOR, the cgroup garden/ in every hierarchy. So one runs
// on a machine at a time: a start waits for StockLock and records its
// folder in StockHolder, and Stop puts back what it changed (stockHost).
// It coexists with the real node (integration/cluster), whose containerd,
// bridge and cgroups are its own; but the node's teardown removes
// /run/containerd and /var/lib/cni when the node made them, so a test
// that runs both starts the stock worker after the node and stops it
// before (t.Cleanup's order does).
const (
	StockSocket = "/run/containerd/containerd.sock"
	StockBridge = "concourse0"
	// StockLock is the machine's stock worker lock, an abstract unix
	// socket, freed by the kernel when its holder dies (as the real
	// node's NodeLock).
	StockLock = "@jetway-stock-worker"
	// StockHolder names the folder of the stock worker that holds
	// StockLock, for the next start to clean up after one that died
	// without its Stop.
	StockHolder = "/run/jetway-stock-worker.holder"
	// StockTag is the tag a stock worker has unless StockOptions say.
	StockTag = "stock"
)

// EnvConcourseInit names Concourse's container init binary (its
// cmd/init/init.c built static); the Makefile builds bin/concourse-init
// from ../shared/concourse/init.c and sets it.
const EnvConcourseInit = "JETWAY_CONCOURSE_INIT"

// stockPrograms are what the stock worker runs from Debian's packages
// (the Makefile's STOCK_PACKAGES).
var stockPrograms = map[string]string{
	"/usr/bin/containerd":              "containerd",
	"/usr/bin/containerd-shim-runc-v2": "containerd",
	"/usr/bin/ctr":                     "containerd",
	"/usr/sbin/runc":                   "runc",
	"/usr/lib/cni/bridge":              "containernetworking-plugins",
	"/usr/lib/cni/host-local":          "containernetworking-plugins",
	"/usr/lib/cni/firewall":            "containernetworking-plugins",
	"/usr/lib/cni/loopback":            "containernetworking-plugins",
	"/bin/busybox":                     "busybox-static",
	"/usr/sbin/iptables":               "iptables",
	"/usr/sbin/nft":                    "nftables",
	"/usr/sbin/ip":                     "iproute2",
}

// StockOptions configure a stock worker. The zero value is one named
// "stock", tagged StockTag, with the overlay baggageclaim driver.
type StockOptions struct {
	// Name is the worker's name; default "stock".
	Name string
	// Tags are the worker's tags; default [StockTag]. Steps without its
	// tags do not run on it.
	Tags []string
	// InitBin is Concourse's container init; default $JETWAY_CONCOURSE_INIT,
	// else concourse-init in $JETWAY_BIN_DIR.
	InitBin string
	// BaggageclaimDriver is overlay (default) or naive.
	BaggageclaimDriver string
	// BaggageclaimBindIP is where its baggageclaim listens; default
	// 127.0.0.1. P2PInterface, if set, names the interface its p2p URL
	// has the address of (the web node's p2p streams into it go there):
	// the real node's bridge, with its address as BaggageclaimBindIP, lets
	// the node's pods push into the stock worker.
	BaggageclaimBindIP, P2PInterface string
}

// StockWorker is a running stock worker. Stop it when done (StockForTest
// does).
type StockWorker struct {
	// Name is the worker's name in fly workers.
	Name string
	// Rootfs is a busybox folder for its tasks: `rootfs_uri: raw://` + Rootfs.
	Rootfs string
	// Dir holds its work dir, the rootfs, its log and state.json.
	Dir string

	lock     net.Listener
	host     stockHost
	worker   *process
	stopOnce func()
}

// StartStock starts a stock worker registered through w's TSA with its
// worker key, and returns once fly lists it running. It waits for
// StockLock while another stock worker runs. On error nothing is left.
func (w *WebNode) StartStock(ctx context.Context, opts StockOptions) (*StockWorker, error) {
	if opts.Name == "" {
		opts.Name = "stock"
	}
	if opts.Tags == nil {
		opts.Tags = []string{StockTag}
	}
	if opts.BaggageclaimDriver == "" {
		opts.BaggageclaimDriver = "overlay"
	}
	init, err := stockPrerequisites(opts.InitBin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(os.Getenv(cluster.EnvWorkDir), "jetway-stock-")
	if err != nil {
		return nil, err
	}
	// The containers' users (mapped in a user namespace) reach the rootfs.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	s := &StockWorker{Name: opts.Name, Dir: dir, Rootfs: filepath.Join(dir, "rootfs")}
	s.stopOnce = sync.OnceFunc(s.stop)
	if err := s.start(ctx, w, init, opts); err != nil {
		err = fmt.Errorf("start stock worker %s: %w", opts.Name, err)
		if s.worker != nil {
			err = fmt.Errorf("%w; last lines of worker.log:\n%s", err, indent(s.worker.logTail(30)))
		}
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *StockWorker) start(ctx context.Context, w *WebNode, init string, opts StockOptions) error {
	lock, err := lockStock(ctx)
	if err != nil {
		return err
	}
	s.lock = lock
	_ = os.WriteFile(StockHolder, []byte(s.Dir), 0o600)
	if s.host, err = recordStockHost(s.Dir); err != nil {
		return err
	}
	if err := makeRootfs(ctx, s.Rootfs); err != nil {
		return err
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	args := []string{"worker", "--runtime", "containerd", "--name", opts.Name,
		"--work-dir", filepath.Join(s.Dir, "work"),
		"--tsa-host", w.TSAAddr, "--tsa-public-key", w.TSAPublicKey, "--tsa-worker-private-key", w.WorkerKey,
		"--bind-ip", "127.0.0.1", "--bind-port", strconv.Itoa(ports[0]),
		"--debug-bind-ip", "127.0.0.1", "--debug-bind-port", strconv.Itoa(ports[1]),
		"--healthcheck-bind-ip", "127.0.0.1", "--healthcheck-bind-port", strconv.Itoa(ports[2]),
		"--baggageclaim-bind-ip", cmp.Or(opts.BaggageclaimBindIP, "127.0.0.1"), "--baggageclaim-bind-port", strconv.Itoa(ports[3]),
		"--baggageclaim-debug-bind-ip", "127.0.0.1", "--baggageclaim-debug-bind-port", strconv.Itoa(ports[4]),
		"--baggageclaim-driver", opts.BaggageclaimDriver,
		"--containerd-bin", "/usr/bin/containerd", "--containerd-init-bin", init,
		"--containerd-cni-plugins-dir", "/usr/lib/cni", "--containerd-mtu", "1400",
		// Without it the worker flushes the machine's filter INPUT chain.
		"--containerd-allow-host-access",
	}
	for _, t := range opts.Tags {
		args = append(args, "--tag", t)
	}
	if opts.P2PInterface != "" {
		args = append(args, "--baggageclaim-p2p-interface-name-pattern", "^"+regexp.QuoteMeta(opts.P2PInterface)+"$",
			"--baggageclaim-p2p-interface-family", "4")
	}
	// Debian's containerd 1.6 finds its own shim in PATH, not the real
	// node's containerd 2.x in the bin folder.
	env := append(webEnv(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if s.worker, err = startProcess("concourse worker", filepath.Join(s.Dir, "worker.log"), w.concourseBin, args, env, nil); err != nil {
		return err
	}
	return s.waitRunning(ctx, w)
}

// waitRunning returns once fly lists the worker running.
func (s *StockWorker) waitRunning(ctx context.Context, w *WebNode) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := w.FlyContext(ctx, "workers", "--json")
		var workers []wire.Worker
		if err == nil && json.Unmarshal([]byte(out), &workers) == nil &&
			slices.ContainsFunc(workers, func(wk wire.Worker) bool { return wk.Name == s.Name && wk.State == "running" }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for worker %s running in fly workers: %w", s.Name, ctx.Err())
		case <-s.worker.done:
			return errors.New("concourse worker exited")
		case <-tick.C:
		}
	}
}

// Stop stops the worker and puts back what it changed on the machine
// (stockHost.restore), then frees StockLock and removes its folder unless
// $JETWAY_KEEP_CLUSTERS is 1. It is idempotent.
func (s *StockWorker) Stop() { s.stopOnce() }

func (s *StockWorker) stop() {
	if s.worker != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		stopStockContainers(ctx)
		cancel()
		s.worker.stop(syscall.SIGTERM, 10*time.Second)
	}
	if s.lock == nil {
		_ = os.RemoveAll(s.Dir)
		return
	}
	s.host.restore()
	_ = os.WriteFile(StockHolder, nil, 0o600)
	s.lock.Close()
	if os.Getenv(cluster.EnvKeep) != "1" {
		_ = os.RemoveAll(s.Dir)
	}
}

// Logs returns the last n lines of the worker's log.
func (s *StockWorker) Logs(n int) string {
	return "worker.log:\n" + indent(tail(filepath.Join(s.Dir, "worker.log"), n))
}

// lockStock takes StockLock, waiting while another stock worker runs,
// and cleans up after a holder that died without its Stop.
func lockStock(ctx context.Context) (net.Listener, error) {
	return cluster.LockMachine(ctx, StockLock, StockHolder, "another stock worker", func(prev string) {
		if h, err := loadStockHost(prev); err == nil {
			stopStockContainers(ctx)
			h.restore()
		}
	})
}

// stockPrerequisites names everything missing at once, and returns the
// init binary's path.
func stockPrerequisites(init string) (string, error) {
	var problems []error
	if missing := cluster.MissingPackages(stockPrograms); len(missing) > 0 {
		problems = append(problems, fmt.Errorf("%w: the stock worker needs Debian's %s (make tools installs them)", ErrMissing, strings.Join(missing, ", ")))
	}
	if init == "" {
		init = os.Getenv(EnvConcourseInit)
	}
	if init == "" {
		init = filepath.Join(os.Getenv(cluster.EnvBinDir), "concourse-init")
	}
	if _, err := os.Stat(init); err != nil {
		problems = append(problems, fmt.Errorf("%w: Concourse's container init is not at %s: `make tools` builds bin/concourse-init, or set %s", ErrMissing, init, EnvConcourseInit))
	}
	if os.Geteuid() != 0 {
		problems = append(problems, errors.New("the stock worker needs root: it makes a bridge, cgroups and mounts"))
	}
	return init, errors.Join(problems...)
}

// makeRootfs writes a busybox folder a container can run in unprivileged:
// busybox and a link per applet, the files and the mount points
// (../shared/concourse/STOCK-WORKER.md: in a user namespace a container
// cannot make them in a root-owned rootfs).
func makeRootfs(ctx context.Context, dir string) error {
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "scratch", "root", "tmp", "usr/bin", "usr/sbin", "sbin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), bb, 0o755); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "/bin/busybox", "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	for applet := range strings.FieldsSeq(string(out)) {
		if applet == "bin/busybox" {
			continue
		}
		if err := os.Symlink("/bin/busybox", filepath.Join(dir, applet)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":  "", "etc/hostname": "", "etc/resolv.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
