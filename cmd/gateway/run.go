package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/jetway-ci/jetway/agentmount"
	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/concourse"
	"github.com/jetway-ci/jetway/config"
	"github.com/jetway-ci/jetway/internal/buildinfo"
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

func runCommand(stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Serve the worker API for the targets in --targets-dir",
		Args:  noArgs,
	}
	config.RegisterFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := config.Load(cmd.Flags())
		if err != nil {
			return err
		}
		level, _ := config.ParseLogLevel(cfg.LogLevel) // validated by Load
		logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
		klog.SetSlogLogger(logger.With("component", "client-go"))

		ctx, stop := signalContext(cmd.Context(), logger)
		defer stop()
		return run(ctx, cfg, logger)
	}
	return cmd
}

// run builds the gateway's components and runs them until ctx ends.
func run(ctx context.Context, cfg config.Config, logger *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	var tokens []api.Token
	var tokenFile *api.TokenFile
	var server *api.Server // set below; the tokens file gives it its new tokens
	if cfg.AuthTokensFile != "" {
		var err error
		tokenFile, tokens, err = api.NewTokenFile(api.TokenFileOptions{Path: cfg.AuthTokensFile, Registerer: reg,
			Set: func(tokens []api.Token) { server.SetTokens(tokens) }, Logger: logger.With("component", "tokens")})
		if err != nil {
			return &config.Error{Problems: []config.Problem{{Key: "auth-tokens-file", Message: err.Error()}}}
		}
	}
	if cfg.NoAuth {
		logger.Warn("serving the API without authentication (--no-auth): whoever reaches it can see and act on every target")
	}

	id := steps.NewIdentity(hostname())
	state, err := newStepState(cfg, id, reg, logger)
	if err != nil {
		return err
	}
	registry := targets.NewRegistry(targets.RegistryOptions{
		Interval:     cfg.HealthInterval,
		Timeout:      cfg.HealthTimeout,
		Concurrency:  cfg.HealthConcurrency,
		StallAfter:   cfg.StallAfter,
		Installation: cfg.Installation,
		LandTimeout:  cfg.LandTimeout,
		UserAgent:    "jetway/" + id,
		// A target whose holder keeps its volumes on a claim is asked
		// for persistentvolumeclaims too.
		HolderStorageClass: cfg.VolumeHolderStorageClass,
		Logger:             logger.With("component", "targets"),
		Metrics:            targets.NewMetrics(reg),
	})
	var stepper *steps.Manager // made below; its owners collect their own pods
	controller := lifecycle.New(lifecycle.Options{
		Identity: id,
		Registry: registry,
		GCGrace:  cfg.GCGrace,
		Owned:    func(p *corev1.Pod) bool { return stepper != nil && stepper.Owned(p) },
		Claims:   holderClaims(cfg),
		Logger:   logger.With("component", "lifecycle"),
		Metrics:  lifecycle.NewMetrics(reg),
	})
	registry.SetReconciler(controller)
	source := targets.NewSource(targets.SourceOptions{
		Dir:    cfg.TargetsDir,
		Policy: policy(cfg),
		Resync: cfg.TargetsResync,
		Logger: logger.With("component", "targets-source"),
	}, registry.Apply)
	dialer := portforward.New(portforward.Options{
		Resolve: func(name string) (*rest.Config, error) {
			t, err := registry.Target(name)
			if err != nil {
				return nil, err
			}
			return t.RESTConfig(), nil
		},
		Metrics: portforward.NewMetrics(reg),
		Logger:  logger.With("component", "portforward"),
	})
	var meshNode *mesh.Mesh
	var meshView api.Mesh
	if cfg.MeshEnabled() {
		var err error
		if meshNode, err = newMesh(cfg, registry, reg, logger); err != nil {
			return err
		}
		meshView = meshNode
	}
	streamer := streams.New(streams.Options{
		Dialer:       dialer,
		Installation: cfg.Installation,
		Key:          state.key,
		Target:       registry.Target,
		MaxStreams:   cfg.MaxStreams,
		StallTimeout: cfg.StreamStallTimeout,
		Gateway:      meshName(meshNode),
		Metrics:      streams.NewMetrics(reg),
		Logger:       logger.With("component", "streams"),
	})
	placement := steps.PlacementOptions{Strategy: cfg.PlacementStrategy, NoInputStrategy: cfg.NoInputChain(),
		CheckStrategy: cfg.CheckPlacementStrategy, Limits: cfg.Limits()}
	var stepStreams steps.Streamer = streamer
	if meshView != nil {
		stepStreams = api.StepStreams(streamer, registry, meshView)
	}
	stepOpts := steps.Options{
		Registry:    registry,
		Streamer:    stepStreams,
		Unavailable: state.unavailable,
		Placement:   placement,
		Pod: steppod.Options{AgentImage: cfg.StepAgentImage, AgentMount: steppod.AgentMount(cfg.StepAgentMount), Installation: cfg.Installation,
			Extract: tarsafe.Limits{Bytes: int64(cfg.ExtractMaxBytes), Entries: cfg.ExtractMaxEntries}, Key: state.key},
		ImagePullGrace: cfg.ImagePullGrace,
		KillGrace:      cfg.StepKillGrace,
		GCGrace:        cfg.GCGrace,
		ResourceDir:    cfg.ResourceDir,
		SandboxTTL:     cfg.CheckSandboxTTL,
		Logger:         logger.With("component", "steps"),
		Metrics:        steps.NewMetrics(reg),
	}
	stepOpts.Pod.Steps = stepDefaults(cfg)
	var chooser *agentmount.Chooser
	if stepOpts.Pod.AgentMount == steppod.AgentAuto {
		chooser = agentmount.New(agentmount.Options{Targets: registry, Timeout: cfg.HealthTimeout,
			Metrics: agentmount.NewMetrics(reg), Logger: logger.With("component", "agent-mount")})
		stepOpts.Pod.Chooser = chooser
	}
	if state.store != nil {
		stepOpts.Records, stepOpts.Owners, stepOpts.Leader = state.store, state.owners, state.elector
	}
	if meshNode != nil {
		stepOpts.Elsewhere = func() []targets.Status { return remoteStatuses(meshNode) }
	}
	stepper = steps.New(stepOpts)
	registrar, holder, err := newRegistrar(cfg, registry, controller, meshNode, state, streamer, stepOpts.Pod, reg, logger)
	if err != nil {
		return err
	}
	server = api.New(api.Options{
		Listen:           cfg.Listen,
		ConcourseVersion: cfg.ConcourseVersion,
		WorkerVersion:    wire.WorkerVersion,
		Gatherer:         reg,
		Targets:          registry,
		Lifecycle:        controller,
		Streams:          streamer,
		Steps:            stepper,
		Placement:        placement,
		PlacementMetrics: api.NewPlacementMetrics(reg),
		Mesh:             meshView,
		Concourse:        registrar,
		Tokens:           tokens,
		NoAuth:           cfg.NoAuth,
		Ready:            registry.Loaded,
		ShutdownTimeout:  cfg.ShutdownTimeout,
		Logger:           logger.With("component", "api"),
	})
	logger.Info("starting gateway", "version", buildinfo.String(), "listen", cfg.Listen, "targets_dir", cfg.TargetsDir)
	// Stop order: the API drains its requests while the steps, the
	// streams, the dialer and the targets they use still work; then each
	// goes after the parts that use it. Steps keep running in their pods.
	components := []component{server}
	if meshNode != nil {
		meshNode.SetHTTP(server.Handler())
		components = append(components, meshNode) // serves calls peers forward, with what follows
	}
	if registrar != nil {
		components = append(components, registrar) // its sessions end before the targets they serve
	}
	if holder != nil {
		components = append(components, holder) // its creates end once no session asks for more
	}
	if registrar != nil && state.records != nil {
		components = append(components, state.records) // read by the sessions' calls and sweeps
	}
	components = append(components, stepper)
	if state.store != nil {
		// The placer Lease, then this gateway's own, go once its runners
		// stopped: the others take its steps over at once.
		components = append(components, state.elector, state.owners, state.store, state.keys)
	}
	if chooser != nil {
		components = append(components, chooser) // step pods built after it stopped keep its last choices
	}
	components = append(components, closer(streamer.Close), dialer, source, registry)
	if tokenFile != nil {
		components = append(components, tokenFile)
	}
	err = runAll(ctx, cfg.ShutdownTimeout, components...)
	if err == nil {
		logger.Info("gateway stopped")
	}
	return err
}

