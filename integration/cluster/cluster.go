// Package cluster starts real, local Kubernetes control planes for tests and
// the demo: etcd, kube-apiserver, kube-scheduler and kube-controller-manager
// built from source at pinned versions (`make tools`), with the kwok
// controller standing in for kubelets. Every component listens on loopback
// only, RBAC is on, pods reach Running on fake nodes, and port-forward goes
// through the API server to a local address (kwok's PortForward objects).
package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Environment variables that steer the harness.
const (
	// EnvBinDir names the folder holding the binaries `make tools` builds.
	EnvBinDir = "JETWAY_BIN_DIR"
	// EnvWorkDir names the folder clusters keep their state in; the Makefile
	// points it at a per-run folder so it can prove nothing is left running.
	EnvWorkDir = "JETWAY_CLUSTER_DIR"
	// EnvKeep, when set to 1, keeps each cluster's folder (logs, certs,
	// etcd data) after Stop, for debugging.
	EnvKeep = "JETWAY_KEEP_CLUSTERS"
)

// Options configure one cluster.
type Options struct {
	// Name identifies the cluster in logs and node names; default "cluster".
	Name string
	// BinDir holds the binaries; default $JETWAY_BIN_DIR, else bin/ at the
	// root of this module.
	BinDir string
	// Nodes is the number of fake nodes; default 1.
	Nodes int
	// APIServerFeatureGates is passed to kube-apiserver's --feature-gates,
	// e.g. "PortForwardWebsockets=false" for a server that only speaks SPDY.
	APIServerFeatureGates string
	// RealNode gives the cluster one real node, kubelet with containerd
	// and runc, instead of kwok's fake ones (node.go); Nodes is ignored.
	// One real node runs on a machine at a time: a start waits for another
	// to stop.
	RealNode bool
}

// Cluster is a running local control plane. Stop it when done.
type Cluster struct {
	// Name is Options.Name.
	Name string
	// Server is the API server's URL, https://127.0.0.1:<port>.
	Server string
	// CAData is the PEM CA bundle that verifies Server.
	CAData []byte
	// Client and Dynamic act as cluster admin.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface

	dir    string
	probes int // kwok probe pods made, for their names
	admin  *rest.Config

	etcd, apiserver, scheduler, controllerManager, kwok *process
	node                                                *node // nil: kwok's fake nodes

	stopOnce sync.Once
}

// Start brings up a cluster and returns once its API server is ready, its
// fake nodes are Ready and pods can be created. On error nothing is left
// running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Name == "" {
		opts.Name = "cluster"
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 1
	}
	bin, err := binDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	root := os.Getenv(EnvWorkDir)
	if root != "" {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, err
		}
	}
	return retryTakenPorts(ctx, func() (*Cluster, error) {
		dir, err := os.MkdirTemp(root, "jetway-"+opts.Name+"-")
		if err != nil {
			return nil, err
		}
		// A real node's pods in user namespaces (hostUsers: false) run
		// as a high uid of the machine, which must be able to reach
		// their root filesystems under the folder.
		if opts.RealNode {
			if err := os.Chmod(dir, 0o711); err != nil {
				return nil, err
			}
		}
		c := &Cluster{Name: opts.Name, dir: dir}
		if err := c.configure(bin, opts); err != nil {
			c.Stop()
			return nil, fmt.Errorf("configure cluster %s: %w", opts.Name, err)
		}
		if err := c.boot(ctx, opts.Nodes); err != nil {
			c.Stop()
			return nil, fmt.Errorf("start cluster %s: %w", opts.Name, err)
		}
		return c, nil
	})
}

// startAttempts bounds the starts of one cluster.
const startAttempts = 3

// retryTakenPorts starts again, on new ports, a cluster one of whose
// processes found its port taken: freePorts releases the ports before the
// processes bind them, and meanwhile the kernel may hand one out as the
// source port of an outgoing connection (a busy machine makes many).
func retryTakenPorts(ctx context.Context, start func() (*Cluster, error)) (*Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := start()
		if err == nil || attempt == startAttempts || ctx.Err() != nil || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
	}
}

