// Package agent is a mesh member without Kubernetes: one machine (a Mac
// under a desk, say) that dials out to a gateway, is one target, runs the
// steps placed on it as local processes in folders of its work dir, and
// serves their volumes through the tunnel. It speaks to the gateways
// with the same HTTP API a gateway serves (api.Server over the mesh):
// this package is that API's targets, lifecycle, steps and streams for
// one machine.
//
// It is also the web node's worker the machine is (LocalWorker, beside
// the API on the mesh): a gateway registers the agent with a Concourse
// web node, passes on its volume calls and turns its Garden calls into
// the local worker's (package concourse), which answers with folders for
// containers, a volume server for volumes and runs of the step agent for
// processes. The two sides share only the calls written down in wire
// (wire.LocalWorkerPath).
//
// A step runs as in a step pod: the step agent (stepagent) prepares its
// folder, a detached supervisor runs the process and writes its log and
// status, and the agent reads the log from an offset. So a step outlives
// a dropped tunnel and the agent's own restart; the restarted agent
// reads its steps back from the work dir.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/targets"
)

// Options configure an Agent.
type Options struct {
	// Name is the agent's mesh name, which is its target's name.
	Name string
	// WorkDir holds the agent's state and one folder per step.
	WorkDir string
	// Platform, Team and Tags are the target's, as placement reads them.
	Platform string
	Team     string
	Tags     []string
	// KillGrace is the time between TERM and KILL when a step is aborted
	// or times out; default 10s.
	KillGrace time.Duration
	// Retain is how long an ended step whose folder is gone stays
	// visible; default 10m.
	Retain time.Duration
	// Extract bounds what one archive streamed into a step's volumes may
	// write (zero fields: tarsafe's defaults).
	Extract tarsafe.Limits
	// Remote opens the inputs other mesh members own; nil: only uploads
	// and this agent's own volumes can be inputs.
	Remote Remote
	Logger *slog.Logger
	Now    func() time.Time
}

// Agent is one machine's target and the steps it runs.
type Agent struct {
	opts    Options
	started time.Time

	mu      sync.Mutex
	begun   bool            // Start has begun, and not yet returned
	ctx     context.Context // Start's once it takes steps; nil before and after
	life    lifeState
	steps   map[key]*step
	changed chan struct{} // closed and replaced on any change of the target
	gone    chan struct{} // closed once the agent retired or was pruned
	wg      sync.WaitGroup
}

// key identifies a step: handles are unique within a team.
type key struct{ team, handle string }

// New builds an Agent; Start runs it.
func New(opts Options) (*Agent, error) {
	opts.KillGrace = cmp.Or(opts.KillGrace, 10*time.Second)
	opts.Retain = cmp.Or(opts.Retain, 10*time.Minute)
	opts.Platform = cmp.Or(opts.Platform, targets.DefaultPlatform)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Name == "" || opts.WorkDir == "" {
		return nil, errors.New("agent: a name and a work dir are required")
	}
	dir, err := filepath.Abs(opts.WorkDir)
	if err != nil {
		return nil, fmt.Errorf("agent: work dir: %w", err)
	}
	opts.WorkDir = dir
	if err := os.MkdirAll(filepath.Join(dir, stepsDir), 0o700); err != nil {
		return nil, fmt.Errorf("agent: work dir: %w", err)
	}
	life, err := readLife(dir)
	if err != nil {
		return nil, err
	}
	return &Agent{opts: opts, started: opts.Now(), life: life, steps: map[key]*step{},
		changed: make(chan struct{}), gone: make(chan struct{})}, nil
}

// stepsDir is the folder of the work dir holding one folder per step.
const stepsDir = "steps"

// Start reads back the steps of the work dir (re-attaching to those still
// running, replaying those that ended), takes new steps until ctx ends,
// then returns once every step's reader has stopped. The steps' processes
// go on; the next start reads them back.
func (a *Agent) Start(ctx context.Context) error {
	a.mu.Lock()
	if a.begun {
		a.mu.Unlock()
		return errors.New("agent: already started")
	}
	a.begun = true
	a.mu.Unlock()
	// The steps are read back before the agent takes any: a step
	// submitted meanwhile could have its folder read back as a restarted
	// agent's, and run twice.
	a.adopt(ctx)
	a.mu.Lock()
	a.ctx = ctx
	a.notifyLocked()
	a.mu.Unlock()
	sweep := time.NewTicker(10 * time.Second)
	defer sweep.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-sweep.C:
			a.sweep()
		}
	}
	a.mu.Lock()
	a.ctx = nil
	a.mu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.begun = false
	for _, s := range a.steps {
		s.stopVolumes()
	}
	return nil
}

// Gone is closed once the agent retired or was pruned: its target is
// forgotten, and the process should leave the mesh and exit.
func (a *Agent) Gone() <-chan struct{} { return a.gone }

// Targets is the agent's target as the mesh announces it and the API
// lists it (mesh.Local, api.Targets).
type Targets struct{ a *Agent }

// Targets returns the agent's target list.
func (a *Agent) Targets() Targets { return Targets{a} }

// Snapshot is the agent's target: none once it retired or was pruned.
func (t Targets) Snapshot() []targets.Status {
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.life.State == stateGone {
		return nil
	}
	return []targets.Status{a.statusLocked()}
}

func (a *Agent) statusLocked() targets.Status {
	st := targets.Status{
		Name:      a.opts.Name,
		Meta:      targets.Metadata{Team: a.opts.Team, Tags: slices.Clone(a.opts.Tags), Platform: a.opts.Platform},
		Server:    targets.AgentServer(a.opts.Name),
		State:     a.life.State,
		StartTime: a.started,
		LastCheck: a.life.Since,
	}
	for _, s := range a.steps {
		v := s.snapshot()
		if !v.Released {
			st.Counts.ActiveVolumes++
		}
		if !v.Phase.Final() {
			st.Counts.ActiveContainers++
			st.Counts.BuildContainers++
			st.Counts.ActiveTasks++
			st.Holding = append(st.Holding, v.Pod)
		}
	}
	slices.Sort(st.Holding)
	return st
}

// Changed is closed at the next change of the target (its state, its
// counts).
func (t Targets) Changed() <-chan struct{} {
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// notifyLocked wakes the readers of Changed. Called with a.mu held.
func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

func (a *Agent) notify() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notifyLocked()
}

// Get is the agent's target by name.
func (t Targets) Get(name string) (targets.Status, error) {
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if name != a.opts.Name || a.life.State == stateGone {
		return targets.Status{}, fmt.Errorf("%w: %s", targets.ErrNotFound, name)
	}
	return a.statusLocked(), nil
}

// Find is Get: an agent that was pruned has left.
func (t Targets) Find(name string) (targets.Status, error) { return t.Get(name) }