// remoteStatuses are the targets the other members of the mesh own.
func remoteStatuses(m *mesh.Mesh) []targets.Status {
	remotes := m.Remotes()
	out := make([]targets.Status, 0, len(remotes))
	for _, r := range remotes {
		out = append(out, r.Target.Status())
	}
	return out
}

// meshName is this gateway's name in the mesh; "" outside one.
func meshName(m *mesh.Mesh) string {
	if m == nil {
		return ""
	}
	return m.Name()
}

// newMesh joins the gateway to the mesh of cfg, announcing registry's
// targets.
func newMesh(cfg config.Config, registry *targets.Registry, reg prometheus.Registerer, logger *slog.Logger) (*mesh.Mesh, error) {
	id, err := mesh.LoadIdentity(cfg.MeshCA, cfg.MeshCert, cfg.MeshKey)
	if err != nil {
		return nil, &config.Error{Problems: []config.Problem{{Key: "mesh-cert", Message: err.Error()}}}
	}
	if cfg.MeshName != "" && cfg.MeshName != id.Name() {
		return nil, &config.Error{Problems: []config.Problem{{Key: "mesh-name", Message: fmt.Sprintf(
			"%q differs from the name in mesh-cert (%q): peers know a gateway by its certificate", cfg.MeshName, id.Name())}}}
	}
	node, err := mesh.New(mesh.Options{
		Identity:    id,
		Listen:      cfg.MeshListen,
		Peers:       cfg.MeshPeers,
		Local:       registry,
		StallAfter:  cfg.MeshStallAfter,
		LeaveOnStop: cfg.MeshLeaveOnStop,
		Logger:      logger.With("component", "mesh"),
		Metrics:     mesh.NewMetrics(reg),
	})
	if err != nil {
		// Config validated the peers: what New refuses is mesh-cert, an
		// agent's certificate, say.
		return nil, &config.Error{Problems: []config.Problem{{Key: "mesh-cert", Message: err.Error()}}}
	}
	return node, nil
}

