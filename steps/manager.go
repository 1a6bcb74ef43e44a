// Package steps runs steps as pods: it places each step on a target
// (selection, with the targets' live counts and the steps it placed whose
// pods the watch has not shown yet), makes its pod, streams its inputs in
// (streams), runs its process through the step agent (stepagent) over
// pods/exec, turns the agent's log into the step's events, and ends the
// step with its exit status or with Kubernetes' reason why it could not
// run. Every step's state is recoverable from its pod: a restarted
// gateway re-attaches to the steps it finds and replays their events.
package steps

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
)

// Errors of the step API.
var (
	// ErrNotFound: no such step that the caller may see.
	ErrNotFound = errors.New("step not found")
	// ErrForbidden: a team token acting for another team.
	ErrForbidden = errors.New("a team token acts only for its own team")
	// ErrUnavailable: steps are not accepted now; the error says why.
	ErrUnavailable = errors.New("steps are not accepted now")
	// ErrInput: an input names a step output that cannot be used.
	ErrInput = errors.New("input not available")
	// ErrConflict: an upload or download the step's state does not allow
	// (an input uploaded already, an output of a step still running).
	ErrConflict = errors.New("conflict")
)

// errNotRunning: the manager is starting (reading back its steps' pods)
// or stopping.
var errNotRunning = fmt.Errorf("%w: the gateway is starting or stopping", ErrUnavailable)

// Registry is what the manager reads of the targets.
type Registry interface {
	// Loaded reports whether the targets directory was read once.
	Loaded() bool
	Snapshot() []targets.Status
	Target(name string) (*targets.Target, error)
	Changed() <-chan struct{}
}

// Streamer copies volumes between pods: the streams package.
type Streamer interface {
	Stream(ctx context.Context, req streams.Request, progress *streams.Progress) (streams.Result, error)
	PutVolume(ctx context.Context, to streams.Endpoint, encoding string, body io.Reader) error
	OpenVolume(ctx context.Context, from streams.Endpoint, encoding string) (io.ReadCloser, error)
}

// Options configure a Manager.
type Options struct {
	Registry  Registry
	Streamer  Streamer
	Placement PlacementOptions
	Pod       PodOptions
	// ImagePullGrace is how long an image pull refused for a passing
	// reason (a rate limit, a registry's 5xx) may go on before it fails
	// the step; default 2m.
	ImagePullGrace time.Duration
	// KillGrace is the time between TERM and KILL when a step is aborted
	// or times out; default 10s.
	KillGrace time.Duration
	// Retain is how long an ended step whose pod is gone stays visible;
	// default 10m.
	Retain time.Duration
	// SandboxTTL is how long an idle check sandbox is kept; default
	// DefaultSandboxTTL.
	SandboxTTL time.Duration
	// ResourceDir is where resource images keep their check, in and out
	// scripts; default DefaultResourceDir.
	ResourceDir string
	// Exec runs agent commands in step pods, and ExecStream a sandbox's
	// session; default pods/exec.
	Exec       Exec
	ExecStream ExecStream
	Logger     *slog.Logger
	Metrics    *Metrics
	Now        func() time.Time
}

// Manager holds every step this gateway runs or has recovered.
type Manager struct {
	opts Options

	mu       sync.Mutex
	ctx      context.Context // Start's; nil before and after
	steps    map[key]*step
	pending  []*step                      // in submission order
	reserved map[string]map[string]string // target -> pod -> step type, until the watch shows the pod
	scanned  map[*targets.Target]bool     // targets whose pods were adopted
	// recovered is set once the step pods of every target were adopted
	// (or recoverTimeout passed): until then a handle not known may be in
	// a pod not read yet, so the API answers 503, never 404, and takes no
	// new step (it might be a second one of a handle).
	recovered   bool
	recoveredCh chan struct{} // closed when recovered is set
	started     time.Time
	sandboxes   map[sandboxKey][]*sandbox
	kick        chan struct{}
	wg          sync.WaitGroup // runners
}

