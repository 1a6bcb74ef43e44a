// Package targets turns a directory of kubeconfigs into a live,
// permission-checked set of targets (Concourse workers): Source reads and
// watches the directory and validates each entry (credential policy,
// metadata); Registry keeps one record per target, checks each on its own
// jittered schedule (readiness, then permission reviews) and hands out
// immutable Status snapshots with Concourse states.
package targets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/internal/kubecount"
	"github.com/jetway-ci/jetway/internal/watchcache"
)

// State is a target's Concourse worker state.
type State string

// Concourse's worker states; only running targets take new work.
const (
	StateRunning  State = "running"
	StateStalled  State = "stalled"
	StateLanding  State = "landing"
	StateLanded   State = "landed"
	StateRetiring State = "retiring"
	// StateRetired is jetway's record of a finished retire: the target is
	// forgotten (listed nowhere) while its kubeconfig is unchanged.
	StateRetired State = "retired"
)

// Lifecycle is an operator's decision about a target (land, retire), as
// recorded in the target cluster. The zero value means none: the target's
// health decides between running and stalled.
type Lifecycle struct {
	State State
	Since time.Time
	// ConfigHash is, for a retired target, the hash of the configuration
	// that was retired.
	ConfigHash string
	// PrunedHash is, for a pruned target, the hash of the configuration
	// that was pruned: the target stays out of every list while it has it.
	PrunedHash string
	// Released is, for a landing, landed or retiring target, when a
	// Concourse web node released its worker (landed or deleted it there,
	// its builds drained): the containers the web node keeps no longer
	// hold the target.
	Released time.Time
}

// Reconciler acts on a target after each health check: the lifecycle
// controller advances the target's recorded lifecycle and collects its
// garbage. What it returns is shown as the target's lifecycle problem until
// a later call returns nil.
type Reconciler interface {
	Reconcile(ctx context.Context, t *Target, h Health) error
}

// Status is an immutable view of one target, what the API serves.
type Status struct {
	Name      string
	Meta      Metadata
	Server    string
	State     State
	StartTime time.Time
	// Error says why the target is not (or may soon not be) usable.
	Error              string
	MissingPermissions []string
	Latency            time.Duration
	ServerVersion      string
	LastCheck          time.Time
	// Holding names the unfinished step pods a landing or retiring target
	// waits for.
	Holding []string
	// Released: a Concourse web node released the worker of this landing,
	// landed or retiring target (Lifecycle.Released).
	Released bool
	// Counts are the live step counts from the target's watch.
	Counts Counts
}

// RegistryOptions configure a Registry.
type RegistryOptions struct {
	// Interval between checks of one target, jittered by ±10%.
	Interval time.Duration
	// Timeout bounds one check.
	Timeout time.Duration
	// Concurrency bounds checks in flight across all targets.
	Concurrency int
	// StallAfter is how many consecutive failed checks stall a running target.
	StallAfter int
	// Required permissions; default Required. A target whose volume
	// holder keeps its volumes on a claim is asked for ClaimPermissions
	// too (RequiredFor).
	Required []Permission
	// HolderStorageClass is the gateway's volume-holder-storage-class:
	// the targets that do not say otherwise keep their holders' volumes
	// on a claim of that class ("": an emptyDir).
	HolderStorageClass string
	Logger             *slog.Logger
	Metrics            *Metrics
	// Now is the clock; default time.Now.
	Now func() time.Time
	// VersionRefresh re-reads the server version of a healthy target this
	// often, so a cluster upgrade shows; default 10m.
	VersionRefresh time.Duration
	// Installation names this installation in the ownership labels the
	// targets' watches select by.
	Installation string
	// LandTimeout is how long landing may take before the status and the
	// log name the step pods still holding the target; 0 never.
	LandTimeout time.Duration
	// UserAgent is what the targets' clients call themselves (in the API
	// servers' audit logs, say): jetway/IDENTITY names the gateway
	// process; default jetway.
	UserAgent string
}

// Registry holds the targets, checks each on its own schedule, and hands
// out snapshots. Source feeds it through Apply.
type Registry struct {
	opts       RegistryOptions
	probe      probe
	watch      func(t *Target, ctx context.Context) // keeps t's cache: (*Target).Run
	sem        chan struct{}
	reconciler Reconciler
	wg         sync.WaitGroup

	changes watchcache.Broadcast // any target's state, configuration, pods or record

	mu      sync.RWMutex
	ctx     context.Context // Start's, parent of every health loop; nil before Start
	records map[string]*record
	loaded  bool // Apply has run once
	stopped bool
}

