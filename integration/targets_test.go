package integration

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/agentmount"
	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// gateway is `gateway run` in process: source, registry, lifecycle
// controller and API over a targets directory.
type gateway struct {
	token    string // an admin token for get, when the gateway has tokens
	dir      string
	base     string
	logs     *syncBuffer
	registry *targets.Registry
	steps    *steps.Manager
	reg      *prometheus.Registry
	stop     func()
	mesh     *mesh.Mesh // nil: not in a mesh
	meshAddr string     // where it accepts peers, if it does
	state    *stateNamespace
	identity string // its steps identity
	holder   *concourse.Holder
	// containers are the web node's containers (Containers.API serves
	// a worker's Garden), with or without a web node.
	containers *concourse.Containers
	// chooser chooses the agent's mount per target (agentMount auto); nil
	// otherwise.
	chooser *agentmount.Chooser
}

// gatewayOptions vary the in-process gateway; zero values are test defaults.
type gatewayOptions struct {
	identity     string
	installation string
	landTimeout  time.Duration
	gcGrace      time.Duration
	tokens       []api.Token
	// Steps: the placement chain and limits, and the pull and kill graces.
	placement   steps.PlacementOptions
	pullGrace   time.Duration
	killGrace   time.Duration
	resourceDir string
	sandboxTTL  time.Duration
	execStream  steppod.ExecStream // wraps the sandbox sessions' exec, if set
	// listen, if set, is the API's address (a restarted gateway keeps it).
	listen string
	// mesh, if set, joins the gateway to a mesh.
	mesh *meshOptions
	// streamStall is the streams' stall timeout; default 3s.
	streamStall time.Duration
	// retain is how long an ended step's log stays in a check sandbox,
	// and a released step's record; default a minute.
	retain time.Duration
	// targetGone is how long a step's target may be missing; default
	// steps.DefaultTargetGoneGrace.
	targetGone time.Duration
	// extract bounds what one archive streamed into a step pod writes
	// (its sidecar's flags: a real node's pods alone read them).
	extract tarsafe.Limits
	// agentImage is the step agent's image in step pods; default one no
	// kwok pod pulls. The real node's is its NodeImage("step-agent-image.tar").
	agentImage string
	// agentMount is how step pods get the agent; "": an init container
	// (kwok's nodes run the agent from a local folder, whatever the pod
	// says). The real node's gateways (nodeGateway) mount it as an image
	// volume. With auto the gateway runs an agentmount.Chooser
	// (gateway.chooser).
	agentMount steppod.AgentMount
	// targetYAML is the real node's target's target.yaml (nodeGateway);
	// default "{}".
	targetYAML string
	// claims: the target's Role (targetGateway) grants
	// targets.ClaimPermissions too, for a volume holder on a claim.
	claims bool
	// images: the target's Role grants targets.ImagePermissions too, for
	// a volume holder that serves images (targetYAML says it).
	images bool
	// stepDefaults are the step pods' size limit and requests; zero: none
	// (the real node's gateways take the gateway's defaults, nodeDefaults).
	stepDefaults steppod.Defaults
	// concourse, if set, registers the targets with a Concourse web node:
	// through its TSA (*concourse.TSA) or its REST API (*concourse.REST).
	concourse concourse.Web
	// resourceTypes are the base resource types the workers offer.
	resourceTypes []wire.ResourceType
	// sweep is how often each registration sweeps with the web node;
	// default concourse.DefaultSweepInterval.
	sweep time.Duration
	// holderBindGrace is the volume holder's BindGrace; default its own.
	holderBindGrace time.Duration
	// holderReady is how long a volume call waits for a holder to run
	// (the holder's Ready); default its own.
	holderReady time.Duration
	// keepGrace is how long a destroyed container's pod is kept for the
	// volumes it holds (concourse.Pods.KeepGrace); default its own.
	keepGrace time.Duration
	// lostGrace is how long a lost container's record is kept
	// (concourse.Pods.LostGrace); default its own.
	lostGrace time.Duration
	// state keeps the gateway's step records and leases; replicas share
	// one. nil: the one of the gateway's targets dir (made for the first
	// gateway over it, so a gateway restarted over it finds its steps).
	state *stateNamespace
}