// configure writes certificates and kubeconfigs and lays out every process.
func (c *Cluster) configure(bin string, opts Options) error {
	p, err := newPKI(c.dir)
	if err != nil {
		return err
	}
	advertise := "127.0.0.1"
	if opts.RealNode {
		// The node's IP cannot be loopback; the API server advertises it
		// (it still listens on loopback alone).
		advertise = NodeIP
		p.serverIPs = append(p.serverIPs, net.ParseIP(NodeIP))
	}
	if _, _, err := p.issue("apiserver", "kube-apiserver", nil, true); err != nil {
		return err
	}
	adminCert, adminKey, err := p.issue("admin", "jetway-test-admin", []string{"system:masters"}, false)
	if err != nil {
		return err
	}
	if _, _, err := p.issue("kwok", "kwok-controller", []string{"system:masters"}, true); err != nil {
		return err
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	// kwokPort is the real node's kubelet healthz port when it has one.
	etcdClient, etcdPeer, apiPort, schedPort, kcmPort, kwokPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]

	c.Server = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	c.CAData = p.caPEM
	c.admin = &rest.Config{
		Host:            c.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM, CertData: adminCert, KeyData: adminKey},
		QPS:             200,
		Burst:           400,
	}
	if c.Client, err = kubernetes.NewForConfig(c.admin); err != nil {
		return err
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.admin); err != nil {
		return err
	}
	adminKubeconfig := c.AdminKubeconfig()
	if err := c.writeAdminKubeconfig(adminKubeconfig, p); err != nil {
		return err
	}
	kwokConfig, err := writeKwokConfig(bin, c.dir)
	if err != nil {
		return err
	}

	newProc := func(name string, args ...string) *process {
		return &process{name: c.Name + "/" + name, path: filepath.Join(bin, name), args: args,
			logPath: filepath.Join(c.dir, name+".log")}
	}
	loop := func(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
	c.etcd = newProc("etcd",
		"--name=etcd",
		"--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls=http://"+loop(etcdClient),
		"--advertise-client-urls=http://"+loop(etcdClient),
		"--listen-peer-urls=http://"+loop(etcdPeer),
		"--initial-advertise-peer-urls=http://"+loop(etcdPeer),
		"--initial-cluster=etcd=http://"+loop(etcdPeer),
		"--listen-metrics-urls=",
		"--unsafe-no-fsync=true", // throwaway data; fsync only slows tests
		"--log-level=warn",
	)
	c.apiserver = newProc("kube-apiserver",
		"--bind-address=127.0.0.1",
		"--advertise-address="+advertise,
		"--secure-port="+strconv.Itoa(apiPort),
		"--etcd-servers=http://"+loop(etcdClient),
		"--tls-cert-file="+p.path("apiserver.crt"),
		"--tls-private-key-file="+p.path("apiserver.key"),
		"--client-ca-file="+p.path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.path("sa.pub"),
		"--service-account-signing-key-file="+p.path("sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		// The API server reaches kwok's kubelet endpoint on the node's
		// InternalIP (loopback) and verifies it against the cluster CA.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-certificate-authority="+p.path("ca.crt"),
		"--kubelet-client-certificate="+p.path("admin.crt"),
		"--kubelet-client-key="+p.path("admin.key"),
		// A loopback advertise address cannot back the kubernetes Service.
		"--endpoint-reconciler-type=none",
		// Front-proxy settings fill the extension-apiserver-authentication
		// ConfigMap that the scheduler and controller manager authenticate with.
		"--requestheader-client-ca-file="+p.path("ca.crt"),
		"--requestheader-allowed-names=front-proxy",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+p.path("admin.crt"),
		"--proxy-client-key-file="+p.path("admin.key"),
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	audit, err := auditFlags(c.dir)
	if err != nil {
		return err
	}
	c.apiserver.args = append(c.apiserver.args, audit...)
	if opts.APIServerFeatureGates != "" {
		c.apiserver.args = append(c.apiserver.args, "--feature-gates="+opts.APIServerFeatureGates)
	}
	c.scheduler = newProc("kube-scheduler",
		"--kubeconfig="+adminKubeconfig,
		"--authentication-kubeconfig="+adminKubeconfig,
		"--authorization-kubeconfig="+adminKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(schedPort),
		"--leader-elect=false",
	)
	c.controllerManager = newProc("kube-controller-manager",
		"--kubeconfig="+adminKubeconfig,
		"--authentication-kubeconfig="+adminKubeconfig,
		"--authorization-kubeconfig="+adminKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(kcmPort),
		"--leader-elect=false",
		// node-lifecycle lifts the not-ready taint new nodes get at admission;
		// the persistent volume binder binds claims to volumes (a volume
		// holder's claim), the protection controllers let a claim or a
		// volume no pod uses go once deleted.
		"--controllers=serviceaccount-controller,serviceaccount-token-controller,namespace-controller,"+
			"garbage-collector-controller,root-ca-certificate-publisher-controller,node-lifecycle-controller,"+
			"persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller",
		"--root-ca-file="+p.path("ca.crt"),
		"--service-account-private-key-file="+p.path("sa.key"),
		"--use-service-account-credentials=false",
	)
	if opts.RealNode {
		for _, tool := range append([]string{"kubelet", "netpol"}, NodeContainerd...) {
			if _, err := os.Stat(filepath.Join(bin, tool)); err != nil {
				return fmt.Errorf("%w: %s not in %s (run `make tools`)", ErrNoTools, tool, bin)
			}
		}
		return c.configureNode(bin, p, kwokPort)
	}
	c.kwok = newProc("kwok",
		"--kubeconfig="+adminKubeconfig,
		"--config="+kwokConfig,
		"--manage-all-nodes=true",
		"--node-ip=127.0.0.1",
		"--node-name=kwok-"+c.Name,
		"--node-port="+strconv.Itoa(kwokPort),
		"--server-address="+loop(kwokPort),
		"--tls-cert-file="+p.path("kwok.crt"),
		"--tls-private-key-file="+p.path("kwok.key"),
		"--node-lease-duration-seconds=40",
		"--enable-crds="+strings.Join(kwokCRDKinds, ","),
	)
	return nil
}

func (c *Cluster) boot(ctx context.Context, nodes int) error {
	if c.node != nil {
		if err := checkNodePackages(); err != nil {
			return err
		}
	}
	if err := c.etcd.start(); err != nil {
		return err
	}
	etcdURL := argValue(c.etcd.args, "--listen-client-urls")
	if err := waitHTTP(ctx, c.etcd, etcdURL+"/health", nil); err != nil {
		return err
	}
	if err := c.StartAPIServer(ctx); err != nil {
		return err
	}
	controlPlane := []*process{c.scheduler, c.controllerManager}
	if c.kwok != nil {
		if err := c.installKwokCRDs(ctx, filepath.Dir(c.kwok.path)); err != nil {
			return err
		}
		controlPlane = append(controlPlane, c.kwok)
	}
	for _, p := range controlPlane {
		if err := p.start(); err != nil {
			return err
		}
	}
	insecure := &tls.Config{InsecureSkipVerify: true} // self-signed serving certs of the components
	for _, p := range []*process{c.scheduler, c.controllerManager} {
		url := "https://" + argValue(p.args, "--bind-address") + ":" + argValue(p.args, "--secure-port") + "/healthz"
		if err := waitHTTP(ctx, p, url, insecure); err != nil {
			return err
		}
	}
	if c.node != nil {
		if err := c.startNode(ctx); err != nil {
			return err
		}
	} else if err := c.createNodes(ctx, nodes); err != nil {
		return err
	}
	// Pods need the namespace's default service account, which the
	// controller manager creates.
	return poll(ctx, c.controllerManager, "default service account", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	})
}

// StartAPIServer (re)starts the API server on its port and waits for
// /readyz. With StopAPIServer it simulates an outage of the cluster.
//
// After an outage kwok is restarted too: its informers backed off while
// the server was away, and its PortForward watch (a CRD, served a moment
// after /readyz) was seen to stay broken for over 20 s after the server
// came back, so forwarded ports failed with "no forward found" in later
// tests. A kubelet has no such gap; a fresh kwok lists everything at once.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if err := c.apiserver.start(); err != nil {
		return err
	}
	err := poll(ctx, c.apiserver, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil || c.kwok == nil || !c.kwok.running() {
		return err // at boot, kwok starts after the CRDs are installed
	}
	c.kwok.stop(0)
	if err := c.kwok.start(); err != nil {
		return err
	}
	return c.awaitKwok(ctx)
}