// probe checks one target once; known is the server version to keep, ""
// to read it again. The registry bounds it with the check timeout.
type probe func(ctx context.Context, t *Target, known string) Health

// record is the registry's mutable state for one target.
type record struct {
	name      string
	cfg       *Config // last good configuration; nil if never valid
	target    *Target // cfg's clients and cache; nil when they cannot be built
	targetErr error   // why target could not be built
	entryErr  error   // what is wrong with the current directory entry
	startTime time.Time
	health    Health
	checked   bool
	failures  int    // consecutive failed checks
	healthy   bool   // anti-flap verdict: false until a check succeeds
	problem   string // of the last reconcile; "" when it succeeded
	overdue   bool   // an overdue landing was logged
	lastState State  // the recorded lifecycle state last logged
	pruned    bool   // hidden until a check succeeds
	stop      context.CancelFunc
}

// NewRegistry builds an empty registry; Start runs it.
func NewRegistry(opts RegistryOptions) *Registry {
	if opts.Required == nil {
		opts.Required = Required
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	if opts.VersionRefresh <= 0 {
		opts.VersionRefresh = 10 * time.Minute
	}
	c := checker{required: opts.Required, holderClass: opts.HolderStorageClass, now: opts.Now}
	r := &Registry{
		opts:    opts,
		probe:   c.check,
		watch:   (*Target).Run,
		sem:     make(chan struct{}, opts.Concurrency),
		records: make(map[string]*record),
	}
	if opts.Metrics != nil {
		opts.Metrics.observeStates(r)
	}
	return r
}

// SetReconciler makes rc run after every health check of a target. Call it
// before Start.
func (r *Registry) SetReconciler(rc Reconciler) { r.reconciler = rc }

// Start runs a health loop per target, for the targets applied before it
// and after, until ctx ends; then it stops them and waits for them.
func (r *Registry) Start(ctx context.Context) error {
	r.mu.Lock()
	if r.stopped || r.ctx != nil {
		r.mu.Unlock()
		return errors.New("registry: Start called twice")
	}
	r.ctx = ctx
	for _, rec := range r.records {
		if rec.cfg != nil {
			r.startLoop(rec)
		}
	}
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.wg.Wait() // every loop's context is a child of ctx
	return nil
}

// Result is what the source read for one target name.
type Result struct {
	Config *Config
	Err    error
}

// Apply makes the registry match the directory: new names are added and
// checked at once, removed names are forgotten, changed configurations
// replace the old ones (state is kept), and an entry that turned invalid
// keeps its last good configuration but stalls with the error.
func (r *Registry) Apply(results map[string]Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.loaded = true
	for name, rec := range r.records {
		if _, ok := results[name]; !ok {
			r.opts.Logger.Info("target removed", "target", name)
			r.stopLoop(rec)
			delete(r.records, name)
		}
	}
	for name, res := range results {
		rec, ok := r.records[name]
		if !ok {
			rec = &record{name: name, startTime: r.opts.Now()}
			r.records[name] = rec
			r.opts.Logger.Info("target added", "target", name)
		}
		if res.Err != nil {
			if rec.entryErr == nil || rec.entryErr.Error() != res.Err.Error() {
				r.opts.Logger.Warn("target entry invalid", "target", name, "error", res.Err.Error(),
					"keeping_last_good", rec.cfg != nil)
				r.opts.Metrics.failed(ReasonInvalid)
			}
			rec.entryErr = res.Err
			continue
		}
		rec.entryErr = nil
		if rec.cfg != nil && rec.cfg.hash == res.Config.hash {
			continue
		}
		if rec.cfg != nil {
			r.opts.Logger.Info("target configuration changed", "target", name)
			r.stopLoop(rec)
		}
		rec.cfg, rec.problem = res.Config, ""
		rec.target, rec.targetErr = newTarget(res.Config, r.opts.Installation, r.opts.UserAgent)
		if rec.target != nil {
			rec.target.pods.OnChange(r.changes.Notify)
			rec.target.record.OnChange(r.changes.Notify)
		}
		r.startLoop(rec)
	}
	r.changes.Notify()
}

// Changed returns a channel closed at the next change of any target: its
// state, its configuration, its step pods or its lifecycle record, and the
// set of targets. Waiters take a new channel after each change.
func (r *Registry) Changed() <-chan struct{} { return r.changes.Wait() }

// startLoop runs rec's health checks until stopLoop; before Start, Start
// runs it. Called with r.mu held.
func (r *Registry) startLoop(rec *record) {
	if r.ctx == nil {
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	rec.stop = cancel
	name, cfg, t, err := rec.name, rec.cfg, rec.target, rec.targetErr
	if t == nil {
		r.wg.Go(func() { r.observe(name, cfg, Health{At: r.opts.Now(), Err: err, Reason: ReasonInvalid}) })
		return
	}
	r.wg.Go(func() { r.watch(t, ctx) })
	r.wg.Go(func() { r.healthLoop(ctx, t) })
}

// stopLoop ends rec's health loop without waiting: its last result is
// discarded because observe checks the configuration it was made with.
func (r *Registry) stopLoop(rec *record) {
	if rec.stop != nil {
		rec.stop()
		rec.stop = nil
	}
}

func (r *Registry) healthLoop(ctx context.Context, t *Target) {
	name, cfg := t.Name(), t.Config
	timer := time.NewTimer(0) // first check at once
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		select {
		case <-ctx.Done():
			return
		case r.sem <- struct{}{}:
		}
		h := r.check(ctx, t)
		<-r.sem
		if ctx.Err() != nil {
			return
		}
		r.observe(name, cfg, h)
		if r.reconciler != nil {
			err := r.reconciler.Reconcile(ctx, t, h)
			if ctx.Err() != nil {
				return
			}
			r.reconciled(name, cfg, err)
		}
		timer.Reset(backoff.Jitter(r.opts.Interval, 0.1))
	}
}

// check runs one bounded check, keeping the known server version unless it
// is older than VersionRefresh.
func (r *Registry) check(ctx context.Context, t *Target) Health {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	known, at := r.knownVersion(t.Name())
	if r.opts.Now().Sub(at) >= r.opts.VersionRefresh {
		known = ""
	}
	h := r.probe(ctx, t, known)
	switch {
	case h.ServerVersion == "":
	case known == "":
		h.VersionAt = h.At
	default:
		h.VersionAt = at
	}
	return h
}

func (r *Registry) knownVersion(name string) (string, time.Time) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if rec, ok := r.records[name]; ok && rec.health.Err == nil {
		return rec.health.ServerVersion, rec.health.VersionAt
	}
	return "", time.Time{}
}

