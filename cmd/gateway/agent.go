package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/jetway-ci/jetway/agent"
	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/config"
	"github.com/jetway-ci/jetway/internal/buildinfo"
	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/stepagent/cli"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// agentFlags are `gateway agent`'s settings.
type agentFlags struct {
	join                   []string
	ca, cert, key, workDir string
	platform, team         string
	tags                   []string
	teamGiven, tagsGiven   bool // --team and --tag were given: the certificate must say the same
	killGrace              time.Duration
	logLevel               string
	listen                 string
	extractSize            string
	extractEntries         int
}

// validate reports every problem at once, keyed by flag.
func (f agentFlags) validate() error {
	var probs []config.Problem
	add := func(key, format string, args ...any) {
		probs = append(probs, config.Problem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	if len(f.join) == 0 {
		add("join", "required: the HOST:PORT of a gateway's mesh listener")
	}
	for _, j := range f.join {
		if _, _, err := net.SplitHostPort(strings.TrimPrefix(j, "dns:")); err != nil {
			add("join", "%q: want HOST:PORT: %v", j, err)
		}
	}
	for key, v := range map[string]string{"ca": f.ca, "cert": f.cert, "key": f.key, "work-dir": f.workDir} {
		if v == "" {
			add(key, "required")
		}
	}
	if errs := validation.IsDNS1123Label(f.platform); len(errs) > 0 {
		add("platform", "%q: %s", f.platform, strings.Join(errs, ", "))
	}
	for _, t := range f.tags {
		if t == "" {
			add("tag", "empty")
		}
	}
	if f.killGrace <= 0 {
		add("kill-grace", "must be positive")
	}
	if _, err := config.ParseLogLevel(f.logLevel); err != nil {
		add("log-level", "%v", err)
	}
	if f.listen != "" {
		if _, _, err := net.SplitHostPort(f.listen); err != nil {
			add("listen", "%q: want HOST:PORT: %v", f.listen, err)
		}
	}
	if q, err := resource.ParseQuantity(f.extractSize); err != nil || q.Value() <= 0 {
		add("extract-max-bytes", "%q: want a positive size like 32Gi or 1073741824", f.extractSize)
	}
	if f.extractEntries <= 0 {
		add("extract-max-entries", "must be positive, got %d", f.extractEntries)
	}
	if len(probs) > 0 {
		return &config.Error{Problems: probs}
	}
	return nil
}

// matches checks --team and --tag, if given, against what the agent's
// certificate says it is: a gateway takes the agent for what its
// certificate says, so flags saying otherwise are a mistake to name
// before it runs.
func (f agentFlags) matches(scope mesh.AgentScope) error {
	var probs []config.Problem
	switch {
	case !f.teamGiven:
	case f.team == "" && !scope.Global:
		probs = append(probs, config.Problem{Key: "team", Message: fmt.Sprintf(`"" (every team) but the certificate %s makes this agent one of %s: drop --team, or issue the certificate again`, f.cert, scope)})
	case f.team != "" && f.team != scope.Team:
		probs = append(probs, config.Problem{Key: "team", Message: fmt.Sprintf("%q but the certificate %s makes this agent one of %s: drop --team, or issue the certificate again", f.team, f.cert, scope)})
	}
	if f.tagsGiven {
		tags := slices.Clone(f.tags)
		slices.Sort(tags)
		if !slices.Equal(slices.Compact(tags), scope.Tags) {
			probs = append(probs, config.Problem{Key: "tag", Message: fmt.Sprintf("%s but the certificate %s makes this agent one of %s: drop --tag, or issue the certificate again", strings.Join(f.tags, ","), f.cert, scope)})
		}
	}
	if len(probs) > 0 {
		return &config.Error{Problems: probs}
	}
	return nil
}

// extract is the validated extract limits. An agent run by root gives
// every file streamed in the owner its archive names, as a step pod's
// sidecar does; one run by a user writes them as its own (it could not
// give them another owner).
func (f agentFlags) extract() tarsafe.Limits {
	q := resource.MustParse(f.extractSize)
	return tarsafe.Limits{Bytes: q.Value(), Entries: f.extractEntries, Owners: os.Geteuid() == 0}
}

func agentCommand(stderr io.Writer) *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "agent --join HOST:PORT --ca FILE --cert FILE --key FILE --work-dir DIR",
		Short: "Join this machine to the mesh as a worker that runs steps as local processes",
		Long: `agent dials a gateway's mesh listener (no inbound port: NAT is fine) and
becomes one target, named after its certificate (an agent certificate:
gateway mesh issue --agent), of the team and with the tags its
certificate names: gateways take it for what its certificate says,
whatever it announces. Steps placed on it run as processes of this
machine's user, each in a fresh folder under --work-dir; their volumes
are served to the gateways through the tunnel. A gateway registered with
a Concourse web node registers the agent as a worker too, whose tasks run
here the same way (docs/concourse.md). There are no containers: see
docs/agent.md for what isolation an operator gets.`,
		Args: noArgs,
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&f.join, "join", nil, "HOST:PORT of a gateway's mesh listener to dial (repeat for several)")
	fl.StringVar(&f.ca, "ca", "", "the mesh CA's certificate (PEM)")
	fl.StringVar(&f.cert, "cert", "", "this agent's certificate (PEM), from gateway mesh issue --agent")
	fl.StringVar(&f.key, "key", "", "this agent's private key (PEM)")
	fl.StringVar(&f.workDir, "work-dir", "", "folder for the agent's state and its steps' folders")
	fl.StringVar(&f.platform, "platform", runtime.GOOS, "the platform steps ask for to be placed here")
	fl.StringVar(&f.team, "team", "", "the team its certificate names (gateway mesh issue --agent --team), to check it: the certificate decides")
	fl.StringArrayVar(&f.tags, "tag", nil, "a tag its certificate names (repeat), to check them: the certificate decides")
	fl.DurationVar(&f.killGrace, "kill-grace", 10*time.Second, "time between TERM and KILL when a step is aborted or times out")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.extractSize, "extract-max-bytes", "32Gi", "bytes of file contents one archive streamed into a step's volumes may write (a size: 500Mi, 1073741824)")
	fl.IntVar(&f.extractEntries, "extract-max-entries", 1<<20, "files, folders and links one archive streamed into a step's volumes may write")
	fl.StringVar(&f.listen, "listen", "", "HOST:PORT to serve /healthz, /readyz (ready: a session with a gateway) and /metrics on (default: none)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := f.validate(); err != nil {
			return err
		}
		f.teamGiven, f.tagsGiven = fl.Changed("team"), fl.Changed("tag")
		level, _ := config.ParseLogLevel(f.logLevel)
		logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
		ctx, stop := signalContext(cmd.Context(), logger)
		defer stop()
		return runAgent(ctx, f, logger)
	}
	return cmd
}