// awaitKwok waits until the (re)started kwok runs pods again: a probe pod
// reaches Running. Without it a test right after an outage could find
// pods that stay Pending until kwok's informers catch up.
func (c *Cluster) awaitKwok(ctx context.Context) error {
	c.probes++
	name := fmt.Sprintf("kwok-probe-%d", c.probes)
	pods := c.Client.CoreV1().Pods("default")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "example.invalid/probe"}}}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kwok probe: %w", err)
	}
	defer func() { _ = pods.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) }()
	return poll(ctx, c.kwok, "kwok running pods again", func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
}

// StopAPIServer kills the API server at once, as a crash or a network cut
// would take it away (a graceful stop drains watches for over 10 s);
// everything else keeps running.
func (c *Cluster) StopAPIServer() { c.apiserver.stop(0) }

// AdminKubeconfig is the path of a kubeconfig with the cluster's admin
// credentials; its CA and client certificate are files beside it, as in
// many operators' kubeconfigs.
func (c *Cluster) AdminKubeconfig() string { return filepath.Join(c.dir, "admin.kubeconfig") }

// AdminConfig returns a copy of the cluster-admin client configuration.
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Stop ends every process and removes the cluster's files. It is
// idempotent.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		// A real node is drained while the API server runs, then stopped
		// and the machine put back.
		if c.node != nil {
			c.stopNode()
		}
		// The cluster is thrown away: no component needs a graceful stop,
		// and the API server's takes over 10 s.
		for _, p := range []*process{c.kwok, c.controllerManager, c.scheduler, c.apiserver, c.etcd} {
			if p != nil {
				p.stop(0)
			}
		}
		if os.Getenv(EnvKeep) != "1" {
			_ = os.RemoveAll(c.dir)
		}
	})
}