// observe records a check result made with cfg, unless the target has
// since been removed or reconfigured.
func (r *Registry) observe(name string, cfg *Config, h Health) {
	r.opts.Metrics.checked(h)
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[name]
	if !ok || rec.cfg != cfg {
		return
	}
	wasHealthy := rec.healthy
	rec.record(h, r.opts.StallAfter)
	if wasHealthy != rec.healthy {
		r.changes.Notify() // the state may have changed
	}
	if h.OK() && rec.pruned {
		rec.pruned = false
		r.changes.Notify()
		r.opts.Logger.Info("pruned target is back", "target", name)
	}
	switch {
	case wasHealthy && !rec.healthy:
		r.opts.Logger.Warn("target stalled", "target", name, "reason", h.Reason, "error", describe(h))
	case !wasHealthy && rec.healthy:
		r.opts.Logger.Info("target running", "target", name, "server_version", h.ServerVersion)
	}
}

// record applies one check to the anti-flap state: one success makes the
// target healthy, stallAfter consecutive failures make it unhealthy.
func (rec *record) record(h Health, stallAfter int) {
	rec.health, rec.checked = h, true
	if h.OK() {
		rec.failures, rec.healthy = 0, true
		return
	}
	rec.failures++
	if rec.failures >= stallAfter {
		rec.healthy = false
	}
}

// status is the target's view for the API. Called with r.mu held.
func (r *Registry) status(rec *record) Status {
	s := Status{
		Name:          rec.name,
		State:         StateStalled,
		StartTime:     rec.startTime,
		Latency:       rec.health.Latency,
		ServerVersion: rec.health.ServerVersion,
		LastCheck:     rec.health.At,
	}
	if rec.cfg != nil {
		s.Meta, s.Server = rec.cfg.Meta, rec.cfg.Server
	}
	if len(rec.health.Missing) > 0 {
		s.MissingPermissions = missingNames(rec.health.Missing)
	}
	switch {
	case rec.entryErr != nil:
		s.Error = rec.entryErr.Error()
	case !rec.checked:
		s.Error = "not checked yet"
	default:
		s.Error = describe(rec.health)
		if rec.healthy {
			s.State = StateRunning
		}
	}
	if t := rec.target; t != nil {
		s.Counts = t.Counts()
		// Without its cache a target's lifecycle and counts are unknown:
		// it takes no work until its watches have listed once.
		if synced, err := t.Synced(); !synced && s.State == StateRunning {
			s.State = StateStalled
			s.Error = joinErr(s.Error, watchProblem(err))
		}
	}
	if rec.problem != "" {
		s.Error = joinErr(s.Error, "lifecycle: "+rec.problem)
	} else if err := rec.recordProblem(); err != nil {
		s.Error = joinErr(s.Error, "lifecycle: "+err.Error())
	}
	// An operator's decision outlasts health: only running targets stall.
	switch life := rec.recorded(); life.State {
	case StateLanding, StateLanded, StateRetiring:
		s.State, s.Released = life.State, !life.Released.IsZero()
		if life.State == StateLanded {
			break
		}
		s.Holding = rec.target.HoldingBut(s.Released)
		if r.overdue(life) && len(s.Holding) > 0 {
			s.Error = joinErr(s.Error, fmt.Sprintf("still %s since %s: waiting for step pods %s",
				life.State, life.Since.UTC().Format(time.RFC3339), strings.Join(s.Holding, ", ")))
		}
	}
	return s
}

