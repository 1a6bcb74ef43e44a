package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// A real node: kubelet, containerd 2.x with its runc shim, and runc 1.2
// or later (built from their pinned modules, `make tools`), with the
// bridge CNI plugin from Debian's packages, so that pods run real
// containers, in user namespaces too (hostUsers: false); containerd
// 2.1 or later mounts image volumes (a step pod's agent). ../shared/REAL-NODE.md and
// docs/testing.md say what this kind of machine needs; in short:
//
//   - the node's IP is NodeIP on a bridge of its own (NodeBridge), which
//     the CNI bridge plugin puts the pods on (host-local IPAM on
//     NodeSubnet, no masquerade); kubelet listens there, the API server
//     advertises it;
//   - kube-proxy runs as on a managed cluster's node, in iptables mode,
//     with NodePorts answered on loopback too (it sets route_localnet),
//     so a Service's node port answers at 127.0.0.1 where containerd
//     pulls a volume holder's images; it changes no conntrack sysctl and
//     listens for no health or metrics; teardown runs its --cleanup and
//     removes what that leaves (KUBE-FIREWALL, the tables iptables made);
//   - NetworkPolicies are enforced, as by a managed cluster's network
//     plugin: bin/netpol (tools/netpol, the SIG's kube-network-policies)
//     runs as a process of the node's, with a table of its own
//     (NodePolicyTable) that it deletes as it stops, and teardown if it
//     was killed; pods no policy selects are left alone;
//   - containerd has its root, state, socket and runc root under the
//     node's folder, restrict_oom_score_adj (the machine lacks
//     CAP_SYS_RESOURCE) and the pause image as its sandbox image;
//   - kubelet runs on cgroup v1 (failCgroupV1: false) with the cgroupfs
//     driver under NodeCgroupRoot, no swap check, no iptables chains;
//   - no registry is reachable: the images in the bin folder (NodeImages)
//     are imported into containerd before kubelet starts.
//
// There is one node per machine at a time (port 10250, the sysctls kubelet
// changes, the bridge and the cgroup root are the machine's): a start
// waits for NodeLock and records its folder in NodeHolder. Teardown puts
// back everything the node changed: see node.stop.
const (
	NodeIP         = "10.244.77.1"
	NodeSubnet     = "10.244.77.0/24"
	NodeBridge     = "jetway0"
	NodeCgroupRoot = "/jetway-node"
	// NodeLock is the machine's node lock: an abstract unix socket. It
	// belongs to the network namespace, as the bridge and NodeIP do, so a
	// run in a container with a /run of its own still sees it, and the
	// kernel frees it when its holder dies.
	NodeLock = "@jetway-node"
	// NodeHolder names the folder of the node that holds NodeLock, for the
	// next start to tear down after a holder that died without its
	// teardown.
	NodeHolder = "/run/jetway-node.holder"

	// BusyboxImage is the base image for tasks on the real node: Debian's
	// busybox-static with a link for each command, run as root.
	BusyboxImage = "jetway.test/busybox:1"
	// PauseImage is containerd's sandbox image (integration/cmd/pause).
	PauseImage = "jetway.test/pause:1"

	// NodeRegistry is the registry host the node pulls from besides the
	// images it holds: the harness serves it on the node's bridge
	// (registry.go). It serves the node's own images under their names
	// without the host (NodeRegistry/busybox:1, or by digest), so a pod
	// can name an image by its digest. Every other manifest under it is
	// unknown (a pull that cannot succeed: ErrImagePull, "not found"), but
	// those under NodeRegistry/busy/, which answer 429 Too Many Requests
	// (a pull that may succeed later). Under NodeRegistry/private/ it
	// serves the same images again, only to a pull with PrivateUser and
	// PrivatePassword (an imagePullSecrets Secret keyed by NodeRegistry;
	// containerd sends a pull's credentials to the hosts.toml server too,
	// as kubelet names no server address with them).
	NodeRegistry = "registry.jetway.test"
)

// NodeImages are the image tarballs in the bin folder imported into the
// node's containerd: `make image` and `make node-images` write them.
var NodeImages = []string{"step-agent-image.tar", "busybox-image.tar", "pause-image.tar", "registry-image-image.tar", "mock-image.tar"}

