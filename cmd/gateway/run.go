package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/config"
	"github.com/jetway-ci/jetway/internal/buildinfo"
	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/portforward"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
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
	if cfg.AuthTokensFile != "" {
		var err error
		if tokens, err = api.LoadTokens(cfg.AuthTokensFile); err != nil {
			return &config.Error{Problems: []config.Problem{{Key: "auth-tokens-file", Message: err.Error()}}}
		}
	}
	if cfg.NoAuth {
		logger.Warn("serving the API without authentication (--no-auth): whoever reaches it can see and act on every target")
	}

	registry := targets.NewRegistry(targets.RegistryOptions{
		Interval:    cfg.HealthInterval,
		Timeout:     cfg.HealthTimeout,
		Concurrency: cfg.HealthConcurrency,
		StallAfter:  cfg.StallAfter,
		Logger:      logger.With("component", "targets"),
		Metrics:     targets.NewMetrics(reg),
	})
	controller := lifecycle.New(lifecycle.Options{
		Installation: cfg.Installation,
		Identity:     identity(),
		Registry:     registry,
		LandTimeout:  cfg.LandTimeout,
		GCGrace:      cfg.GCGrace,
		Logger:       logger.With("component", "lifecycle"),
		Metrics:      lifecycle.NewMetrics(reg),
	})
	registry.SetReconciler(controller)
	source := targets.NewSource(targets.SourceOptions{
		Dir:    cfg.TargetsDir,
		Policy: policy(cfg),
		Resync: cfg.TargetsResync,
		Logger: logger.With("component", "targets-source"),
	}, registry.Apply)
	dialer := portforward.New(portforward.Options{
		Resolve: registry.REST,
		Metrics: portforward.NewMetrics(reg),
		Logger:  logger.With("component", "portforward"),
	})
	streamer := streams.New(streams.Options{
		Dialer:    dialer,
		Namespace: registry.Namespace,
		PodIP:     registry.PodIP,
		Logger:    logger.With("component", "streams"),
	})
	defer streamer.Close()
	server := api.New(api.Options{
		Listen:           cfg.Listen,
		ConcourseVersion: cfg.ConcourseVersion,
		WorkerVersion:    config.WorkerVersion,
		Gatherer:         reg,
		Targets:          registry,
		Lifecycle:        controller,
		Streams:          streamer,
		Tokens:           tokens,
		NoAuth:           cfg.NoAuth,
		Ready:            registry.Loaded,
		ShutdownTimeout:  cfg.ShutdownTimeout,
		Logger:           logger.With("component", "api"),
	})
	logger.Info("starting gateway", "version", buildinfo.String(), "listen", cfg.Listen, "targets_dir", cfg.TargetsDir)
	err := runAll(ctx, cfg.ShutdownTimeout, registry, source, dialer, server)
	if err == nil {
		logger.Info("gateway stopped")
	}
	return err
}

// identity names this replica in the Leases that pick who acts on a
// target: host name (the pod name in Kubernetes) and a random suffix, so a
// restarted replica never mistakes its predecessor's lease for its own.
func identity() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%x", host, b)
}

func policy(cfg config.Config) targets.Policy {
	return targets.Policy{
		AllowExecPlugins:   cfg.AllowExecPlugins,
		AllowAuthProviders: cfg.AllowAuthProviders,
		AllowInsecureTLS:   cfg.AllowInsecureTLS,
		AllowExternalFiles: cfg.AllowExternalFiles,
	}
}

// component is anything with a blocking Start, stopped by ending its ctx.
type component interface {
	Start(ctx context.Context) error
}

// runAll runs every component until ctx ends or one fails, then gives them
// all at most timeout to return.
func runAll(ctx context.Context, timeout time.Duration, components ...component) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range components {
		g.Go(func() error { return c.Start(gctx) })
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-gctx.Done():
	}
	// A little over the components' own bound, so theirs fires first.
	grace := timeout + time.Second
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
		return fmt.Errorf("shutdown: components still running after %s", grace)
	}
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