// listenAPI listens on addr, or (empty) on a free port below the
// ephemeral ones, where a gateway restarted on its address finds it free
// (cluster.FreeAddr).
func listenAPI(addr string) (net.Listener, error) {
	if addr != "" {
		return net.Listen("tcp", addr)
	}
	var err error
	for range 10 {
		if addr, err = cluster.FreeAddr(); err != nil {
			return nil, err
		}
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
	}
	return nil, err
}

// states are the state namespaces of the targets dirs gateways ran over.
var states sync.Map // dir -> *stateNamespace

// stateNamespace is a namespace of clusters[0] holding an installation's
// step state, with a service account granted steps.StatePermissions
// alone, as an operator would set it up.
type stateNamespace struct {
	namespace  string
	kubeconfig []byte
	rest       *rest.Config
}

// stateOf is the state namespace of the gateways over dir: made for the
// first.
func stateOf(t *testing.T, dir string) *stateNamespace {
	t.Helper()
	if st, ok := states.Load(dir); ok {
		return st.(*stateNamespace)
	}
	st := newState(t)
	states.Store(dir, st)
	return st
}

// newState makes a state namespace, deleted after the test.
func newState(t *testing.T) *stateNamespace {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "state-" + hex.EncodeToString(b)
	tg, err := clusters[0].CreateTarget(ctx, cluster.TargetOptions{Namespace: ns, Rules: targets.RBACRules(steps.StatePermissions)})
	require.NoError(t, err)
	rc, err := clientcmd.RESTConfigFromKubeConfig(tg.Kubeconfig)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = clusters[0].Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	// The installation "jetway"'s pod key is the tests' (podKey), so that
	// the pods tests make by hand are sealed as a gateway's.
	_, err = clusters[0].Client.CoreV1().Secrets(ns).Create(ctx, ownership.KeySecret("jetway", podKeyBytes), metav1.CreateOptions{})
	require.NoError(t, err)
	return &stateNamespace{namespace: ns, kubeconfig: tg.Kubeconfig, rest: rc}
}

// podKey is installation "jetway"'s pod key in every state namespace the
// tests make: pods made by hand carry its seals, their volume servers
// serve its tokens.
var (
	podKeyBytes = []byte("integration-tests-pod-key-0123456789abcdef")
	podKey, _   = ownership.NewKey(podKeyBytes)
)

// testNonce is the nonce of a pod that the tests make as jetway makes its
// own: fixed per target and name, so that its sidecar can be started
// before the pod is made.
func testNonce(target, pod string) string {
	sum := sha256.Sum256([]byte(target + "/" + pod))
	return hex.EncodeToString(sum[:16])
}

// sidecarToken is the token of the sidecar of pod on target, and
// sidecarHash its hash, which the sidecar serves.
func sidecarToken(target, pod string) string {
	return podKey.Token(target, pod, testNonce(target, pod))
}
func sidecarHash(target, pod string) string { return ownership.TokenHash(sidecarToken(target, pod)) }

// jetwayAnnotations are the annotations of a pod of name on target for
// team that the tests make as jetway makes its own: its seal and nonce.
func jetwayAnnotations(target, name, team string) map[string]string {
	return map[string]string{ownership.SealAnnotation: podKey.Seal(target, name, team), ownership.NonceAnnotation: testNonce(target, name)}
}

// createJetwayPod creates pod as jetway creates its own: then binds it to
// its UID (ownership.Bind) with the tests' pod key.
func createJetwayPod(ctx context.Context, t *testing.T, c *cluster.Cluster, target string, pod *corev1.Pod) {
	t.Helper()
	pods := c.Client.CoreV1().Pods(pod.Namespace)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = ownership.Bind(ctx, pods, podKey, target, created)
	require.NoError(t, err)
}

