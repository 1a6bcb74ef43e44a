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
		run = r.ownCommander(w)
	}
	for {
		r.round(ctx, w.Name, run)
		if backoff.Sleep(ctx, r.opts.SweepInterval) != nil {
			return
		}
	}
}

// ownCommander runs w's commands on connections of their own.
func (r *Registrar) ownCommander(w wire.Worker) commander {
	return func(ctx context.Context, command string) ([]byte, error) { return r.opts.Web.Command(ctx, command, w) }
}

// round releases target's kept containers that hold nothing, then sweeps
// each kind with the web node (run); it reports whether every sweep went.
func (r *Registrar) round(ctx context.Context, target string, run commander) bool {
	if err := r.opts.Holdings.Release(ctx, target); err != nil && ctx.Err() == nil {
		r.opts.Logger.Warn("kept containers not released; the next sweep tries again", "target", target, "error", err.Error())
	}
	ok := true
	for _, k := range r.kinds() {
		if err := r.sweep(ctx, target, k, run); err != nil && ctx.Err() == nil {
			ok = false
			r.opts.Logger.Warn("sweep with the web node failed", "target", target, "kind", k.name, "error", err.Error())
		}
	}
	return ok
}

// maxLandedFailures is how many rounds in a row a released worker's
// sweeps may fail before they stop: the web node deleted the worker
// (fly retire-worker or prune-worker, which jetway cannot tell from a
// landing through the TSA), and takes no report of it.
const maxLandedFailures = 3

// landedSweeps goes on sweeping w, whose registration the web node ended
// once it drained the worker, while jetway holds containers of it: the
// web node keeps some (a check's until its check session ends, a failed
// build's until another build replaces it) and destroys them as it
// releases them, as with a stock worker's sweeps, which go on while it is
// landed. They run on connections of their own, until no container is
// left, the target runs again, or the web node takes no report of w.
func (r *Registrar) landedSweeps(ctx context.Context, w wire.Worker) {
	run, failed := r.ownCommander(w), 0
	for {
		held, err := r.opts.Holdings.Containers(ctx, w.Name)
		if err == nil && len(held) == 0 {
			r.opts.Logger.Info("a landed worker holds no container: its sweeps end", "target", w.Name)
			return
		}
		if r.round(ctx, w.Name, run) {
			failed = 0
		} else if failed++; failed == maxLandedFailures && ctx.Err() == nil {
			r.opts.Logger.Warn("a landed worker's sweeps fail: they end, and its containers' pods stay until the target is resumed or retired",
				"target", w.Name, "rounds", failed)
			return
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