// NodeContainerd are containerd's programs in the bin folder, built from
// tools/containerd's and tools/runc's pinned modules (`make tools`).
// containerd finds its shim in its PATH, which the node puts the bin
// folder first in; the shim runs the runc its configuration names.
var NodeContainerd = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"}

// nodePackages are the programs the node runs from Debian's packages.
var nodePackages = map[string]string{
	"/usr/lib/cni/bridge":     "containernetworking-plugins",
	"/usr/lib/cni/host-local": "containernetworking-plugins",
	"/usr/lib/cni/loopback":   "containernetworking-plugins",
	"/usr/sbin/ip":            "iproute2",
	"/usr/sbin/iptables":      "iptables", // kube-proxy's
	"/usr/sbin/nft":           "nftables", // teardown's, for the tables iptables made
}

// nodeSysctls are the machine-wide settings kubelet and the bridge plugin
// change; teardown writes back what they were.
var nodeSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet"} // kube-proxy's, for NodePorts on loopback

// nodeHostPaths are paths outside the node's folder that kubelet,
// containerd or the CNI plugins make; teardown removes those that did not
// exist before.
var nodeHostPaths = []string{"/var/lib/kubelet", "/var/lib/cni", "/var/log/containers", "/run/mount", "/run/containerd"}

// nodeState is what teardown needs to put the machine back, written to
// the node's folder so that a later start can clean up after a test
// process that was killed.
type nodeState struct {
	Dir      string            `json:"dir"`
	Sysctls  map[string]string `json:"sysctls"`
	NewPaths []string          `json:"newPaths"` // nodeHostPaths that did not exist
	// KubeProxy is the kube-proxy that ran, whose --cleanup removes its
	// rules and chains.
	KubeProxy string `json:"kubeProxy,omitempty"`
	// Tables are the nftables tables there were before it ran ("ip
	// nat"): teardown deletes those iptables made for it, once empty.
	Tables []string `json:"tables,omitempty"`
}

// node is the real node of a cluster started with Options.RealNode.
type node struct {
	name, dir string
	images    map[string]string // tarball -> image reference
	lock      net.Listener      // NodeLock
	state     nodeState
	registry  *http.Server // NodeRegistry, nil until the bridge is up
	mirror    string       // NodeRegistry's URL on the bridge

	containerd, kubelet, proxy, netpol *process
	ctrPath                            string // bin/ctr
}

func (n *node) path(elem ...string) string { return filepath.Join(append([]string{n.dir}, elem...)...) }
func (n *node) socket() string             { return n.path("c.sock") }

// checkNodePackages names the missing programs and their packages.
func checkNodePackages() error {
	if missing := MissingPackages(nodePackages); len(missing) > 0 {
		return fmt.Errorf("%w: the real node needs Debian's %s (make tools installs them)", ErrNoTools, strings.Join(missing, ", "))
	}
	if os.Geteuid() != 0 {
		return errors.New("the real node needs root: it makes a bridge, cgroups and mounts")
	}
	return nil
}

// lockNode takes the machine's node lock, waiting while another node
// runs, and cleans up after a holder that died without its teardown.
func lockNode(ctx context.Context) (net.Listener, error) {
	return LockMachine(ctx, NodeLock, NodeHolder, "another real node", func(prev string) {
		var st nodeState
		if b, err := os.ReadFile(filepath.Join(prev, "state.json")); err == nil && json.Unmarshal(b, &st) == nil {
			(&node{dir: st.Dir, state: st}).teardown()
		}
	})
}

