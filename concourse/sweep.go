package concourse

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/wire"
)

// Garbage collection is the worker's, as with Concourse's own workers
// (worker/container_sweeper.go, volume_sweeper.go): every SweepInterval
// each registration reports the containers and volumes jetway holds for
// it (report-containers H..., report-volumes H...), asks which to destroy
// (sweep-containers, sweep-volumes) and destroys those, and only those
// jetway made. The web node marks what it does not know for destruction
// at the report, and forgets what was destroyed at the next.

// DefaultSweepInterval is Concourse's own workers' sweep interval.
const DefaultSweepInterval = 30 * time.Second

// commandTimeout bounds one report or sweep command.
const commandTimeout = 30 * time.Second

// kind is containers or volumes: how they are listed and destroyed.
type kind struct {
	name    string // as in the TSA's commands: report-<name>, sweep-<name>
	list    func(ctx context.Context, target string) ([]string, error)
	destroy func(ctx context.Context, target, handle string) error
}

func (r *Registrar) kinds() []kind {
	h := r.opts.Holdings
	return []kind{{"containers", h.Containers, h.DestroyContainer}, {"volumes", h.Volumes, h.DestroyVolume}}
}

// commander runs one-shot commands for a worker: over its registration's
// connection when there is one, else on a connection of their own.
type commander func(ctx context.Context, command string) ([]byte, error)

// sweeps sweeps w's holdings once registered (the registration's event,
// with its commander), then every SweepInterval, until ctx ends.
func (r *Registrar) sweeps(ctx context.Context, w wire.Worker, registered <-chan Event) {
	var e Event
	select {
	case <-ctx.Done():
		return
	case e = <-registered:
	}
	run := commander(e.command)
	if run == nil {
		run = func(ctx context.Context, command string) ([]byte, error) { return r.opts.Web.Command(ctx, command, w) }
	}
	for {
		if err := r.opts.Holdings.Release(ctx, w.Name); err != nil && ctx.Err() == nil {
			r.opts.Logger.Warn("kept containers not released; the next sweep tries again", "target", w.Name, "error", err.Error())
		}
		for _, k := range r.kinds() {
			if err := r.sweep(ctx, w.Name, k, run); err != nil && ctx.Err() == nil {
				r.opts.Logger.Warn("sweep with the web node failed", "target", w.Name, "kind", k.name, "error", err.Error())
			}
		}
		if backoff.Sleep(ctx, r.opts.SweepInterval) != nil {
			return
		}
	}
}

// sweep runs one round for one kind for target: report, ask, destroy.
func (r *Registrar) sweep(ctx context.Context, target string, k kind, run commander) (err error) {
	defer func() { r.opts.Metrics.swept(k.name, err) }()
	command := func(command string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, commandTimeout)
		defer cancel()
		return run(ctx, command)
	}
	handles, err := k.list(ctx, target)
	if err != nil {
		// Not reported: a partial list would tell the web node that
		// what is missing from it is gone.
		err = fmt.Errorf("list %s: %w", k.name, err)
	} else if _, err = command(strings.Join(append([]string{"report-" + k.name}, handles...), " ")); err != nil {
		err = fmt.Errorf("report %s: %w", k.name, err)
	}
	out, cerr := command("sweep-" + k.name)
	if cerr != nil {
		return errors.Join(err, fmt.Errorf("ask which %s to destroy: %w", k.name, cerr))
	}
	var destroy []string
	if cerr := json.Unmarshal(out, &destroy); cerr != nil {
		return errors.Join(err, fmt.Errorf("the web node's %s to destroy: %w", k.name, cerr))
	}
	for _, handle := range destroy {
		derr := k.destroy(ctx, target, handle)
		switch {
		case errors.Is(derr, ErrNotOurs):
			r.opts.Metrics.destroyed(k.name, "not-ours")
			r.opts.Logger.Warn("the web node named something to destroy that jetway did not make", "target", target, "kind", k.name, "error", derr.Error())
		case derr != nil:
			r.opts.Metrics.destroyed(k.name, "error")
			err = errors.Join(err, derr)
		default:
			r.opts.Metrics.destroyed(k.name, "destroyed")
			r.opts.Logger.Info("destroyed what the web node named", "target", target, "kind", k.name, "handle", handle)
		}
	}
	return err
}
