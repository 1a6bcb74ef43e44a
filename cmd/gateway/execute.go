package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/wire"
)

// exitInterrupted is the status after Ctrl-C aborted the task, as a shell
// reports a process killed by SIGINT.
const exitInterrupted = 130

// exitStatus ends the command with a status of its own, said already.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// executeOptions are gateway execute's flags.
type executeOptions struct {
	api     apiFlags
	config  string
	inputs  []string
	outputs []string
	vars    []string
	tags    []string
	team    string
	// maxOutputSize and maxOutputEntries bound each downloaded output.
	maxOutputSize    string
	maxOutputEntries int
}

// executeCommand is `gateway execute -c task.yml`: run a Concourse task
// config on the best target with local folders as its inputs, as
// `fly execute` does.
func executeCommand() *cobra.Command {
	var o executeOptions
	cmd := &cobra.Command{
		Use:   "execute -c task.yml [-i name=DIR]... [-o name=DIR]...",
		Short: "Run a Concourse task config as a step, with local folders as its inputs, streaming its output (as fly execute)",
		Args:  noArgs,
	}
	o.api.register(cmd)
	f := cmd.Flags()
	f.StringVarP(&o.config, "config", "c", "", "the task config (task.yml)")
	f.StringArrayVarP(&o.inputs, "input", "i", nil, "an input as name=DIR (repeat; a task of one input defaults to the current folder)")
	f.StringArrayVarP(&o.outputs, "output", "o", nil, "download an output into a folder, as name=DIR (repeat)")
	f.StringArrayVarP(&o.vars, "var", "v", nil, "fill ((name)) in the config, as name=value (repeat)")
	f.StringArrayVar(&o.tags, "tag", nil, "a tag the step needs of its target (repeat)")
	f.StringVar(&o.team, "team", "", "the team to run as (a team token: its own)")
	f.StringVar(&o.maxOutputSize, "max-output-size", "32Gi", "bytes of file contents one downloaded output may write (a size: 500Mi, 1073741824); past it the download stops, naming the limit and the file")
	f.IntVar(&o.maxOutputEntries, "max-output-entries", 1<<20, "files, folders and links one downloaded output may write")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return o.run(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	return cmd
}

// downloadLimits reads --max-output-size and --max-output-entries.
func (o *executeOptions) downloadLimits() (client.Limits, error) {
	q, err := resource.ParseQuantity(o.maxOutputSize)
	if err != nil || q.Value() <= 0 {
		return client.Limits{}, usageError{fmt.Errorf("--max-output-size %q: want a positive size like 32Gi or 1073741824", o.maxOutputSize)}
	}
	if o.maxOutputEntries <= 0 {
		return client.Limits{}, usageError{fmt.Errorf("--max-output-entries %d: want a positive number", o.maxOutputEntries)}
	}
	return client.Limits{Bytes: q.Value(), Entries: o.maxOutputEntries}, nil
}

// plan is what execute checked before creating anything.
type plan struct {
	req     wire.Request
	uploads map[string]string // input -> local folder
	outputs map[string]string // output -> local folder
}

func (o *executeOptions) plan(lookupEnv func(string) (string, bool)) (*plan, []string, error) {
	if o.config == "" {
		return nil, nil, usageError{errors.New("-c task.yml is required")}
	}
	raw, err := os.ReadFile(o.config)
	if err != nil {
		return nil, nil, usageError{err}
	}
	vars, err := pairs("-v", o.vars)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := parseTaskConfig(raw, vars)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("%s: %w", o.config, err)}
	}
	given, err := pairs("-i", o.inputs)
	if err != nil {
		return nil, nil, err
	}
	wanted, err := pairs("-o", o.outputs)
	if err != nil {
		return nil, nil, err
	}
	p := &plan{uploads: map[string]string{}, outputs: map[string]string{}}
	var inputNames, outputNames []string
	for _, in := range cfg.Inputs {
		inputNames = append(inputNames, in.Name)
	}
	for _, out := range cfg.Outputs {
		outputNames = append(outputNames, out.Name)
	}
	for name := range given {
		if !slices.Contains(inputNames, name) {
			return nil, nil, usageError{fmt.Errorf("-i %s: the task has no input %q (it has: %s)", name, name, list(inputNames))}
		}
	}
	for name, dir := range wanted {
		if !slices.Contains(outputNames, name) {
			return nil, nil, usageError{fmt.Errorf("-o %s: the task has no output %q (it has: %s)", name, name, list(outputNames))}
		}
		p.outputs[name] = dir
	}
	for _, in := range cfg.Inputs {
		dir, ok := given[in.Name]
		switch {
		case !ok && len(cfg.Inputs) == 1:
			dir = "."
		case !ok && in.Optional:
			continue
		case !ok:
			return nil, nil, usageError{fmt.Errorf("the task needs input %q: give -i %s=DIR", in.Name, in.Name)}
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return nil, nil, usageError{fmt.Errorf("input %s: %s is not a folder", in.Name, dir)}
		}
		p.uploads[in.Name] = dir
		p.req.Inputs = append(p.req.Inputs, wire.Input{Name: in.Name, Path: in.Path, From: wire.InputSource{Upload: true}})
	}
	for _, out := range cfg.Outputs {
		p.req.Outputs = append(p.req.Outputs, wire.Output{Name: out.Name, Path: out.Path})
	}
	p.req.Handle = "execute-" + strings.ToLower(rand.Text()[:12])
	p.req.Type, p.req.Team, p.req.Tags, p.req.Platform = "task", o.team, o.tags, cfg.Platform
	p.req.Image = cfg.image()
	p.req.Run = wire.Run{Path: cfg.Run.Path, Args: cfg.Run.Args, Dir: cfg.Run.Dir, User: cfg.Run.User, Env: cfg.env(lookupEnv)}
	if ferr := p.req.Validate(); ferr != nil {
		return nil, nil, usageError{fmt.Errorf("%s: %w", o.config, ferr)}
	}
	return p, cfg.warnings(), nil
}