// NodeName is the real node's name ("" for kwok's nodes).
func (c *Cluster) NodeName() string {
	if c.node == nil {
		return ""
	}
	return c.node.name
}

// NodeImage is the reference of the image the real node imported from the
// bin folder's tarball (one of NodeImages), such as the step agent's.
func (c *Cluster) NodeImage(tarball string) string {
	if c.node == nil {
		return ""
	}
	return c.node.images[tarball]
}

// RegistryMirror is the URL NodeRegistry answers at on the node's bridge
// (pods reach it there), or "" without a real node.
func (c *Cluster) RegistryMirror() string {
	if c.node == nil {
		return ""
	}
	return c.node.mirror
}

// Logs returns the last lines of every component's log, for a failing test.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	procs := []*process{c.etcd, c.apiserver, c.scheduler, c.controllerManager, c.kwok}
	if c.node != nil {
		procs = append(procs, c.node.containerd, c.node.kubelet, c.node.proxy, c.node.netpol)
	}
	for _, p := range procs {
		if p != nil {
			fmt.Fprintf(&b, "--- %s\n%s\n", p.name, indent(p.logTail(lines)))
		}
	}
	return b.String()
}

func (c *Cluster) createNodes(ctx context.Context, n int) error {
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("kwok-%s-%d", c.Name, i),
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{
				"type": "kwok", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"kubernetes.io/hostname": fmt.Sprintf("kwok-%s-%d", c.Name, i),
				KubeletAnnotation:        KubeletManual, // see KubeletManualSelector
			},
		}}
		// What kwok's stage would report, plus ephemeral storage, which
		// it leaves out: the scheduler refuses a pod requesting some (as
		// a gateway's step pods do by default) on a node without it.
		node.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1k"),
			corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("1M"),
			corev1.ResourceEphemeralStorage: resource.MustParse("1Pi")}
		node.Status.Allocatable = node.Status.Capacity.DeepCopy()
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", node.Name, err)
		}
	}
	return poll(ctx, c.kwok, "nodes Ready", func(ctx context.Context) (bool, error) {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == n, nil
	})
}