// hostname names this machine (the pod, in a cluster) in the gateway's
// identity.
func hostname() string {
	host, _ := os.Hostname()
	return host
}

func policy(cfg config.Config) targets.Policy {
	return targets.Policy{
		AllowExecPlugins:   cfg.AllowExecPlugins,
		AllowAuthProviders: cfg.AllowAuthProviders,
		AllowInsecureTLS:   cfg.AllowInsecureTLS,
		AllowExternalFiles: cfg.AllowExternalFiles,
	}
}

// stepDefaults are the step pods' defaults, from the step-* keys
// (validated: the cpu request parses).
func stepDefaults(cfg config.Config) steppod.Defaults {
	size := func(b config.Bytes) resource.Quantity { return *resource.NewQuantity(int64(b), resource.BinarySI) }
	return steppod.Defaults{
		VolumeSizeLimit:         size(cfg.StepVolumeSizeLimit),
		EphemeralStorageRequest: size(cfg.StepEphemeralStorageRequest),
		CPURequest:              resource.MustParse(cfg.StepDefaultCPURequest),
		MemoryRequest:           size(cfg.StepDefaultMemoryRequest),
		CheckCPURequest:         resource.MustParse(cfg.StepCheckCPURequest),
		CheckMemoryRequest:      size(cfg.StepCheckMemoryRequest),
		HolderSize:              size(cfg.VolumeHolderSize),
		HolderStorageClass:      cfg.VolumeHolderStorageClass,
	}
}

// holderClaims names the claim a target's Concourse volume holder keeps
// its volumes on, where it keeps them on one: retire deletes it.
func holderClaims(cfg config.Config) func(t *targets.Target) []string {
	return func(t *targets.Target) []string {
		if t.Config.Meta.Steps.VolumeHolder.StorageClass(cfg.VolumeHolderStorageClass) == "" {
			return nil
		}
		return []string{steppod.HolderName(cfg.Installation)}
	}
}

// component is anything with a blocking Start, stopped by ending its ctx.
type component interface {
	Start(ctx context.Context) error
}

// componentFunc is a function as a component.
type componentFunc func(context.Context) error