// pairs reads name=value flags.
func pairs(flag string, vals []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range vals {
		name, value, ok := strings.Cut(v, "=")
		if !ok || name == "" {
			return nil, usageError{fmt.Errorf("%s %q: want name=value", flag, v)}
		}
		out[name] = value
	}
	return out, nil
}

func list(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// run checks everything, then submits the step, uploads its inputs,
// streams its output, downloads its outputs and releases it. Ctrl-C
// aborts the step.
func (o *executeOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	p, warnings, err := o.plan(os.LookupEnv)
	if err != nil {
		return err
	}
	stderr = &lockedWriter{w: stderr} // the uploads report as the output streams
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	limits, err := o.downloadLimits()
	if err != nil {
		return err
	}
	c, err := client.New(client.Options{URL: o.api.url, Token: o.api.token, Downloads: limits})
	if err != nil {
		return usageError{err}
	}
	v, _, err := c.SubmitStep(ctx, p.req)
	if err != nil {
		return err
	}
	team, handle := v.Team, v.Handle
	// From here on the step exists: whatever happens, it is aborted (a
	// no-op once ended) and its pod released.
	defer func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := c.Abort(actx, team, handle); err != nil {
			fmt.Fprintf(stderr, "jetway: releasing step %s: %v\n", handle, err)
		}
	}()
	fmt.Fprintf(stderr, "executing step %s\n", handle)
	// A failed upload ends the wait at once: the step would wait for it.
	follow, failed := context.WithCancelCause(ctx)
	defer failed(nil)
	uploads := o.upload(follow, c, p, team, handle, stderr, failed)
	defer uploads.Wait()
	err = c.Follow(follow, team, handle, 0, func(e wire.Event) error {
		show(e, stdout, stderr)
		return nil
	})
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "interrupted: aborting the step")
		return exitStatus(exitInterrupted)
	case follow.Err() != nil:
		return context.Cause(follow)
	case err != nil:
		return err
	}
	v, err = c.Step(ctx, team, handle)
	if err != nil {
		return err
	}
	if v.Phase != wire.Succeeded {
		if len(p.outputs) > 0 {
			fmt.Fprintf(stderr, "not downloading outputs: the task %s\n", v.Phase)
		}
		if v.ExitStatus != nil && v.Phase == wire.Failed {
			return exitStatus(*v.ExitStatus)
		}
		return exitStatus(1)
	}
	for name, dir := range p.outputs {
		n, err := c.DownloadOutput(ctx, team, handle, name, dir)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "output %s: %d files into %s\n", name, n, dir)
	}
	return nil
}

// upload sends every input at once, calling failed with the first
// failure.
func (o *executeOptions) upload(ctx context.Context, c *client.Client, p *plan, team, handle string,
	stderr io.Writer, failed context.CancelCauseFunc) *sync.WaitGroup {
	var wg sync.WaitGroup
	for name, dir := range p.uploads {
		wg.Go(func() {
			got, err := c.UploadInput(ctx, team, handle, name, dir)
			switch {
			case err != nil && ctx.Err() == nil:
				failed(fmt.Errorf("uploading input %s from %s: %w", name, dir, err))
			case err == nil:
				fmt.Fprintf(stderr, "uploaded input %s from %s (%d bytes)\n", name, dir, got.Bytes)
			}
		})
	}
	return &wg
}

// show prints an event: the task's output as it is, jetway's own lines
// on stderr.
func show(e wire.Event, stdout, stderr io.Writer) {
	switch e.Type {
	case wire.EventStdout:
		_, _ = stdout.Write(e.Output())
	case wire.EventStderr:
		_, _ = stderr.Write(e.Output())
	case wire.EventWaiting:
		fmt.Fprintf(stderr, "waiting: %s\n", e.Message)
	case wire.EventPlaced:
		fmt.Fprintf(stderr, "placed on %s (pod %s)\n", e.Target, e.Pod)
	case wire.EventFailed:
		fmt.Fprintf(stderr, "%s: %s: %s\n", e.Phase, e.Reason, e.Message)
	}
}

// lockedWriter serializes writes.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