// loadKey is the pod key of installation in the state namespace, as a
// gateway reads it.
func (s *stateNamespace) loadKey(t *testing.T, installation string) ownership.Key {
	t.Helper()
	client, err := kubernetes.NewForConfig(s.rest)
	require.NoError(t, err)
	k, err := ownership.LoadKey(context.Background(), client.CoreV1(), s.namespace, installation)
	require.NoError(t, err)
	return k
}

// flags are a `gateway run`'s flags for the state namespace.
func (s *stateNamespace) flags(t *testing.T) []string {
	file := filepath.Join(t.TempDir(), "state.kubeconfig")
	writeFile(t, file, s.kubeconfig)
	return []string{"--state-kubeconfig", file, "--state-namespace", s.namespace}
}

func meshName(m *mesh.Mesh) string {
	if m == nil {
		return ""
	}
	return m.Name()
}

// meshOptions are a gateway's mesh flags.
type meshOptions struct {
	caFile, certFile, keyFile string
	listen                    string // "127.0.0.1:0" for any port
	peers                     []string
	stallAfter                time.Duration
}

// Test tokens of gateways started with tokens.
var (
	adminToken = api.Token{Name: "ops", Token: "admin-token-0123456789", Admin: true}
	mainToken  = api.Token{Name: "main-ci", Token: "main-token-0123456789", Team: "main"}
)

func startTargetsGateway(t *testing.T, dir string) *gateway {
	return startGateway(t, dir, gatewayOptions{})
}