func (f componentFunc) Start(ctx context.Context) error { return f(ctx) }

// closer is a component that calls stop when it is stopped.
func closer(stop func()) component {
	return componentFunc(func(ctx context.Context) error {
		<-ctx.Done()
		stop()
		return nil
	})
}

// stopGrace is what the components after the API get, beyond its drain
// bound, to stop: they only end loops that honour their ctx, but a
// port-forward upgrade under way is waited for.
const stopGrace = 5 * time.Second

// runAll runs the components together until ctx ends or one fails. Then it
// stops them one at a time in the order given, each once the one before
// has returned, so that a component is stopped only after those using it.
// The whole stop takes at most timeout (the API's drain) plus stopGrace;
// it returns the failure that began it, else the first error of a stop.
func runAll(ctx context.Context, timeout time.Duration, components ...component) error {
	type running struct {
		c      component
		cancel context.CancelFunc
		done   chan error
	}
	failed := make(chan error, len(components))
	runs := make([]running, len(components))
	for i, c := range components {
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := running{c: c, cancel: cancel, done: make(chan error, 1)}
		go func() {
			err := c.Start(cctx)
			if err != nil {
				failed <- err
			}
			r.done <- err
		}()
		runs[i] = r
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-failed:
	}
	deadline := time.NewTimer(timeout + stopGrace)
	defer deadline.Stop()
	for i, r := range runs {
		r.cancel()
		select {
		case err := <-r.done:
			if first == nil {
				first = err
			}
		case <-deadline.C:
			for _, rest := range runs[i+1:] {
				rest.cancel()
			}
			return fmt.Errorf("shutdown: %T still running after %s", r.c, timeout+stopGrace)
		}
	}
	return first
}

// signalContext ends its context on the first SIGTERM or SIGINT; a second
// signal exits the process at once.
func signalContext(parent context.Context, logger *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	stopped := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case sig := <-sigc:
			logger.Info("shutting down", "signal", sig.String())
			cancel()
		case <-stopped:
			return
		}
		select {
		case sig := <-sigc:
			logger.Warn("second signal, exiting now", "signal", sig.String())
			os.Exit(1)
		case <-stopped:
		}
	}()
	return ctx, func() {
		signal.Stop(sigc)
		close(stopped)
		<-exited
		cancel()
	}
}

// newRegistrar registers the targets with a Concourse web node, if
// concourse-tsa or concourse-url says which; nil otherwise. Of replicas
// sharing targets, the one holding the placer Lease registers them. The
// holder keeps the web node's volumes (nil without a state namespace).
func newRegistrar(cfg config.Config, registry *targets.Registry, lc *lifecycle.Controller, meshNode *mesh.Mesh,
	state stepState, streamer *streams.Streamer, pod steppod.Options, reg prometheus.Registerer,
	logger *slog.Logger) (*concourse.Registrar, *concourse.Holder, error) {
	if cfg.ConcourseTSA == "" && cfg.ConcourseURL == "" {
		return nil, nil, nil
	}
	logger = logger.With("component", "concourse")
	metrics := concourse.NewMetrics(reg)
	web, err := newWeb(cfg, metrics, logger)
	if err != nil {
		return nil, nil, err
	}
	types, err := concourse.LoadResourceTypes(cfg.ConcourseResourceTypes)
	if err != nil {
		return nil, nil, configProblem("concourse-resource-types", err)
	}
	if cfg.ConcourseBundledTypes {
		types = concourse.WithBundled(types)
	}
	registers := func() bool { return true }
	if state.elector != nil {
		registers = func() bool { _, ok := state.elector.Leading(); return ok }
	}
	var agents func() []targets.Status
	var landAgent func(context.Context, string) error
	var agentWorkers *concourse.Agents
	if meshNode != nil {
		// The agents joined to this gateway: it registers them, and
		// reaches their volumes and containers over the mesh.
		agents, landAgent = api.MeshAgents(meshNode), api.LandAgent(meshNode)
		agentWorkers = &concourse.Agents{Joined: agents, Client: meshNode.BulkClient()}
	}
	var holdings concourse.Holdings
	var holder *concourse.Holder
	var volumeAPI func(string) http.Handler
	var containers *concourse.Containers
	if state.keys != nil {
		// Without a state namespace jetway makes no pod: it holds nothing.
		podOptions := func() steppod.Options { return pod }
		var meshView api.Mesh // nil without a mesh, not a nil *mesh.Mesh
		if meshNode != nil {
			meshView = meshNode
		}
		// A web node's p2p stream may cross to another gateway's target.
		stream := api.ConcourseStreams(streamer, registry, meshView)
		holder = &concourse.Holder{Targets: registry, Pod: podOptions, Server: streamer.VolumeServer, Agents: agentWorkers, Metrics: metrics,
			Stream: stream, Logger: logger.With("component", "concourse")}
		records := state.records
		holdings = concourse.Pods{Targets: registry, Key: func() ownership.Key { return state.key }, Holder: holder, Records: records,
			Agents: agentWorkers, KeepGrace: cfg.ConcourseKeepGrace, LostGrace: cfg.ConcourseLostGrace,
			Metrics: metrics, Logger: logger.With("component", "concourse")}
		volumeAPI = holder.API
		containers = &concourse.Containers{Targets: registry, Records: records, Pod: podOptions, Holder: holder, Agents: agentWorkers,
			ResourceTypes: types, Metrics: metrics, Logger: logger}
	}
	return concourse.New(concourse.Options{
		Agents:        agents,
		LandAgent:     landAgent,
		Holdings:      holdings,
		VolumeAPI:     volumeAPI,
		Containers:    containers,
		Web:           web,
		WebURL:        cfg.ConcourseURL, // if given, its worker version is checked first
		Targets:       registry,
		Registers:     registers,
		Lifecycle:     lc,
		ResourceTypes: types,
		SweepInterval: cfg.ConcourseSweepInterval,
		// A graceful stop lets the web node's running processes end.
		Drain:   cfg.ShutdownTimeout,
		Logger:  logger,
		Metrics: metrics,
	}), holder, nil
}