// runAgent joins the mesh and serves the steps placed on this machine
// until ctx ends, or until the agent retired or was pruned.
func runAgent(ctx context.Context, f agentFlags, logger *slog.Logger) error {
	id, err := mesh.LoadIdentity(f.ca, f.cert, f.key)
	if err != nil {
		return &config.Error{Problems: []config.Problem{{Key: "cert", Message: err.Error()}}}
	}
	scope := id.Scope()
	if err := f.matches(scope); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var node *mesh.Mesh
	ag, err := agent.New(agent.Options{
		Name:      id.Name(),
		WorkDir:   f.workDir,
		Platform:  f.platform,
		Team:      scope.Team,
		Tags:      scope.Tags,
		KillGrace: f.killGrace,
		Extract:   f.extract(),
		Remote: func(ctx context.Context, c streams.Caller, from wire.Endpoint, enc string) (io.ReadCloser, error) {
			return api.MeshVolumes(node, node.Peers)(ctx, c, from, enc)
		},
		Logger: logger.With("component", "agent"),
	})
	if err != nil {
		return &config.Error{Problems: []config.Problem{{Key: "work-dir", Message: err.Error()}}}
	}
	node, err = mesh.New(mesh.Options{
		Identity: id,
		Kind:     mesh.KindAgent,
		Peers:    f.join,
		Local:    ag.Targets(),
		// A retired or pruned agent leaves for good; a stopped one is
		// lost until it returns, as a worker that stopped heartbeating.
		Logger:  logger.With("component", "mesh"),
		Metrics: mesh.NewMetrics(reg),
	})
	if err != nil {
		return &config.Error{Problems: []config.Problem{{Key: "cert", Message: err.Error()}}}
	}
	stepagent.SelfArgs = []string{stepAgentCommandName}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	workDir, err := filepath.Abs(f.workDir) // the web node is given its volumes' paths
	if err != nil {
		return &config.Error{Problems: []config.Problem{{Key: "work-dir", Message: err.Error()}}}
	}
	// The web node's worker this machine is: its volumes and containers,
	// for the gateway that registers it.
	worker := &agent.LocalWorker{Dir: filepath.Join(workDir, "concourse"),
		StepAgent: []string{self, stepAgentCommandName}, Extract: f.extract(),
		Logger: logger.With("component", "concourse")}
	server := api.New(api.Options{
		WorkerVersion: wire.WorkerVersion,
		Gatherer:      reg,
		Targets:       ag.Targets(),
		Lifecycle:     ag,
		Streams:       ag,
		Steps:         ag,
		Mesh:          node,
		// On --listen only /healthz, /readyz, /metrics and /api/v1/info
		// answer: no token opens the rest, which gateways call over the
		// mesh.
		Listen:          f.listen,
		Ready:           func() bool { return len(node.Peers()) > 0 },
		ShutdownTimeout: 5 * time.Second,
		Logger:          logger.With("component", "api"),
	})
	mux := http.NewServeMux()
	mux.Handle(wire.LocalWorkerPath, worker.Handler())
	mux.Handle("/", server.Handler())
	node.SetHTTP(mux)
	logger.Info("starting agent", "version", buildinfo.String(), "name", id.Name(), "join", f.join,
		"platform", f.platform, "scope", scope.String(), "work_dir", f.workDir)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ag.Gone():
			logger.Info("agent retired or pruned: leaving the mesh")
			node.LeaveOnStop()
			cancel()
		case <-ctx.Done():
		}
	}()
	// Stop order: the calls the mesh serves end (those following step
	// events at once, the others answered); then the agent and the web
	// node's worker, whose steps and processes go on.
	first := closer(server.Drain)
	if f.listen != "" {
		first = server // drains as it stops
	}
	err = runAll(ctx, 30*time.Second, first, node, ag, worker)
	if err == nil {
		logger.Info("agent stopped")
	}
	return err
}

// stepAgentCommandName is the hidden subcommand that runs the step agent
// in this binary: what an agent's steps' supervisors are.
const stepAgentCommandName = "step-agent"

// stepAgentCommand is `gateway step-agent COMMAND ...`: the step agent's
// command line (package stepagent/cli) in this binary, which an agent
// runs on its machine: its steps' supervisors (started detached by
// stepagent.Start), and a web node's processes in its containers.
func stepAgentCommand() *cobra.Command {
	return &cobra.Command{
		Use:                stepAgentCommandName + " COMMAND",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			// A supervisor it starts runs this command again.
			stepagent.SelfArgs = []string{stepAgentCommandName}
			if code := cli.Main(args); code != 0 {
				os.Exit(code)
			}
			return nil
		},
	}
}