func startGateway(t *testing.T, dir string, o gatewayOptions) *gateway {
	t.Helper()
	if o.identity == "" {
		o.identity = "replica-a"
	}
	if o.installation == "" {
		o.installation = "jetway"
	}
	if o.landTimeout == 0 {
		o.landTimeout = time.Hour
	}
	if o.gcGrace == 0 {
		o.gcGrace = time.Hour
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", o.identity)
	reg := prometheus.NewRegistry()
	registry := targets.NewRegistry(targets.RegistryOptions{
		Interval: 300 * time.Millisecond, Timeout: 2 * time.Second, Concurrency: 8, StallAfter: 3,
		Installation: o.installation, LandTimeout: o.landTimeout, Logger: logger, Metrics: targets.NewMetrics(reg),
	})
	var stepper *steps.Manager // made below; its owners collect their own pods
	controller := lifecycle.New(lifecycle.Options{
		Identity: o.identity, Registry: registry, GCGrace: o.gcGrace, Logger: logger, Metrics: lifecycle.NewMetrics(reg),
		Owned: func(p *corev1.Pod) bool { return stepper != nil && stepper.Owned(p) },
	})
	registry.SetReconciler(controller)
	source := targets.NewSource(targets.SourceOptions{Dir: dir, Resync: time.Minute, Logger: logger}, registry.Apply)
	dialer := portforward.New(portforward.Options{Metrics: portforward.NewMetrics(reg), Logger: logger,
		Resolve: func(name string) (*rest.Config, error) {
			tg, err := registry.Target(name)
			if err != nil {
				return nil, err
			}
			return tg.RESTConfig(), nil
		}})
	var node *mesh.Mesh
	var meshView api.Mesh
	if m := o.mesh; m != nil {
		id, err := mesh.LoadIdentity(m.caFile, m.certFile, m.keyFile)
		require.NoError(t, err)
		node, err = mesh.New(mesh.Options{Identity: id, Listen: m.listen, Peers: m.peers, Local: registry,
			StallAfter: cmp.Or(m.stallAfter, 2*time.Second), Logger: logger.With("component", "mesh"),
			Metrics: mesh.NewMetrics(reg)})
		require.NoError(t, err)
		meshView = node
	}
	if o.state == nil {
		o.state = stateOf(t, dir)
	}
	key := o.state.loadKey(t, o.installation)
	streamer := streams.New(streams.Options{Dialer: dialer, Logger: logger, StallTimeout: cmp.Or(o.streamStall, 3*time.Second),
		Installation: o.installation, Key: key, Gateway: meshName(node),
		Target:  registry.Target,
		Metrics: streams.NewMetrics(reg)})
	t.Cleanup(streamer.Close)
	var stepStreams steps.Streamer = streamer
	if meshView != nil {
		stepStreams = api.StepStreams(streamer, registry, meshView)
	}
	id := steps.NewIdentity(o.identity)
	podOpts := steppod.Options{AgentImage: cmp.Or(o.agentImage, "ghcr.io/jetway-ci/step-agent:test"), AgentMount: o.agentMount, Installation: o.installation,
		Extract: o.extract, Key: key, Steps: o.stepDefaults}
	var chooser *agentmount.Chooser
	if o.agentMount == steppod.AgentAuto {
		chooser = agentmount.New(agentmount.Options{Targets: registry, Timeout: 2 * time.Second, Logger: logger})
		podOpts.Chooser = chooser
	}
	stateOpts := func() (steps.StoreOptions, steps.OwnersOptions, steps.ElectorOptions) {
		return steps.StoreOptions{Config: o.state.rest, Namespace: o.state.namespace, Installation: o.installation, Logger: logger},
			steps.OwnersOptions{Config: o.state.rest, Namespace: o.state.namespace, Installation: o.installation, Identity: id, Logger: logger},
			steps.ElectorOptions{Config: o.state.rest, Namespace: o.state.namespace, Installation: o.installation, Identity: id, Logger: logger}
	}
	so, oo, eo := stateOpts()
	store, err := steps.NewStore(so)
	require.NoError(t, err)
	owners, err := steps.NewOwners(oo)
	require.NoError(t, err)
	elector, err := steps.NewElector(eo)
	require.NoError(t, err)
	stepper = steps.New(steps.Options{Registry: registry, Streamer: stepStreams, Placement: o.placement, GCGrace: o.gcGrace,
		Records: store, Owners: owners, Leader: elector, Elsewhere: func() []targets.Status {
			if node == nil {
				return nil
			}
			var out []targets.Status
			for _, r := range node.Remotes() {
				out = append(out, r.Target.Status())
			}
			return out
		},
		Pod:            podOpts,
		ImagePullGrace: o.pullGrace, KillGrace: cmp.Or(o.killGrace, 2*time.Second), Retain: cmp.Or(o.retain, time.Minute), TargetGoneGrace: o.targetGone,
		ResourceDir: o.resourceDir, SandboxTTL: o.sandboxTTL, ExecStream: o.execStream,
		Logger: logger, Metrics: steps.NewMetrics(reg)})
	var registrar *concourse.Registrar
	// The volume holder serves the web node's volumes; tests without one
	// call its API themselves (gateway.holder).
	metrics := concourse.NewMetrics(reg)
	var agentWorkers *concourse.Agents // the agents' workers, as gateway run reaches them
	if node != nil {
		agentWorkers = &concourse.Agents{Joined: api.MeshAgents(node), Client: node.BulkClient()}
	}
	holder := &concourse.Holder{Targets: registry, Pod: func() steppod.Options { return podOpts },
		Server: streamer.VolumeServer, Agents: agentWorkers, BindGrace: o.holderBindGrace, Ready: o.holderReady, Metrics: metrics,
		Stream: api.ConcourseStreams(streamer, registry, meshView), Logger: logger.With("component", "concourse")}
	stateClient, err := kubernetes.NewForConfig(o.state.rest)
	require.NoError(t, err)
	records := &concourse.ContainerRecords{Secrets: stateClient.CoreV1().Secrets(o.state.namespace), Installation: o.installation}
	containers := &concourse.Containers{Targets: registry, Records: records, Pod: func() steppod.Options { return podOpts },
		Holder: holder, Agents: agentWorkers, ResourceTypes: o.resourceTypes, Metrics: metrics, Logger: logger.With("component", "concourse")}
	if o.concourse != nil {
		registrar = concourse.New(concourse.Options{Web: o.concourse, Targets: registry, Lifecycle: controller,
			Registers: func() bool { _, ok := elector.Leading(); return ok },
			Holdings: concourse.Pods{Targets: registry, Key: func() ownership.Key { return key }, Holder: holder, Records: records,
				Agents: agentWorkers, KeepGrace: o.keepGrace, LostGrace: o.lostGrace, Metrics: metrics, Logger: logger.With("component", "concourse")},
			VolumeAPI: holder.API, SweepInterval: o.sweep,
			Containers:    containers,
			ResourceTypes: o.resourceTypes,
			Agents:        agentsOf(node), LandAgent: landAgentOf(node),
			Logger: logger.With("component", "concourse"), Metrics: metrics})
	}
	ln, err := listenAPI(o.listen)
	require.NoError(t, err)
	server := api.New(api.Options{Listener: ln, Mesh: meshView, Gatherer: reg, Targets: registry, Lifecycle: controller, Streams: streamer,
		Concourse: registrar,
		Steps:     stepper, Placement: o.placement,
		Tokens: o.tokens, NoAuth: o.tokens == nil,
		ConcourseVersion: "8.2.5", WorkerVersion: "2.5", ShutdownTimeout: time.Second, Logger: logger})

	// Stopped in two waves: the steps first, then the rest at once (this
	// gateway's leases go once its runners stopped, as in gateway run).
	first := []interface{ Start(context.Context) error }{stepper}
	if registrar != nil {
		first = append(first, registrar)
	}
	first = append(first, holder)
	second := []interface{ Start(context.Context) error }{server, registry, source, dialer, store, owners, elector, records}
	if chooser != nil {
		second = append(second, chooser)
	}
	if node != nil {
		node.SetHTTP(server.Handler())
		second = append(second, node)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	var wg1, wg2 sync.WaitGroup
	for _, c := range first {
		wg1.Go(func() { assert.NoError(t, c.Start(ctx1)) })
	}
	for _, c := range second {
		wg2.Go(func() { assert.NoError(t, c.Start(ctx2)) })
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel1(); wg1.Wait(); cancel2(); wg2.Wait() }) }
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("gateway %s logs:\n%s", o.identity, logs.String())
		}
	})
	g := &gateway{dir: dir, base: "http://" + ln.Addr().String(), logs: logs, registry: registry, steps: stepper, reg: reg, stop: stop,
		mesh: node, state: o.state, identity: id, holder: holder, containers: containers,
		chooser: chooser}
	if node != nil {
		<-node.Ready()
		if a := node.Addr(); a != nil {
			g.meshAddr = a.String()
		}
	}
	for _, tok := range o.tokens {
		if tok.Admin {
			g.token = tok.Token // what the test's own reads use
		}
	}
	return g
}