// New builds a Manager; Start runs it.
func New(opts Options) *Manager {
	opts.ImagePullGrace = cmp.Or(opts.ImagePullGrace, 2*time.Minute)
	opts.KillGrace = cmp.Or(opts.KillGrace, 10*time.Second)
	opts.Retain = cmp.Or(opts.Retain, 10*time.Minute)
	opts.ResourceDir = cmp.Or(opts.ResourceDir, DefaultResourceDir)
	opts.SandboxTTL = cmp.Or(opts.SandboxTTL, DefaultSandboxTTL)
	if opts.Exec == nil {
		opts.Exec = execPod
	}
	if opts.ExecStream == nil {
		opts.ExecStream = ExecPod
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Manager{opts: opts, steps: map[key]*step{}, reserved: map[string]map[string]string{},
		scanned: map[*targets.Target]bool{}, sandboxes: map[sandboxKey][]*sandbox{}, kick: make(chan struct{}, 1), recoveredCh: make(chan struct{})}
}

// Start places pending steps whenever a target may have room (the
// registry says when anything changed: a pod, a state, a target), adopts
// the step pods it finds, and returns once ctx ends and every runner has
// returned. Steps keep running in their pods meanwhile; the next start
// re-attaches to them.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("steps: Start called twice")
	}
	m.ctx, m.started = ctx, m.opts.Now()
	m.mu.Unlock()
	sweep := time.NewTicker(min(time.Minute, m.opts.SandboxTTL/4))
	defer sweep.Stop()
	recovering := time.NewTicker(time.Second) // until recovered
	defer recovering.Stop()
	for {
		changed := m.opts.Registry.Changed()
		if m.adopt() {
			recovering.Stop()
		}
		m.place()
		m.tendSandboxes()
		select {
		case <-ctx.Done():
			m.wg.Wait()
			return nil
		case <-changed:
		case <-m.kick:
		case <-sweep.C:
			m.sweep() // retention and idle sandboxes: no need on every pod change
			m.tendSandboxes()
		case <-recovering.C:
		}
	}
}

// recoverTimeout bounds how long a start waits for unreachable targets'
// step pods before it takes steps again.
const recoverTimeout = 30 * time.Second

func (m *Manager) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Recovered is closed once a start has found the steps in its targets'
// pods (see recovered): from then on the API takes steps.
func (m *Manager) Recovered() <-chan struct{} { return m.recoveredCh }

// running reports whether Start runs.
func (m *Manager) running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ctx != nil && m.ctx.Err() == nil
}

// Caller is who calls: an admin, or a team.
type Caller = streams.Caller