func (c *Cluster) writeAdminKubeconfig(path string, p *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthority: p.path("ca.crt")}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: p.path("admin.crt"), ClientKey: p.path("admin.key")}
	cfg.Contexts["admin"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "admin"}
	cfg.CurrentContext = "admin"
	return clientcmd.WriteToFile(*cfg, path)
}

// poll calls check every 100ms until it reports done, ctx ends, or proc
// exits. A check error is remembered and reported if the wait fails.
func poll(ctx context.Context, proc *process, what string, check func(context.Context) (bool, error)) error {
	var last error
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := check(cctx)
		cancel()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if proc != nil && proc.exited() {
			return fmt.Errorf("wait for %s: %w", what, proc.exitedErr())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func waitHTTP(ctx context.Context, proc *process, url string, tlsConfig *tls.Config) error {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}, Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	return poll(ctx, proc, proc.name+" "+url, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// freePorts reserves n distinct loopback ports below the kernel's
// ephemeral range. They are released before the components bind them; a
// port of the ephemeral range could meanwhile be handed out as the
// source port of an outgoing connection (a busy machine makes many), and
// an API server restarted on its port would find it taken.
func freePorts(n int) ([]int, error) {
	low, high := portsBelow(ephemeralStart())
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no %d free loopback ports in %d-%d", n, low, high)
		}
		port := low + mrand.IntN(high-low+1)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // taken
		}
		lns = append(lns, ln)
		ports = append(ports, port)
	}
	return ports, nil
}

// FreeAddr is a loopback address no one listened on a moment ago, on a
// port below the kernel's ephemeral range: a server that stops and starts
// again on it (a restarted gateway) never finds it taken by a connection's
// source port.
func FreeAddr() (string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(ports[0]), nil
}

// ephemeralStart is the first port the kernel hands out as a source port
// (net.ipv4.ip_local_port_range), 32768 if it cannot be read.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	start, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return start
}

// portsBelow is the range the harness picks its ports from: the 12,000
// ports below start, above the well-known and common service ports.
func portsBelow(start int) (low, high int) {
	high = start - 1
	low = max(high-12000, 10000)
	return low, high
}

func argValue(args []string, flag string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// binDir finds the folder with the pinned binaries and checks they exist.
func binDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv(EnvBinDir)
	}
	if dir == "" {
		root, err := ModuleRoot()
		if err != nil {
			return "", fmt.Errorf("%w: %w; set %s", ErrNoTools, err, EnvBinDir)
		}
		dir = filepath.Join(root, "bin")
	}
	var missing []string
	for _, name := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", kwokDataDir} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%w: %s not in %s (run `make tools`)", ErrNoTools, strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

// ErrNoTools means the control-plane binaries have not been built.
var ErrNoTools = errors.New("cluster tools missing")

// ModuleRoot is the folder of jetway's go.mod above the working
// directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/jetway-ci/jetway\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no jetway go.mod above the working directory")
		}
		dir = parent
	}
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