// LockMachine takes the machine-wide lock, an abstract unix socket
// (written "@name"), waiting while another process holds it. It belongs
// to the network namespace, so a run in a container with a /run of its
// own still sees it, and the kernel frees it when its holder dies. holder
// is the file the lock's holder records its folder in: when it names one,
// the last holder died without its clean-up, and recover gets that
// folder before LockMachine returns. who names the holder in the error
// when ctx ends first.
func LockMachine(ctx context.Context, lock, holder, who string, recover func(prev string)) (net.Listener, error) {
	for {
		l, err := net.Listen("unix", lock)
		if err == nil {
			if prev, _ := os.ReadFile(holder); len(bytes.TrimSpace(prev)) > 0 {
				recover(string(bytes.TrimSpace(prev)))
			}
			return l, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("lock %s: %w", lock, err)
		}
		select {
		case <-ctx.Done():
			prev, _ := os.ReadFile(holder)
			return nil, fmt.Errorf("%s runs on this machine (its folder: %s): %w", who, strings.TrimSpace(string(prev)), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writeLockHolder records the node's folder in NodeHolder, or clears it.
func writeLockHolder(dir string) {
	_ = os.WriteFile(NodeHolder, []byte(dir), 0o600)
}

// configureNode issues the node's certificates and writes its
// containerd, CNI and kubelet configuration.
func (c *Cluster) configureNode(bin string, p *pki, healthzPort int) error {
	n := &node{name: "node-" + c.Name, dir: filepath.Join(c.dir, "node"), images: map[string]string{}}
	c.node = n
	for _, d := range []string{"cni", "kubelet", "logs", "containerd"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	for _, tarball := range NodeImages {
		ref, err := imageRef(filepath.Join(bin, tarball))
		if err != nil {
			return fmt.Errorf("%w: %v (run `make image node-images`)", ErrNoTools, err)
		}
		n.images[tarball] = ref
	}
	if _, _, err := p.issue("kubelet-client", "system:node:"+n.name, []string{"system:nodes"}, false); err != nil {
		return err
	}
	if _, _, err := p.issue("kubelet-serving", n.name, nil, true); err != nil {
		return err
	}
	// kube-proxy as the user the API server's bootstrap policy binds to
	// system:node-proxier.
	if _, _, err := p.issue("kube-proxy", "system:kube-proxy", nil, false); err != nil {
		return err
	}
	// The policy enforcer reads every namespace's pods, namespaces and
	// policies.
	if _, _, err := p.issue("netpol", "jetway:netpol", []string{"system:masters"}, false); err != nil {
		return err
	}
	for file, client := range map[string]string{"kubelet.kubeconfig": "kubelet-client", "kube-proxy.kubeconfig": "kube-proxy",
		"netpol.kubeconfig": "netpol"} {
		kubeconfig := clientcmdapi.NewConfig()
		kubeconfig.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthority: p.path("ca.crt")}
		kubeconfig.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificate: p.path(client + ".crt"), ClientKey: p.path(client + ".key")}
		kubeconfig.Contexts["node"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "node"}
		kubeconfig.CurrentContext = "node"
		if err := clientcmd.WriteToFile(*kubeconfig, n.path(file)); err != nil {
			return err
		}
	}
	// Version 2 of the config, which containerd 2.x migrates as it loads
	// it; no imports of the machine's /etc/containerd, no NRI (its socket
	// is the machine's).
	containerdConfig := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]
[grpc]
  address = %[3]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[6]q
        BinaryName = %[9]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[8]q
`, n.path("containerd", "root"), n.path("containerd", "state"), n.socket(), n.path("containerd", "opt"),
		PauseImage, n.path("containerd", "runc"), n.path("cni"), n.path("registries"), filepath.Join(bin, "runc"))
	if err := os.WriteFile(n.path("containerd.toml"), []byte(containerdConfig), 0o600); err != nil {
		return err
	}
	cni, err := json.MarshalIndent(map[string]any{
		"cniVersion": "0.4.0",
		"name":       "jetway-node",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": NodeBridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  []any{[]any{map[string]any{"subnet": NodeSubnet, "rangeStart": "10.244.77.10", "gateway": NodeIP}}},
				"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}}, // as on any node; nodeGuard keeps it on the machine
				"dataDir": n.path("cni-ipam"),
			},
		}},
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("cni", "10-jetway.conflist"), cni, 0o600); err != nil {
		return err
	}
	kubeletConfig, err := yaml.Marshal(map[string]any{
		"apiVersion":         "kubelet.config.k8s.io/v1beta1",
		"kind":               "KubeletConfiguration",
		"address":            NodeIP,
		"port":               10250,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        healthzPort,
		"tlsCertFile":        p.path("kubelet-serving.crt"),
		"tlsPrivateKeyFile":  p.path("kubelet-serving.key"),
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": p.path("ca.crt")},
		},
		"authorization":            map[string]any{"mode": "AlwaysAllow"},
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               NodeCgroupRoot,
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + n.socket(),
		"imageServiceEndpoint":     "unix://" + n.socket(),
		"makeIPTablesUtilChains":   false,
		"resolvConf":               "/etc/resolv.conf",
		"podLogsDir":               n.path("logs"),
		"evictionHard": map[string]any{
			"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%",
		},
		"imageGCHighThresholdPercent":   100,
		"imageGCLowThresholdPercent":    99,
		"serializeImagePulls":           false,
		"syncFrequency":                 "10s",
		"nodeStatusUpdateFrequency":     "4s",
		"enableServer":                  true,
		"registerNode":                  true,
		"maxPods":                       110,
		"shutdownGracePeriod":           "0s",
		"localStorageCapacityIsolation": true,
	})
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("kubelet.yaml"), kubeletConfig, 0o600); err != nil {
		return err
	}
	n.containerd = &process{name: c.Name + "/containerd", path: filepath.Join(bin, "containerd"),
		args: []string{"--config", n.path("containerd.toml")}, logPath: filepath.Join(c.dir, "containerd.log"),
		env: []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}}
	n.ctrPath = filepath.Join(bin, "ctr")
	n.kubelet = &process{name: c.Name + "/kubelet", path: filepath.Join(bin, "kubelet"), logPath: filepath.Join(c.dir, "kubelet.log"),
		args: []string{
			"--config=" + n.path("kubelet.yaml"),
			"--kubeconfig=" + n.path("kubelet.kubeconfig"),
			"--root-dir=" + n.path("kubelet"),
			"--cert-dir=" + n.path("kubelet", "pki"),
			"--node-ip=" + NodeIP,
			"--hostname-override=" + n.name,
			"--v=" + kubeletVerbosity(),
		}}
	n.proxy = &process{name: c.Name + "/kube-proxy", path: filepath.Join(bin, "kube-proxy"), logPath: filepath.Join(c.dir, "kube-proxy.log"),
		args: kubeProxyArgs(n.path("kube-proxy.kubeconfig"), n.name)}
	n.netpol = &process{name: c.Name + "/netpol", path: filepath.Join(bin, "netpol"), logPath: filepath.Join(c.dir, "netpol.log"),
		args: []string{"--kubeconfig=" + n.path("netpol.kubeconfig"), "--node=" + n.name, "--table=" + NodePolicyTable,
			"--queue=" + strconv.Itoa(nodePolicyQueue)}}
	return nil
}

// NodePolicyTable is the nftables table (inet family) through which the
// node enforces NetworkPolicies: tools/netpol, kube-network-policies run
// as a process of the node's, queues there the packets from and to the
// node's pods that policies select, and decides each connection's first
// packet (nfqueue nodePolicyQueue). Pods no policy selects are left alone.
const (
	NodePolicyTable = "jetway-netpol"
	nodePolicyQueue = 177
)

// kubeProxyArgs run kube-proxy as a managed cluster's node does (iptables
// mode, NodePorts answered on loopback too), changing nothing of the
// machine's but its rules, its chains and route_localnet (nodeSysctls):
// no conntrack sysctl, no health or metrics listener.
func kubeProxyArgs(kubeconfig, node string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--proxy-mode=iptables",
		"--hostname-override=" + node,
		"--cluster-cidr=" + NodeSubnet,
		"--iptables-localhost-nodeports=true",
		"--healthz-bind-address=",
		"--metrics-bind-address=",
		"--conntrack-max-per-core=0",
		"--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0s",
		"--conntrack-tcp-timeout-close-wait=0s",
		"--v=1",
	}
}

// KubeletVerbosityEnv sets the real node's kubelet log level (its --v;
// default 1): at 4 kubelet logs each container's start and each PLEG
// event, which is how a step pod's start is timed (docs/testing.md).
const KubeletVerbosityEnv = "JETWAY_KUBELET_V"

func kubeletVerbosity() string {
	if v, err := strconv.Atoi(os.Getenv(KubeletVerbosityEnv)); err == nil && v >= 0 {
		return strconv.Itoa(v)
	}
	return "1"
}

// startNode brings up the node once the control plane runs: it prepares
// the machine, starts containerd, imports the images and starts kubelet,
// and waits until the node is Ready.
func (c *Cluster) startNode(ctx context.Context) error {
	n := c.node
	lock, err := lockNode(ctx)
	if err != nil {
		return err
	}
	n.lock = lock
	writeLockHolder(n.dir)
	n.state = nodeState{Dir: n.dir, Sysctls: map[string]string{}}
	for _, s := range nodeSysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return fmt.Errorf("read sysctl %s: %w", s, err)
		}
		n.state.Sysctls[s] = strings.TrimSpace(string(b))
	}
	for _, p := range nodeHostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			n.state.NewPaths = append(n.state.NewPaths, p)
		}
	}
	if err := n.writeState(); err != nil {
		return err
	}
	if err := makeBridge(); err != nil {
		return err
	}
	if err := makeCgroups(); err != nil {
		return err
	}
	if err := n.serveRegistry(); err != nil {
		return err
	}
	if err := n.containerd.start(); err != nil {
		return err
	}
	if err := poll(ctx, n.containerd, "containerd", func(ctx context.Context) (bool, error) {
		_, err := n.ctr(ctx, "version")
		return err == nil, err
	}); err != nil {
		return err
	}
	for tarball := range n.images {
		if _, err := n.ctr(ctx, "images", "import",
			filepath.Join(filepath.Dir(n.kubelet.path), tarball)); err != nil {
			return fmt.Errorf("import %s: %w", tarball, err)
		}
	}
	if err := n.kubelet.start(); err != nil {
		return err
	}
	n.state.KubeProxy, n.state.Tables = n.proxy.path, nftTables()
	if err := n.writeState(); err != nil {
		return err
	}
	if err := n.proxy.start(); err != nil {
		return err
	}
	if err := n.netpol.start(); err != nil {
		return err
	}
	return poll(ctx, n.kubelet, "node "+n.name+" Ready", func(ctx context.Context) (bool, error) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return false, ignoreNotFound(err)
		}
		for _, t := range node.Spec.Taints {
			if t.Key == "node.kubernetes.io/not-ready" {
				return false, nil
			}
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// writeState records what teardown needs, for a later start to tear
// down after a test process that was killed.
func (n *node) writeState() error {
	st, err := json.Marshal(n.state)
	if err != nil {
		return err
	}
	return os.WriteFile(n.path("state.json"), st, 0o600)
}

// serveRegistry serves NodeRegistry on the node's bridge and points
// containerd at it (a hosts.toml whose server is it alone, so a pull never
// falls back to the registry's own name, which resolves nowhere).
func (n *node) serveRegistry() error {
	images, err := loadRegistry(filepath.Dir(n.kubelet.path), slices.Sorted(maps.Keys(n.images)))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", NodeIP+":0")
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	hosts := n.path("registries", NodeRegistry)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		ln.Close()
		return err
	}
	n.mirror = "http://" + ln.Addr().String()
	// containerd 1.6 refuses a hosts.toml without a host table.
	toml := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", n.mirror, n.mirror)
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(toml), 0o644); err != nil {
		ln.Close()
		return err
	}
	n.registry = &http.Server{Handler: images, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = n.registry.Serve(ln) }()
	return nil
}

// ctr runs containerd's client against the node's containerd, in the
// namespace the CRI plugin uses.
func (n *node) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.ctrPath, append([]string{"--address", n.socket(), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

func makeBridge() error {
	_ = exec.Command("ip", "link", "del", NodeBridge).Run() // left by a killed run
	for _, args := range [][]string{
		{"link", "add", "name", NodeBridge, "type", "bridge"},
		{"addr", "add", NodeIP + "/24", "dev", NodeBridge},
		{"link", "set", NodeBridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	_ = exec.Command("nft", "delete", "table", "inet", NodeGuardTable).Run() // left by a killed run
	guard := exec.Command("nft", "-f", "-")
	guard.Stdin = strings.NewReader(nodeGuard)
	if out, err := guard.CombinedOutput(); err != nil {
		return fmt.Errorf("nft table inet %s: %w: %s", NodeGuardTable, err, bytes.TrimSpace(out))
	}
	return nil
}

// NodeGuardTable keeps the pods' packets on the machine: the pods have a
// default route through the bridge, as on any node (a hermetic task's
// ping is sent, and dropped by the node's policies, as on a stock
// worker), but no test may send beyond the machine, so the node drops a
// pod's packet bound for any other interface than the bridge (the node's
// own address, also in the pods' subnet, talks to itself over lo). Its chain
// runs after the policy enforcer's (NodePolicyTable, priority srcnat-5),
// so a packet a policy drops is the policy's.
const NodeGuardTable = "jetway-node-guard"

var nodeGuard = fmt.Sprintf(`table inet %s {
	chain beyond {
		type filter hook postrouting priority 200; policy accept;
		ip saddr %s ip saddr != %s oifname != %q drop
	}
}
`, NodeGuardTable, NodeSubnet, NodeIP, NodeBridge)

// cgroupHierarchies are the cgroup v1 hierarchies mounted under
// /sys/fs/cgroup (and the v2 one a hybrid machine has), each a folder
// kubelet makes NodeCgroupRoot in.
func cgroupHierarchies() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var dirs []string
	for _, m := range mounts(b) {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			dirs = append(dirs, m.point)
		}
	}
	return dirs
}

// makeCgroups makes NodeCgroupRoot in every v1 hierarchy: kubelet
// expects its cgroup root to exist.
func makeCgroups() error {
	for _, h := range cgroupHierarchies() {
		if strings.HasSuffix(h, "/unified") {
			continue
		}
		if err := os.MkdirAll(filepath.Join(h, NodeCgroupRoot), 0o755); err != nil {
			return fmt.Errorf("make cgroup %s: %w", filepath.Join(h, NodeCgroupRoot), err)
		}
	}
	return nil
}

type mount struct{ point, fstype string }

// mounts parses /proc/self/mountinfo: each line's mount point (field 5,
// octal-escaped) and filesystem type (the first field after " - ").
func mounts(info []byte) []mount {
	var ms []mount
	for line := range strings.SplitSeq(string(info), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 {
			continue
		}
		typ, _, _ := strings.Cut(post, " ")
		ms = append(ms, mount{point: unescapeOctal(f[4]), fstype: typ})
	}
	return ms
}

func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// drain deletes every pod while kubelet runs, so that kubelet and the CNI
// plugin undo what they made for them, and waits until containerd runs no
// task.
func (c *Cluster) drainNode(ctx context.Context) {
	n := c.node
	nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err == nil {
		zero := int64(0)
		for _, ns := range nss.Items {
			_ = c.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		}
	}
	_ = poll(ctx, n.kubelet, "node drained", func(ctx context.Context) (bool, error) {
		out, err := n.ctr(ctx, "tasks", "ls", "-q")
		return err == nil && strings.TrimSpace(out) == "", err
	})
}

// stop drains the node, stops kubelet and containerd and puts the machine
// back (teardown).
func (c *Cluster) stopNode() {
	n := c.node
	// A node whose configuration failed has no processes yet: what it
	// took (the lock) still goes back.
	if n.kubelet != nil && n.kubelet.running() && !n.kubelet.exited() && c.apiserver.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.drainNode(ctx)
		cancel()
	}
	if n.kubelet != nil {
		n.kubelet.stop(5 * time.Second)
	}
	if n.netpol != nil {
		n.netpol.stop(10 * time.Second) // it deletes its table as it goes
	}
	if n.proxy != nil {
		n.proxy.stop(5 * time.Second)
	}
	if n.containerd != nil && n.containerd.running() && !n.containerd.exited() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if out, err := n.ctr(ctx, "tasks", "ls", "-q"); err == nil {
			for id := range strings.FieldsSeq(out) {
				_, _ = n.ctr(ctx, "tasks", "kill", "--all", "--signal", "SIGKILL", id)
				_, _ = n.ctr(ctx, "tasks", "delete", "--force", id)
			}
		}
		cancel()
	}
	if n.containerd != nil {
		n.containerd.stop(5 * time.Second)
	}
	if n.registry != nil {
		n.registry.Close()
	}
	if n.state.Dir != "" {
		n.teardown()
	}
	if n.lock != nil {
		writeLockHolder("")
		n.lock.Close()
	}
}

// teardown puts back what the node changed on the machine, whatever is
// left of it: it kills the shims and every process in the node's
// cgroups, unmounts everything under its folder (deepest first), deletes
// the pods' veths and the bridge, removes the cgroups, writes back the
// sysctls and removes the host paths that were not there before.
func (n *node) teardown() {
	killProcesses(func(pid int, cmdline string) bool {
		return (strings.Contains(cmdline, "containerd-shim") || strings.Contains(cmdline, "kube-proxy") || strings.Contains(cmdline, "netpol")) &&
			strings.Contains(cmdline, n.dir)
	})
	_ = exec.Command("nft", "delete", "table", "inet", NodePolicyTable).Run() // the enforcer's, if it was killed
	if n.state.KubeProxy != "" {
		// Its rules and chains (KUBE-*), in every table and both backends.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = exec.CommandContext(ctx, n.state.KubeProxy, "--cleanup", "--v=0").Run()
		cancel()
		removeKubeProxyLeftovers(n.state.Tables)
	}
	KillCgroup(NodeCgroupRoot)
	unmountUnder(n.dir)
	deleteBridge()
	removeCgroups(NodeCgroupRoot)
	for s, v := range n.state.Sysctls {
		_ = os.WriteFile("/proc/sys/"+s, []byte(v), 0o644)
	}
	for _, p := range n.state.NewPaths {
		unmountUnder(p)
		_ = os.RemoveAll(p)
	}
	_ = os.Remove(filepath.Join(n.dir, "state.json"))
}

// nftTables lists the machine's nftables tables, as "family name".
func nftTables() []string {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return nil
	}
	var tables []string
	for line := range strings.Lines(string(out)) {
		if t, ok := strings.CutPrefix(strings.TrimSpace(line), "table "); ok {
			tables = append(tables, t)
		}
	}
	return tables
}

// removeKubeProxyLeftovers removes what kube-proxy --cleanup leaves: the
// KUBE-FIREWALL chain it made for NodePorts on loopback, and the tables
// iptables made for it (those not in before) once they hold no rule.
func removeKubeProxyLeftovers(before []string) {
	// Every jump to a KUBE-* chain, then the chains: --cleanup leaves
	// them where its own rules were made again in a table deleted under
	// it (the stock worker's teardown deletes ip nat), and KUBE-FIREWALL
	// always.
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"nat", "filter", "mangle"} {
			out, err := exec.Command(ipt+"-save", "-t", table).Output()
			if err != nil {
				continue
			}
			var chains []string
			for line := range strings.Lines(string(out)) {
				line = strings.TrimSpace(line)
				if rule, ok := strings.CutPrefix(line, "-A "); ok && strings.Contains(rule, "-j KUBE-") && !strings.HasPrefix(rule, "KUBE-") {
					// Through sh, which reads the rule's quoted comment as
					// iptables-save wrote it.
					_ = exec.Command("sh", "-c", ipt+" -t "+table+" -D "+rule).Run()
				}
				if c, ok := strings.CutPrefix(line, ":KUBE-"); ok {
					chains = append(chains, "KUBE-"+strings.Fields(c)[0])
				}
			}
			for _, c := range chains {
				_ = exec.Command(ipt, "-t", table, "-F", c).Run()
			}
			for _, c := range chains {
				_ = exec.Command(ipt, "-t", table, "-X", c).Run()
			}
		}
	}
	for _, t := range nftTables() {
		family, name, _ := strings.Cut(t, " ")
		if slices.Contains(before, t) || (family != "ip" && family != "ip6") {
			continue
		}
		save := map[string]string{"ip": "iptables-save", "ip6": "ip6tables-save"}[family]
		out, err := exec.Command(save, "-t", name).Output()
		if err == nil && !strings.Contains(string(out), "\n-A ") {
			_ = exec.Command("nft", "delete", "table", family, name).Run()
		}
	}
}

// killProcesses SIGKILLs every process whose command line matches.
func killProcesses(match func(pid int, cmdline string) bool) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if match(pid, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// killCgroupProcesses SIGKILLs every process in the cgroup root and
// below, in every hierarchy, and returns how many it found.
func killCgroupProcesses(root string) int {
	found := 0
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					found++
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
	return found
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	for range 5 {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return
		}
		var points []string
		for _, m := range mounts(b) {
			if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
				points = append(points, m.point)
			}
		}
		if len(points) == 0 {
			return
		}
		slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, p := range points {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
}

// deleteBridge deletes the veths on the node's bridge (a pod whose
// sandbox was not torn down by its CNI plugin leaves one) and the bridge.
func deleteBridge() {
	out, _ := exec.Command("ip", "-o", "link", "show", "master", NodeBridge).Output()
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		_ = exec.Command("ip", "link", "del", name).Run()
	}
	_ = exec.Command("ip", "link", "del", NodeBridge).Run()
	_ = exec.Command("nft", "delete", "table", "inet", NodeGuardTable).Run()
}

// removeCgroups removes the cgroup root and every cgroup below it, in
// every hierarchy, deepest first.
func removeCgroups(root string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			for range 20 {
				if err := unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// imageRef reads the reference a `docker save`-style tarball names.
func imageRef(tarball string) (string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return "", err
	}
	defer f.Close()
	manifest, err := tarFile(f, "manifest.json")
	if err != nil {
		return "", fmt.Errorf("%s: %w", tarball, err)
	}
	var m []struct{ RepoTags []string }
	if err := json.Unmarshal(manifest, &m); err != nil || len(m) == 0 || len(m[0].RepoTags) == 0 {
		return "", fmt.Errorf("%s: manifest.json names no image (%v)", tarball, err)
	}
	return m[0].RepoTags[0], nil
}

// tarFile reads the file name from a tar stream.
func tarFile(r io.Reader, name string) ([]byte, error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("no %s", name)
		}
		if err != nil {
			return nil, err
		}
		if hdr.Name == name {
			return io.ReadAll(io.LimitReader(tr, 1<<20))
		}
	}
}

// ContainerProcess reads /proc/<pid>/<file> of the first process of a
// container of a pod on the real node, as the node's host sees it: what
// is in effect for a container that has no shell to print it (the step
// agent's).
func (c *Cluster) ContainerProcess(ctx context.Context, namespace, pod, container, file string) (string, error) {
	id, err := c.containerID(ctx, namespace, pod, container)
	if err != nil {
		return "", err
	}
	out, err := c.node.ctr(ctx, "tasks", "ls")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			b, err := os.ReadFile(filepath.Join("/proc", f[1], file))
			return string(b), err
		}
	}
	return "", fmt.Errorf("container %s of %s/%s (%s) has no task", container, namespace, pod, id)
}

// KillContainer SIGKILLs the processes of a container of a pod on the
// real node, as the kernel's OOM killer or a crash would end them: the
// kubelet then starts the container again in the same pod.
func (c *Cluster) KillContainer(ctx context.Context, namespace, pod, container string) error {
	id, err := c.containerID(ctx, namespace, pod, container)
	if err != nil {
		return err
	}
	_, err = c.node.ctr(ctx, "tasks", "kill", "--all", "--signal", "SIGKILL", id)
	return err
}

// containerID is the containerd ID of a running container of a pod.
func (c *Cluster) containerID(ctx context.Context, namespace, pod, container string) (string, error) {
	if c.node == nil {
		return "", errors.New("not a real node")
	}
	p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container && cs.State.Running != nil {
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			return id, nil
		}
	}
	return "", fmt.Errorf("pod %s/%s has no container %s running", namespace, pod, container)
}