func watchProblem(err error) string {
	if err == nil {
		return "watching step pods and the lifecycle record: not listed yet"
	}
	return "watching step pods and the lifecycle record: " + err.Error()
}

// overdue reports whether a landing has taken longer than the land timeout.
func (r *Registry) overdue(life Lifecycle) bool {
	return life.State == StateLanding && r.opts.LandTimeout > 0 && r.opts.Now().Sub(life.Since) > r.opts.LandTimeout
}

// reconciled records what the reconciler made of a check with cfg.
func (r *Registry) reconciled(name string, cfg *Config, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[name]
	if !ok || rec.cfg != cfg {
		return
	}
	rec.problem = ""
	if err != nil {
		rec.problem = err.Error()
	}
	life := rec.recorded()
	if life.State != rec.lastState {
		r.opts.Logger.Info("target lifecycle", "target", name, "state", string(life.State), "was", string(rec.lastState))
		rec.lastState = life.State
	}
	// A landing that takes too long is logged once, naming what holds it.
	holding := rec.target.Holding()
	overdue := r.overdue(life) && len(holding) > 0
	if overdue && !rec.overdue {
		r.opts.Logger.Warn("landing is taking longer than the land timeout", "target", name,
			"since", life.Since, "pods", holding)
	}
	rec.overdue = overdue
}

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func describe(h Health) string {
	switch {
	case h.Err != nil:
		return h.Err.Error()
	case len(h.Missing) > 0:
		return "missing permissions: " + strings.Join(missingNames(h.Missing), ", ")
	}
	return ""
}

// Loaded reports whether the targets directory has been read once.
func (r *Registry) Loaded() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.loaded
}

// Snapshot returns every target's status, sorted by name.
func (r *Registry) Snapshot() []Status {
	r.mu.RLock()
	out := make([]Status, 0, len(r.records))
	for _, rec := range r.records {
		if !rec.hidden() {
			out = append(out, r.status(rec))
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// eachRequests calls f with each listed target's request counts, in no
// order.
func (r *Registry) eachRequests(f func(target string, c *kubecount.Counts)) {
	r.mu.RLock()
	type counted struct {
		name string
		c    *kubecount.Counts
	}
	var all []counted
	for name, rec := range r.records {
		if !rec.hidden() && rec.target != nil {
			all = append(all, counted{name, rec.target.requests})
		}
	}
	r.mu.RUnlock()
	for _, t := range all {
		f(t.name, t.c)
	}
}

// Get returns one target's status, or ErrNotFound.
func (r *Registry) Get(name string) (Status, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.records[name]
	if !ok || rec.hidden() {
		return Status{}, ErrNotFound
	}
	return r.status(rec), nil
}

// Target returns a target's clients and cache, for components that act on
// it; ErrInvalidEntry (with the reason) when it has none.
func (r *Registry) Target(name string) (*Target, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.records[name]
	switch {
	case !ok:
		return nil, ErrNotFound
	case rec.cfg == nil:
		return nil, errors.Join(ErrInvalidEntry, rec.entryErr)
	case rec.target == nil:
		return nil, errors.Join(ErrInvalidEntry, rec.targetErr)
	}
	return rec.target, nil
}

// AgentServer is what an agent's target lists as its server: an agent
// (`gateway agent`) has no API server, and agent://NAME says where it is.
func AgentServer(name string) string { return agentScheme + name }

// IsAgent reports whether st is an agent's target: a machine that runs
// tasks as local processes, with no resource types.
func IsAgent(st Status) bool { return strings.HasPrefix(st.Server, agentScheme) }

const agentScheme = "agent://"