func (g *gateway) get(t *testing.T, path string, v any) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.base+path, nil)
	require.NoError(t, err)
	if g.token != "" {
		req.Header.Set("Authorization", "Bearer "+g.token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	if v != nil {
		require.NoError(t, json.Unmarshal(b, v))
	}
	return string(b)
}

// targetsByName fetches /api/v1/targets.
func (g *gateway) targetsByName(t *testing.T) map[string]api.Target {
	var list []api.Target
	g.get(t, "/api/v1/targets", &list)
	out := map[string]api.Target{}
	for _, tg := range list {
		out[tg.Name] = tg
	}
	return out
}

// waitTarget waits until the named target satisfies cond.
func (g *gateway) waitTarget(t *testing.T, name string, within time.Duration, cond func(api.Target) bool) api.Target {
	t.Helper()
	var last api.Target
	eventually(t, within, func() error {
		tg, ok := g.targetsByName(t)[name]
		last = tg
		if !ok {
			return errorf("target %s not listed", name)
		}
		if !cond(tg) {
			return errorf("target %s: state %s, error %q, missing %v", name, tg.State, tg.Error, tg.MissingPermissions)
		}
		return nil
	})
	return last
}

func running(tg api.Target) bool { return tg.State == "running" }

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

// TestTargetsOnRealClusters covers the targets directory end to end: health,
// permissions as the real RBAC answers them, bad entries beside good ones,
// and credentials never leaking.
func TestTargetsOnRealClusters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c0, c1 := clusters[0], clusters[1]
	healthy, err := c0.CreateTarget(ctx, cluster.TargetOptions{Namespace: "tg-healthy", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	// Everything but creating port-forwards: GET (WebSocket) is granted,
	// POST (SPDY) is not.
	var partial []targets.Permission
	for _, p := range targets.Required {
		if p.String() != "create pods/portforward" {
			partial = append(partial, p)
		}
	}
	noForward, err := c1.CreateTarget(ctx, cluster.TargetOptions{Namespace: "tg-noforward", Rules: targets.RBACRules(partial)})
	require.NoError(t, err)
	other, err := c1.CreateTarget(ctx, cluster.TargetOptions{Namespace: "tg-other", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "healthy.kubeconfig"), healthy.Kubeconfig)
	writeFile(t, filepath.Join(dir, "noforward", "kubeconfig"), noForward.Kubeconfig)
	writeFile(t, filepath.Join(dir, "noforward", "target.yaml"), []byte("team: main\ntags: [gpu]\n"))
	writeFile(t, filepath.Join(dir, "other"), other.Kubeconfig)
	writeFile(t, filepath.Join(dir, "malformed.kubeconfig"), []byte("apiVersion: v1\nclusters: [ {name: x\n"))
	noContext, err := c0.Kubeconfig("tg-healthy", healthy.Token)
	require.NoError(t, err)
	writeFile(t, filepath.Join(dir, "nocontext.kubeconfig"), bytes.Replace(noContext, []byte("current-context: "+c0.Name), []byte("current-context: gone"), 1))
	writeFile(t, filepath.Join(dir, "exec.kubeconfig"), bytes.Replace(healthy.Kubeconfig,
		[]byte("    token: "+healthy.Token), []byte("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: fetch-token\n"), 1))
	unreachable := bytes.Replace(healthy.Kubeconfig, []byte(c0.Server), []byte("https://127.0.0.1:1"), 1)
	writeFile(t, filepath.Join(dir, "unreachable.kubeconfig"), unreachable)

	g := startTargetsGateway(t, dir)

	g.waitTarget(t, "healthy", 20*time.Second, running)
	g.waitTarget(t, "other", 20*time.Second, running)
	nf := g.waitTarget(t, "noforward", 20*time.Second, func(tg api.Target) bool { return tg.LastCheck != nil })
	assert.Equal(t, "stalled", nf.State)
	assert.Equal(t, []string{"create pods/portforward"}, nf.MissingPermissions, "exactly the missing permission")
	assert.Equal(t, "missing permissions: create pods/portforward", nf.Error)
	assert.Equal(t, "main", nf.Team)

	want := map[string]string{
		"malformed":   "kubeconfig does not parse",
		"nocontext":   `current-context "gone" does not exist`,
		"exec":        `exec plugin "fetch-token" (allow with --allow-exec-plugins)`,
		"unreachable": "API server unreachable",
	}
	for name, msg := range want {
		tg := g.waitTarget(t, name, 20*time.Second, func(tg api.Target) bool { return strings.Contains(tg.Error, msg) })
		assert.Equal(t, "stalled", tg.State, name)
	}

	byName := g.targetsByName(t)
	var workers []wire.Worker
	g.get(t, "/api/v1/workers", &workers)
	assert.Len(t, workers, len(byName), "every entry is in both lists")
	assert.Len(t, byName, 7)
	h := byName["healthy"]
	assert.Equal(t, "v1.36.3", h.ServerVersion)
	assert.Greater(t, h.LatencyMS, 0.0)
	assert.Equal(t, c0.Server, h.Server)
	assert.Equal(t, "tg-healthy", h.Namespace)

	metrics := scrape(t, g.reg)
	assert.Contains(t, metrics, `jetway_targets{state="running"} 2`)
	assert.Contains(t, metrics, `jetway_targets{state="stalled"} 5`)
	assert.Regexp(t, `jetway_target_check_failures_total\{reason="missing_permissions"\} [1-9]`, metrics)
	assert.Regexp(t, `jetway_target_check_failures_total\{reason="unreachable"\} [1-9]`, metrics)
	// Per target, for alerts: its state and team, and what the real RBAC
	// left out.
	assert.Contains(t, metrics, `jetway_target_state{state="running",target="healthy",team=""} 1`)
	assert.Contains(t, metrics, `jetway_target_state{state="stalled",target="noforward",team="main"} 1`)
	assert.Contains(t, metrics, `jetway_target_missing_permissions{target="noforward"} 1`)
	assert.Contains(t, metrics, `jetway_target_missing_permissions{target="healthy"} 0`)
	assert.Equal(t, 7, strings.Count(metrics, "jetway_target_state{"), "one series per target")

	// Credentials never reach logs, errors, metrics or API output.
	out := g.logs.String() + metrics + g.get(t, "/api/v1/targets", nil) + g.get(t, "/api/v1/workers", nil)
	for _, secret := range []string{healthy.Token, noForward.Token, other.Token} {
		assert.NotContains(t, out, secret)
	}
}

// TestTargetsFollowSecretSwaps rewrites the directory as the kubelet
// updates a Secret mount: targets are added, removed and their tokens
// rotated without a restart, within 2 seconds of the swap.
func TestTargetsFollowSecretSwaps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clusters[0]
	a, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "swap-a", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	b, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "swap-b", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	revoked, err := c.Kubeconfig("swap-a", "not-a-valid-token")
	require.NoError(t, err)

	dir := t.TempDir()
	gen := 0
	swap := func(files map[string][]byte) {
		gen++
		ts := filepath.Join(dir, "..2026_11_22_"+strings.Repeat("0", gen))
		for name, content := range files {
			writeFile(t, filepath.Join(ts, name), content)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		require.NoError(t, os.Symlink(filepath.Base(ts), tmp))
		require.NoError(t, os.Rename(tmp, filepath.Join(dir, "..data")))
		des, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, de := range des {
			if _, keep := files[de.Name()]; !keep && !strings.HasPrefix(de.Name(), ".") {
				require.NoError(t, os.Remove(filepath.Join(dir, de.Name())))
			}
		}
		for name := range files {
			if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
				require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)))
			}
		}
	}

	swap(map[string][]byte{"a.kubeconfig": revoked})
	g := startTargetsGateway(t, dir)
	tg := g.waitTarget(t, "a", 10*time.Second, func(tg api.Target) bool { return strings.Contains(tg.Error, "credentials rejected (401)") })
	assert.Equal(t, "stalled", tg.State)

	start := time.Now()
	swap(map[string][]byte{"a.kubeconfig": a.Kubeconfig, "b.kubeconfig": b.Kubeconfig})
	g.waitTarget(t, "b", 2*time.Second, func(api.Target) bool { return true })
	t.Logf("added target listed %s after the swap", time.Since(start))
	g.waitTarget(t, "a", 5*time.Second, running) // rotated token works
	g.waitTarget(t, "b", 5*time.Second, running)

	start = time.Now()
	swap(map[string][]byte{"b.kubeconfig": b.Kubeconfig})
	eventually(t, 2*time.Second, func() error {
		if _, ok := g.targetsByName(t)["a"]; ok {
			return errorf("a still listed")
		}
		return nil
	})
	t.Logf("removed target gone %s after the swap", time.Since(start))
	assert.Equal(t, "running", g.targetsByName(t)["b"].State, "unchanged target undisturbed")
}