// visible finds the step (team, handle) if caller may see it.
func (m *Manager) visible(caller Caller, team, handle string) (*step, error) {
	if !caller.Admin {
		if team != "" && team != caller.Team {
			return nil, ErrNotFound // the same answer as for a missing step
		}
		team = caller.Team
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.steps[key{team, handle}]
	switch {
	case !ok && !m.recovered:
		return nil, errNotRunning
	case !ok:
		return nil, ErrNotFound
	}
	return s, nil
}

// Submit accepts a step: it is placed now or as soon as a target has room.
// The same handle again (within the team) returns the existing step and
// false.
func (m *Manager) Submit(caller Caller, req Request) (View, bool, error) {
	if !m.running() {
		return View{}, false, errNotRunning
	}
	if ferr := req.Validate(); ferr != nil {
		return View{}, false, ferr
	}
	if strings.TrimSpace(req.Image) == "" {
		return View{}, false, fieldErr("image", "required: a step on a cluster runs in a container of this image")
	}
	if !caller.Admin {
		if req.Team != "" && req.Team != caller.Team {
			return View{}, false, ErrForbidden
		}
		req.Team = caller.Team
	}
	if req.Resource != nil {
		req.resourceRun(m.opts.ResourceDir)
	}
	k := key{req.Team, req.Handle}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.steps[k]; ok {
		return s.snapshot(), false, nil
	}
	if !m.recovered {
		return View{}, false, errNotRunning
	}
	if err := m.resolveInputs(&req); err != nil {
		return View{}, false, err
	}
	s := newStep(k, req, callerLabel{Admin: caller.Admin}, m.opts.Now().UTC())
	m.steps[k] = s
	m.pending = append(m.pending, s)
	m.opts.Metrics.submitted(req.Type)
	m.wake()
	return s.snapshot(), true, nil
}

// resolveInputs turns {step, output} inputs into the pod volumes holding
// them. Called with m.mu held.
func (m *Manager) resolveInputs(req *Request) error {
	for i := range req.Inputs {
		from := &req.Inputs[i].From
		if from.Step == "" {
			continue
		}
		field := fmt.Sprintf("inputs[%d].from", i)
		src, ok := m.steps[key{req.Team, from.Step}]
		if !ok {
			return fmt.Errorf("%w: %s: step %q not found", ErrInput, field, from.Step)
		}
		got, err := src.snapshot().OutputSource(field, from.Output)
		if err != nil {
			return err
		}
		*from = got
	}
	return nil
}

// Get returns a step's view.
func (m *Manager) Get(caller Caller, team, handle string) (View, error) {
	s, err := m.visible(caller, team, handle)
	if err != nil {
		return View{}, err
	}
	return s.snapshot(), nil
}

// Events calls send with the step's events from since on, as they come,
// until the step has ended and all were sent, ctx ends or send fails.
func (m *Manager) Events(ctx context.Context, caller Caller, team, handle string, since int, send func([]Event) error) error {
	s, err := m.visible(caller, team, handle)
	if err != nil {
		return err
	}
	return Follow(ctx, since, s.eventsFrom, send)
}

// Follow sends a step's events from since on, in batches, until the step
// has ended or ctx ends: how a step's Events are served, on a cluster or
// on an agent. from returns the events from n on, whether the step has
// ended with them, and a channel closed at the next change.
func Follow(ctx context.Context, since int, from func(n int) ([]Event, bool, <-chan struct{}), send func([]Event) error) error {
	for {
		evs, ended, changed := from(since)
		if len(evs) > 0 {
			if err := send(evs); err != nil {
				return err
			}
			since = evs[len(evs)-1].N + 1
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Abort kills the step's process (the step ends aborted, unless it ended
// before) and releases its pod, and with it its outputs. It waits, within
// ctx, for both.
func (m *Manager) Abort(ctx context.Context, caller Caller, team, handle string) (View, error) {
	s, err := m.visible(caller, team, handle)
	if err != nil {
		return View{}, err
	}
	s.mu.Lock()
	first := !s.aborted
	s.aborted = true
	s.mu.Unlock()
	if first {
		close(s.abort)
	}
	if m.unqueue(s) {
		s.finish(Event{Type: EventFailed, Phase: Aborted, Reason: "aborted", Message: "aborted before it was placed"}, m.opts.Now().UTC())
		m.ended(s)
		close(s.done)
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return s.snapshot(), ctx.Err()
	}
	if err := m.release(ctx, s); err != nil {
		return s.snapshot(), err
	}
	return s.snapshot(), nil
}

// unqueue takes a pending step out of the queue, reporting whether it was
// there (and so has no runner).
func (m *Manager) unqueue(s *step) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, p := range m.pending {
		if p == s {
			m.pending = append(m.pending[:i], m.pending[i+1:]...)
			return true
		}
	}
	return false
}

// ended records a step's end in the metrics.
func (m *Manager) ended(s *step) {
	v := s.snapshot()
	m.opts.Metrics.finished(v.Type, v.Phase)
}

// sweep marks released the ended steps whose pods are gone (deleted by
// the lifecycle's garbage collection, a sync, or by hand) and forgets
// released steps past their retention.
func (m *Manager) sweep() {
	now := m.opts.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, s := range m.steps {
		v := s.snapshot()
		if v.Phase.Final() && v.Pod != "" && !v.Released && m.podGone(v.Target, v.Pod) {
			m.released(s)
		}
		s.mu.Lock()
		drop := !s.forget.IsZero() && now.After(s.forget)
		s.mu.Unlock()
		if drop {
			delete(m.steps, k)
		}
	}
}

// podGone reports whether a target's synced watch no longer shows a pod.
func (m *Manager) podGone(target, pod string) bool {
	t, err := m.opts.Registry.Target(target)
	if err != nil {
		return true
	}
	ok, _ := t.Synced()
	return ok && t.CachedPod(pod) == nil
}
