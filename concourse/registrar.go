package concourse

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Targets are the targets a Registrar registers (the targets registry).
type Targets interface {
	Snapshot() []targets.Status
	Changed() <-chan struct{}
}

// Lifecycle lands a target in jetway (the lifecycle controller): what the
// web node landing or retiring its worker does; and records that the web
// node released a landing or retiring target's worker, so that the
// containers it keeps hold the target no longer.
type Lifecycle interface {
	Land(ctx context.Context, name string) error
	Release(ctx context.Context, name string) error
}

// Registration states, as /api/v1/targets shows them.
const (
	// StateRegistering: connecting, or forward-worker sent and the TSA has
	// not said "registered" yet.
	StateRegistering = "registering"
	// StateRunning: registered, the TSA heartbeating it.
	StateRunning = "running"
	// StateLanded: the web node ended the registration (it landed or
	// retired the worker); the target is landed in jetway, and registered
	// again once resumed.
	StateLanded = "landed"
	// StateFailing: the last try failed (Error says why); tried again
	// with backoff.
	StateFailing = "failing"
)

// Registration is a target's registration with the web node.
type Registration struct {
	State         string    `json:"state"`
	Since         time.Time `json:"since"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	Error         string    `json:"error,omitempty"`
}

// Options configure a Registrar.
type Options struct {
	// Web is how the web node is reached: its TSA (TSA), or its REST API.
	Web     Web
	Targets Targets
	// Registers reports whether this gateway registers the installation's
	// targets now: of replicas sharing targets, exactly one does (the
	// placer Lease's holder). nil: always.
	Registers func() bool
	Lifecycle Lifecycle
	// Agents are the targets of the agents joined to this gateway (over
	// the mesh): this gateway registers them whatever Registers says, as
	// an agent is joined to one gateway. An agent gone from the list (it
	// left, or joined another gateway) is no longer registered here, and
	// not deleted from the web node: it stalls there unless registered
	// again. nil: none.
	Agents func() []targets.Status
	// LandAgent lands an agent's target (the web node landed its worker).
	LandAgent func(ctx context.Context, name string) error
	// WebURL is the web node's URL, if known: its worker version is read
	// there before registering (a web node registers workers of another
	// version and never uses them). Empty: not checked.
	WebURL string
	// WorkerVersion is the version the workers register with; default
	// WorkerVersion.
	WorkerVersion string
	// Holdings are the containers and volumes jetway holds for the web
	// node; nil: none.
	Holdings Holdings
	// VolumeAPI serves a worker's volume API (Holder.API); nil: the
	// volumes are listed from Holdings, and nothing else is served.
	VolumeAPI func(target string) http.Handler
	// Containers are the web node's containers on cluster targets; nil:
	// Garden lists the containers Holdings hold, and runs none.
	Containers *Containers
	// Drain bounds how long a stop waits, once the registrations ended,
	// for the processes the web node still follows through this gateway
	// (their connections outlive a REST registration's listeners): a
	// build's running step finishes across a graceful restart. 0: no
	// wait.
	Drain time.Duration
	// SweepInterval is how often each registration runs the garbage
	// collection rounds with the web node; default DefaultSweepInterval.
	SweepInterval time.Duration
	// ResourceTypes are the base resource types every worker offers.
	ResourceTypes []wire.ResourceType
	// RetryMin and RetryMax bound the backoff between failed tries of one
	// target's registration; default 1 s and 1 min.
	RetryMin, RetryMax time.Duration
	Logger             *slog.Logger
	Metrics            *Metrics
}

// Web is how a Registrar reaches the web node: through its TSA (TSA, what
// Concourse's own workers do) or its REST API.
type Web interface {
	// Forward registers w and keeps it registered, the web node reaching
	// its Garden and volume APIs served by garden and baggageclaim. on is
	// called with each event. It returns nil when the web node ended the
	// registration (it landed or retired the worker), ctx's error when ctx
	// ended, else why the registration broke.
	Forward(ctx context.Context, w wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error
	// Command runs one of the TSA's one-shot commands for w (land-worker,
	// retire-worker, delete-worker, report-containers H...,
	// sweep-containers, report-volumes H..., sweep-volumes) and returns
	// its output: for the sweeps, a JSON list of the handles to destroy.
	Command(ctx context.Context, command string, w wire.Worker) ([]byte, error)
}

// Registrar keeps every running target this gateway registers registered
// with the web node, one SSH session each, and tells the web node when a
// target lands, retires or goes.
type Registrar struct {
	opts    Options
	version *versionCheck // nil: not checked

	mu       sync.Mutex
	regs     map[string]Registration
	sessions map[string]*session // by target, while it should be registered
	// landed are the targets whose registration the web node ended, until
	// jetway's target leaves running (it was landed) or goes, or, for an
	// agent, runs since another time than then (it was landed and resumed
	// between two looks).
	landed map[string]time.Time
	// sweepers end the sweeps of workers the web node released while
	// jetway still holds containers of them (landedSweeps).
	sweepers map[string]context.CancelFunc
	// since is when each agent entered its state, as it announces it (its
	// LastCheck).
	since map[string]time.Time
	// was is each target's last state seen, to tell the web node of a
	// change once.
	was map[string]targets.State
	// agents are the agents' targets at the last reconcile.
	agents map[string]bool
	// known are the targets the web node has registered here: it has a
	// worker of each, until it is deleted there.
	known map[string]bool
	wg    sync.WaitGroup
}

type session struct {
	worker wire.Worker // r.mu: its state follows the target's
	cancel context.CancelFunc
}

// New makes a Registrar; Start runs it.
func New(opts Options) *Registrar {
	if opts.RetryMin <= 0 {
		opts.RetryMin = time.Second
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Holdings == nil {
		opts.Holdings = none{}
	}
	if opts.VolumeAPI == nil {
		opts.VolumeAPI = func(target string) http.Handler { return volumeAPI(target, opts.Holdings) }
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	if opts.WorkerVersion == "" {
		opts.WorkerVersion = wire.WorkerVersion
	}
	if opts.Registers == nil {
		opts.Registers = func() bool { return true }
	}
	var version *versionCheck
	if opts.WebURL != "" {
		version = &versionCheck{url: opts.WebURL, have: opts.WorkerVersion, client: &http.Client{}}
	}
	return &Registrar{opts: opts, version: version, regs: map[string]Registration{}, sessions: map[string]*session{},
		landed: map[string]time.Time{}, since: map[string]time.Time{}, known: map[string]bool{}, was: map[string]targets.State{},
		sweepers: map[string]context.CancelFunc{}}
}

// Registration is target name's registration, if it has one. A nil
// Registrar has none.
func (r *Registrar) Registration(name string) (Registration, bool) {
	if r == nil {
		return Registration{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	reg, ok := r.regs[name]
	return reg, ok
}

// Start registers the targets until ctx ends, then closes every session
// (the web node stalls the workers unless another gateway registers them)
// and returns once they are closed.
func (r *Registrar) Start(ctx context.Context) error {
	// Whether this gateway registers can change without a target's
	// change: look again every few seconds.
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	defer func() {
		r.mu.Lock()
		for _, s := range r.sessions {
			s.cancel()
		}
		for _, stop := range r.sweepers {
			stop()
		}
		r.mu.Unlock()
		r.wg.Wait()
		r.drain()
	}()
	for {
		changed := r.opts.Targets.Changed()
		r.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// drain waits, at most Drain, for the processes the web node follows
// through this gateway to end.
func (r *Registrar) drain() {
	if r.opts.Containers == nil || r.opts.Drain <= 0 {
		return
	}
	n := r.opts.Containers.Following()
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.Drain)
	defer cancel()
	start := time.Now()
	r.opts.Logger.Info("waiting for the processes the web node follows through this gateway", "processes", n, "within", r.opts.Drain)
	if left := r.opts.Containers.Drain(ctx); left > 0 {
		r.opts.Logger.Warn("stopping while the web node still follows processes: their steps error", "processes", left)
		return
	}
	r.opts.Logger.Info("the processes the web node followed ended", "after", time.Since(start).Round(time.Millisecond))
}

// reconcile starts a session for each running target to register, ends
// the others', and tells the web node of targets that landed, retired or
// went.
func (r *Registrar) reconcile(ctx context.Context) {
	registers := r.opts.Registers()
	snap := r.opts.Targets.Snapshot()
	agents := map[string]bool{}
	if r.opts.Agents != nil {
		for _, st := range r.opts.Agents() {
			agents[st.Name] = true
			snap = append(snap, st)
		}
	}
	seen := map[string]targets.State{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range snap {
		registers := registers || agents[st.Name]
		seen[st.Name] = st.State
		if agents[st.Name] {
			r.since[st.Name] = st.LastCheck
		}
		if at, ok := r.landed[st.Name]; ok && (st.State != targets.StateRunning || agents[st.Name] && !st.LastCheck.Equal(at)) {
			delete(r.landed, st.Name) // landed here now: registered again once resumed
		}
		w := r.worker(st)
		s, registered := r.sessions[st.Name]
		_, landed := r.landed[st.Name]
		landedThere := r.regs[st.Name].State == StateLanded
		// A landing or retiring target stays registered until the web
		// node drained and released its worker, so its running builds
		// keep the worker's APIs, as a stock worker's do.
		draining := (st.State == targets.StateLanding || st.State == targets.StateRetiring) &&
			!st.Released && !landedThere && !agents[st.Name]
		want := registers && (st.State == targets.StateRunning || draining) && !landed
		switch {
		case want && registered && !sameWorker(s.worker, w):
			s.cancel() // what it tells the web node changed: register anew
			r.start(ctx, w)
		case want && registered:
			s.worker.State = w.State // a registration made again says it is landing or retiring
		case want && !registered:
			r.start(ctx, w)
		case !want && registered:
			s.cancel()
			delete(r.sessions, st.Name)
			if !landedThere {
				delete(r.regs, st.Name)
			}
		}
		if registers && r.was[st.Name] != st.State {
			r.tell(ctx, w, r.was[st.Name], st.State, landedThere)
		}
		sweepLanded := registers && !want && !agents[st.Name] && st.Released &&
			(st.State == targets.StateLanding || st.State == targets.StateLanded)
		switch stop, sweeping := r.sweepers[st.Name]; {
		case sweepLanded && !sweeping:
			sctx, cancel := context.WithCancel(ctx)
			r.sweepers[st.Name] = cancel
			r.wg.Go(func() { r.landedSweeps(sctx, w) })
		case !sweepLanded && sweeping:
			stop()
			delete(r.sweepers, st.Name)
		}
	}
	for name, stop := range r.sweepers {
		if _, ok := seen[name]; !ok {
			stop()
			delete(r.sweepers, name)
		}
	}
	for name, s := range r.sessions {
		if _, ok := seen[name]; !ok {
			s.cancel()
			delete(r.sessions, name)
		}
	}
	for name := range r.was {
		if _, ok := seen[name]; ok {
			continue
		}
		// Gone: a target the web node has a worker of is deleted there,
		// landed or not; an agent gone is only no longer registered here.
		if registers && r.known[name] && !r.agents[name] {
			r.tell(ctx, wire.Worker{Name: name, Version: r.opts.WorkerVersion}, r.was[name], "", false)
		}
		delete(r.regs, name)
		delete(r.since, name)
		delete(r.landed, name)
		delete(r.known, name)
	}
	r.was, r.agents = seen, agents
	r.opts.Metrics.set(r.regs)
}

// forgetContainers forgets the container records of target, whose
// worker the web node deleted: it forgot their handles with it. Their
// pods went with a retired target's objects, or with a target gone from
// the directory, out of jetway's reach.
func (r *Registrar) forgetContainers(ctx context.Context, target string) {
	if r.opts.Containers == nil || r.opts.Containers.Records == nil {
		return
	}
	n, err := r.opts.Containers.Records.Forget(ctx, target)
	if err != nil {
		r.opts.Logger.Warn("could not forget the containers of a worker the web node deleted", "target", target, "error", err.Error())
		return
	}
	if n > 0 {
		r.opts.Logger.Info("forgot the containers of a worker the web node deleted", "target", target, "containers", n)
	}
}

// tell tells the web node of a target's move from was to now (""; gone):
// landing lands the worker, retiring retires it, a target gone deletes
// it. A target first seen, or moving to or from running, stalled or an
// error, needs no word (its registration, or its end, says it). A worker
// the web node landed (landedThere) is landed already, and cannot be
// retired there (it has no address, which a retiring worker must have):
// retiring deletes it.
func (r *Registrar) tell(ctx context.Context, w wire.Worker, was, now targets.State, landedThere bool) {
	if was == "" {
		return // first seen: whatever it is, the web node learns it from the registration
	}
	var command string
	switch now {
	case targets.StateLanding, targets.StateLanded:
		if was != targets.StateLanding && was != targets.StateLanded && !landedThere {
			command = "land-worker"
		}
	case targets.StateRetiring, targets.StateRetired:
		if was != targets.StateRetiring && was != targets.StateRetired {
			command = "retire-worker"
			if landedThere {
				command = "delete-worker"
			}
		}
	case "":
		if was != targets.StateRetiring && was != targets.StateRetired {
			command = "delete-worker" // a retired one is gone there already
		}
	}
	if command == "" {
		return
	}
	r.wg.Go(func() {
		wait := r.opts.RetryMin
		for attempt := 1; ; attempt++ {
			_, err := r.opts.Web.Command(ctx, command, w)
			r.opts.Metrics.command(command, err)
			if err == nil {
				r.opts.Logger.Info("told the web node", "target", w.Name, "command", command)
				if command == "delete-worker" {
					r.forgetContainers(ctx, w.Name)
				}
				return
			}
			if ctx.Err() != nil || attempt == 5 {
				r.opts.Logger.Warn("could not tell the web node", "target", w.Name, "command", command, "error", err.Error())
				return
			}
			if backoff.Sleep(ctx, wait) != nil {
				return
			}
			wait = min(2*wait, r.opts.RetryMax)
		}
	})
}

// worker is a target's worker, as registered.
func (r *Registrar) worker(st targets.Status) wire.Worker {
	platform := st.Meta.Platform
	if platform == "" {
		platform = "linux"
	}
	types := r.opts.ResourceTypes
	if targets.IsAgent(st) {
		// An agent runs no image, so no base type's: as Concourse's
		// darwin workers, it offers none, and the web node places its
		// checks, gets and puts elsewhere.
		types = nil
	}
	cw := st.Meta.Concourse
	var state string // a running worker's is the web node's to keep
	switch st.State {
	case targets.StateLanding, targets.StateRetiring:
		state = string(st.State)
	}
	w := wire.Worker{State: state, Name: st.Name, Team: st.Meta.Team, Tags: slices.Clone(st.Meta.Tags), Platform: platform,
		Version: r.opts.WorkerVersion, StartTime: st.StartTime.Unix(), ResourceTypes: types,
		GardenAddr: gardenForward, BaggageclaimURL: "http://" + baggageclaimForward,
		Ephemeral: cw.Ephemeral, HTTPProxyURL: cw.HTTPProxy, HTTPSProxyURL: cw.HTTPSProxy, NoProxy: cw.NoProxy}
	if cw.Certs != "" && !targets.IsAgent(st) {
		w.CertsPath = new(CertsPath)
	}
	return w
}

// sameWorker reports whether a registration of a is one of b: anything
// else it tells the web node but its state is registered again.
func sameWorker(a, b wire.Worker) bool {
	return a.Name == b.Name && a.Team == b.Team && a.Platform == b.Platform && slices.Equal(a.Tags, b.Tags) &&
		a.Ephemeral == b.Ephemeral && a.HTTPProxyURL == b.HTTPProxyURL && a.HTTPSProxyURL == b.HTTPSProxyURL && a.NoProxy == b.NoProxy &&
		(a.CertsPath == nil) == (b.CertsPath == nil)
}

// start starts a session registering w. r.mu is held.
func (r *Registrar) start(ctx context.Context, w wire.Worker) {
	sctx, cancel := context.WithCancel(ctx)
	s := &session{worker: w, cancel: cancel}
	r.sessions[w.Name] = s
	r.regs[w.Name] = Registration{State: StateRegistering, Since: time.Now()}
	r.wg.Go(func() { r.keep(sctx, s) })
}

// keep keeps w registered until ctx ends or the web node ends its
// registration.
func (r *Registrar) keep(ctx context.Context, s *session) {
	r.mu.Lock()
	w := s.worker
	r.mu.Unlock()
	log := r.opts.Logger.With("target", w.Name)
	wait := r.opts.RetryMin
	for {
		r.mu.Lock()
		w = s.worker // landing or retiring now, if the target is
		r.mu.Unlock()
		r.update(w.Name, func(reg *Registration) { reg.State, reg.Since = StateRegistering, time.Now() })
		start := time.Now()
		registered := make(chan Event, 1)
		var once sync.Once
		if err := r.version.check(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			r.failed(log, w.Name, err, wait)
			if backoff.Sleep(ctx, wait) != nil {
				return
			}
			wait = min(2*wait, r.opts.RetryMax)
			continue
		}
		sctx, stopSweeps := context.WithCancel(ctx)
		var sweeps sync.WaitGroup
		sweeps.Go(func() { r.sweeps(sctx, w, registered) })
		garden := logCalls(log, "garden", gardenAPI(w.Name, r.opts.Holdings, r.opts.Containers, r.opts.Metrics))
		err := r.forward(ctx, s, w, garden, logCalls(log, "volumes", r.opts.VolumeAPI(w.Name)), func(e Event) {
			switch e.Type {
			case "rebalanced":
				log.Info("registered again through another TSA (rebalance): the one before drains", "from", e.From, "to", e.To)
				r.opts.Metrics.rebalance("ok")
				return
			case "rebalance-failed":
				log.Warn("a rebalance failed: the registration stays where it is", "error", e.Err.Error())
				r.opts.Metrics.rebalance("error")
				return
			case "registered":
				once.Do(func() { registered <- e })
				log.Info("registered with the web node")
				r.mu.Lock()
				r.known[w.Name] = true
				r.mu.Unlock()
				r.update(w.Name, func(reg *Registration) {
					reg.State, reg.Since, reg.Error, reg.LastHeartbeat = StateRunning, time.Now(), "", time.Now()
				})
			case "heartbeated":
				r.opts.Metrics.heartbeat()
				r.update(w.Name, func(reg *Registration) { reg.LastHeartbeat = time.Now() })
			}
		})
		stopSweeps()
		sweeps.Wait()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			r.released(ctx, s, log)
			return
		}
		r.failed(log, w.Name, err, wait)
		if time.Since(start) > 5*time.Minute {
			wait = r.opts.RetryMin // it held a while: not a persistent failure
		}
		if backoff.Sleep(ctx, wait) != nil {
			return
		}
		wait = min(2*wait, r.opts.RetryMax)
	}
}

// liveForwarder is a Web whose registrations are made again while they
// last (TSA's rebalance), each time of the worker as it is then.
type liveForwarder interface {
	ForwardLive(ctx context.Context, w func() wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error
}

// forward is Web.Forward of session s's worker w, which it reads anew for
// each registration made again where the Web makes some.
func (r *Registrar) forward(ctx context.Context, s *session, w wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error {
	lf, ok := r.opts.Web.(liveForwarder)
	if !ok {
		return r.opts.Web.Forward(ctx, w, garden, baggageclaim, on)
	}
	return lf.ForwardLive(ctx, func() wire.Worker {
		r.mu.Lock()
		defer r.mu.Unlock()
		return s.worker
	}, garden, baggageclaim, on)
}

// released follows the web node's end of session s's registration: it
// landed or deleted the worker, its builds drained. A running target is
// landed here too (the web node landed it first); a landing or retiring
// one goes on. Either is released (Lifecycle.Release), so that the
// containers the web node keeps hold it no longer; a retiring one's
// containers went with the worker there, so their records are forgotten.
// It is registered again only once resumed.
func (r *Registrar) released(ctx context.Context, s *session, log *slog.Logger) {
	r.mu.Lock()
	name, was := s.worker.Name, r.was[s.worker.Name]
	r.landed[name] = r.since[name]
	if r.sessions[name] == s {
		delete(r.sessions, name) // ended: once resumed, a new one registers it
	}
	agent := r.agents[name]
	r.mu.Unlock()
	log.Info("the web node ended the worker's registration (landed or retired)", "target_state", string(was))
	r.update(name, func(reg *Registration) { reg.State, reg.Since, reg.Error = StateLanded, time.Now(), "" })
	defer s.cancel()
	switch {
	case agent:
		if r.opts.LandAgent != nil {
			if err := r.opts.LandAgent(ctx, name); err != nil && ctx.Err() == nil {
				log.Warn("agent not landed after the web node landed its worker", "error", err.Error())
			}
		}
		return
	case r.opts.Lifecycle == nil:
		return
	}
	if was != targets.StateLanding && was != targets.StateRetiring {
		if err := r.opts.Lifecycle.Land(ctx, name); err != nil && ctx.Err() == nil {
			log.Warn("target not landed after the web node landed its worker", "error", err.Error())
		}
	}
	if err := r.opts.Lifecycle.Release(ctx, name); err != nil && ctx.Err() == nil {
		log.Warn("target not released after the web node released its worker: the containers the web node keeps hold it", "error", err.Error())
	}
	if was == targets.StateRetiring {
		r.forgetContainers(ctx, name)
	}
}

// failed says why a try of target's registration failed.
func (r *Registrar) failed(log *slog.Logger, target string, err error, wait time.Duration) {
	r.opts.Metrics.failed()
	log.Warn("registration with the web node failed", "error", err.Error(), "retry_in", wait.String())
	r.update(target, func(reg *Registration) { reg.State, reg.Since, reg.Error = StateFailing, time.Now(), err.Error() })
}

// update changes a target's registration, if it still has one.
func (r *Registrar) update(name string, change func(*Registration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg, ok := r.regs[name]
	if !ok {
		return
	}
	change(&reg)
	r.regs[name] = reg
	r.opts.Metrics.set(r.regs)
}

// Registrations are every target's registration.
func (r *Registrar) Registrations() map[string]Registration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.regs)
}