// TestTargetStallsDuringOutage stops a cluster's API server: its target
// stalls after the configured number of failed checks, the other cluster's
// target keeps running, and the restarted server brings it back.
func TestTargetStallsDuringOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	down, up := clusters[1], clusters[0]
	td, err := down.CreateTarget(ctx, cluster.TargetOptions{Namespace: "outage-t", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	tu, err := up.CreateTarget(ctx, cluster.TargetOptions{Namespace: "outage-u", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "down.kubeconfig"), td.Kubeconfig)
	writeFile(t, filepath.Join(dir, "up.kubeconfig"), tu.Kubeconfig)
	g := startTargetsGateway(t, dir)
	g.waitTarget(t, "down", 10*time.Second, running)
	g.waitTarget(t, "up", 10*time.Second, running)

	stopped := time.Now()
	down.StopAPIServer()
	t.Logf("API server took %s to stop", time.Since(stopped))
	// 3 failed checks at ~300ms intervals (+10% jitter, a refused connection
	// fails fast): stalled within about a second; allow for a loaded machine.
	tg := g.waitTarget(t, "down", 5*time.Second, func(tg api.Target) bool { return tg.State == "stalled" })
	t.Logf("stalled %s after the API server stopped", time.Since(stopped))
	assert.Contains(t, tg.Error, "API server unreachable")
	// That one bad check does not stall a target is proven on a fake clock
	// (targets.TestStallsAfterConsecutiveFailuresOnly).
	assert.Equal(t, "running", g.targetsByName(t)["up"].State)

	require.NoError(t, down.StartAPIServer(ctx))
	g.waitTarget(t, "down", 10*time.Second, running)
}

// scrape is g's series, one a line as the text format writes them:
// gauges, counters, and a histogram's _sum and _count.
func scrape(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	rr := &bytes.Buffer{}
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var pairs []string
			for _, l := range m.GetLabel() {
				pairs = append(pairs, l.GetName()+`="`+l.GetValue()+`"`)
			}
			labels := ""
			if pairs != nil {
				labels = "{" + strings.Join(pairs, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				rr.WriteString(mf.GetName() + labels + " " + ftoa(m.GetGauge().GetValue()) + "\n")
			case m.GetCounter() != nil:
				rr.WriteString(mf.GetName() + labels + " " + ftoa(m.GetCounter().GetValue()) + "\n")
			case m.GetHistogram() != nil:
				h := m.GetHistogram()
				rr.WriteString(mf.GetName() + "_sum" + labels + " " + ftoa(h.GetSampleSum()) + "\n")
				rr.WriteString(mf.GetName() + "_count" + labels + " " + ftoa(float64(h.GetSampleCount())) + "\n")
			}
		}
	}
	return rr.String()
}