// newWeb is how the web node is reached: its TSA (concourse-tsa), else
// its REST API (concourse-url).
func newWeb(cfg config.Config, metrics *concourse.Metrics, logger *slog.Logger) (concourse.Web, error) {
	if cfg.ConcourseTSA != "" {
		hostKeys, err := concourse.LoadHostKeys(cfg.ConcourseTSAPublicKey)
		if err != nil {
			return nil, configProblem("concourse-tsa-public-key", err)
		}
		key, err := concourse.LoadWorkerKey(cfg.ConcourseWorkerKey)
		if err != nil {
			return nil, configProblem("concourse-worker-key", err)
		}
		return concourse.TSA{Addrs: cfg.TSAAddrs(), HostKeys: hostKeys, Key: key,
			Rebalance: cfg.ConcourseRebalance, Drain: cfg.ConcourseDrain}, nil
	}
	b, err := os.ReadFile(cfg.ConcourseClientSecretFile)
	if err != nil {
		return nil, configProblem("concourse-client-secret-file", err)
	}
	secret := strings.TrimSpace(string(b)) // a Secret's file often ends in a newline
	if secret == "" {
		return nil, configProblem("concourse-client-secret-file", fmt.Errorf("%s is empty", cfg.ConcourseClientSecretFile))
	}
	nets, err := cfg.WebNodeNetworks()
	if err != nil {
		return nil, configProblem("concourse-web-node-networks", err)
	}
	for _, n := range nets {
		if n.Bits() == 0 {
			logger.Warn("the workers' Garden and volume listeners accept anyone who reaches " + cfg.ConcourseWorkerAddress +
				" (concourse-web-node-networks includes " + n.String() + "): they take no credential; give the web node's networks alone (docs/concourse.md)")
		}
	}
	web, err := concourse.NewREST(concourse.RESTOptions{URL: cfg.ConcourseURL, ClientID: cfg.ConcourseClientID,
		ClientSecret: concourse.Secret(secret), Insecure: cfg.ConcourseInsecure, WorkerHost: cfg.ConcourseWorkerAddress,
		WebNodeNetworks: nets, Logger: logger, Metrics: metrics})
	if err != nil {
		return nil, configProblem("concourse-url", err)
	}
	return web, nil
}

func configProblem(key string, err error) error {
	return &config.Error{Problems: []config.Problem{{Key: key, Message: err.Error()}}}
}