// TestSlowTargetDelaysNoOther points a target at a server that accepts
// connections and never answers: its checks time out while a healthy
// target on the same gateway keeps being checked on schedule.
func TestSlowTargetDelaysNoOther(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := clusters[0]
	ok, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "slow-ok", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	blackhole := serveTCP(t, func(net.Conn) {}) // accepts, never answers

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ok.kubeconfig"), ok.Kubeconfig)
	writeFile(t, filepath.Join(dir, "slow.kubeconfig"),
		bytes.Replace(ok.Kubeconfig, []byte(c.Server), []byte("https://"+blackhole.Addr().String()), 1))
	g := startTargetsGateway(t, dir)
	g.waitTarget(t, "ok", 10*time.Second, running)

	// While the slow target's first check hangs for its 2 s timeout, the
	// healthy one keeps being checked (every 300 ms; the exact schedule is
	// proven on a fake clock by targets.TestSlowTargetDelaysNoOtherCheck).
	checks := map[time.Time]bool{}
	eventually(t, 10*time.Second, func() error {
		if tg := g.targetsByName(t)["ok"]; tg.LastCheck != nil {
			checks[*tg.LastCheck] = true
		}
		if slow := g.targetsByName(t)["slow"]; slow.Error == "" || slow.Error == "not checked yet" {
			return errorf("slow target not checked yet")
		}
		return nil
	})
	assert.GreaterOrEqual(t, len(checks), 3, "healthy target checked while the slow one hung")
	slow := g.waitTarget(t, "slow", 10*time.Second, func(tg api.Target) bool { return tg.Error != "" && tg.Error != "not checked yet" })
	assert.Contains(t, slow.Error, "did not answer in time")
	assert.Equal(t, "stalled", slow.State)
}

// agentsOf and landAgentOf are what gateway run gives the registrar of a
// gateway with a mesh: the agents joined to it, and their land.
func agentsOf(node *mesh.Mesh) func() []targets.Status {
	if node == nil {
		return nil
	}
	return api.MeshAgents(node)
}

func landAgentOf(node *mesh.Mesh) func(context.Context, string) error {
	if node == nil {
		return nil
	}
	return api.LandAgent(node)
}
