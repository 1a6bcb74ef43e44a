// Package steps runs steps as pods, on any number of gateways at once.
// Its parts, in the order a step meets them:
//
//   - records (record.go, store.go): every step is a record in the
//     installation's state namespace from its submission on: the request,
//     and a status that says where it is. A 202 is that record made.
//   - ownership (owners.go): each step has one owner, the gateway that
//     drives it, named in its record and its pod; gateways keep Leases.
//   - the queue (placer.go, elector.go): one gateway of the installation,
//     the holder of the placer Lease, places the waiting steps first come,
//     first served, over a selection.Pool fed by the targets' watches, so
//     limits hold across gateways; it keeps the check sandboxes
//     (sandbox.go).
//   - the keeper (reconcile.go, conclude.go): each gateway's part for the
//     steps it owns. It takes over the steps whose owner's Lease lapsed,
//     runs a runner for each placed one, and finishes the ended ones
//     (their pods marked ended or deleted, their releases).
//   - runners (runner.go, follow.go, watch.go, conclude.go): a runner
//     makes its step's pod, streams its inputs in, runs its process
//     through the step agent (stepagent) over pods/exec, or a session into
//     a check sandbox (session.go), and ends it with its exit status or
//     Kubernetes' reason; every move is recorded first, so a runner killed
//     at any line is continued by the step's next owner.
//   - the event log (events.go): a step's events are its record's head
//     (waiting, placed, scheduled), the frames of the agent's log in its
//     pod, read by position, and its end. Any gateway serves them, with
//     the same numbers, after any restart; a runner keeps a small tail of
//     recent ones for its followers, nothing more.
//   - uploads and downloads (transfer.go), by any gateway.
//
// Manager is what the API calls: it checks the caller, reads and writes
// the records, and starts and stops the parts.
package steps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// errNotRunning: the manager is starting (reading the records) or
// stopping.
var errNotRunning = fmt.Errorf("%w: the gateway is starting or stopping", wire.ErrUnavailable)

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
	Stream(ctx context.Context, req streams.Request, progress *streams.Progress) (wire.StreamResult, error)
	PutVolume(ctx context.Context, to wire.Endpoint, encoding string, body io.Reader) error
	OpenVolume(ctx context.Context, from wire.Endpoint, encoding string) (io.ReadCloser, error)
}

// Ownership is what the manager reads of the gateways' Leases: Owners.
type Ownership interface {
	Me() string
	Alive(id string) bool
	Valid() bool
	Synced() bool
	Changed() <-chan struct{}
}

// Options configure a Manager.
type Options struct {
	Registry Registry
	Streamer Streamer
	// Records keep the steps; nil refuses every step (503), naming
	// Unavailable.
	Records Records
	// Owners and Leader are this gateway's part in the installation's
	// ownership and placement (Owners, Elector).
	Owners Ownership
	Leader Leadership
	// Unavailable says why Records is nil.
	Unavailable string
	// Elsewhere lists the targets other members of the mesh own (nil:
	// none), for a waiting step to name why each refuses it, as gateway
	// place does; steps are placed on this gateway's own targets.
	Elsewhere func() []targets.Status
	Placement PlacementOptions
	Pod       steppod.Options
	// ImagePullGrace is how long an image pull refused for a passing
	// reason (a rate limit, a registry's 5xx) may go on before it fails
	// the step; default 2m.
	ImagePullGrace time.Duration
	// KillGrace is the time between TERM and KILL when a step is aborted
	// or times out; default 10s.
	KillGrace time.Duration
	// Retain is how long a released step stays visible, and a check's log
	// in its sandbox after its end; default 10m.
	Retain time.Duration
	// TargetGoneGrace is how long a step's target may be missing from the
	// targets directory before the step ends; default
	// DefaultTargetGoneGrace.
	TargetGoneGrace time.Duration
	// GCGrace is how long an ended step's kept pod (its outputs, its log)
	// stays before its owner deletes it, unless released before; default
	// 10m, as the lifecycle's gc-grace.
	GCGrace time.Duration
	// SandboxTTL is how long an idle check sandbox is kept; default
	// DefaultSandboxTTL.
	SandboxTTL time.Duration
	// ResourceDir is where resource images keep their check, in and out
	// scripts; default DefaultResourceDir.
	ResourceDir string
	// Exec runs agent commands in step pods, and ExecStream a sandbox's
	// session; default pods/exec.
	Exec       steppod.Exec
	ExecStream steppod.ExecStream
	Logger     *slog.Logger
	Metrics    *Metrics
	Now        func() time.Time
}

// gateway is what every part of the engine reads: the options, and this
// gateway's identity, which owns steps and pods. It does not change after
// New.
type gateway struct {
	opts Options
	me   string
}

// Manager is this gateway's step engine: the API's entry, over the parts
// that place (placer), own and run (keeper, runners), and read (eventLog)
// steps.
type Manager struct {
	*gateway
	placer   *placer
	keeper   *keeper
	events   *eventLog
	sessions *sessions

	mu  sync.Mutex
	ctx context.Context // Start's; nil before
}

// New builds a Manager; Start runs it.
func New(opts Options) *Manager {
	opts.ImagePullGrace = cmp.Or(opts.ImagePullGrace, 2*time.Minute)
	opts.KillGrace = cmp.Or(opts.KillGrace, 10*time.Second)
	opts.Retain = cmp.Or(opts.Retain, 10*time.Minute)
	opts.TargetGoneGrace = cmp.Or(opts.TargetGoneGrace, DefaultTargetGoneGrace)
	opts.GCGrace = cmp.Or(opts.GCGrace, 10*time.Minute)
	opts.ResourceDir = cmp.Or(opts.ResourceDir, DefaultResourceDir)
	opts.SandboxTTL = cmp.Or(opts.SandboxTTL, DefaultSandboxTTL)
	if opts.Exec == nil {
		opts.Exec = steppod.ExecBytes
	}
	if opts.ExecStream == nil {
		opts.ExecStream = steppod.ExecPod
	}
	// Every exec of the engine's goes only to a pod jetway made (steppod.TrustedPod).
	opts.Exec, opts.ExecStream = steppod.TrustedExec(opts.Pod.Key, opts.Exec), steppod.TrustedExecStream(opts.Pod.Key, opts.ExecStream)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	g := &gateway{opts: opts}
	if opts.Owners != nil {
		g.me = opts.Owners.Me()
	}
	m := &Manager{gateway: g, events: newEventLog(g), sessions: newSessions(g)}
	m.placer = newPlacer(g, m.sessions)
	m.keeper = newKeeper(g, m.events, m.sessions)
	return m
}

// Start runs the manager until ctx ends: it takes over the steps of
// gateways gone, drives the steps this gateway owns, and, while it holds
// the placer Lease, places the waiting ones. When ctx ends it returns once
// every part has; the steps go on in their pods, and whoever owns them
// next continues them.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("steps: Start called twice")
	}
	m.ctx = ctx
	m.mu.Unlock()
	if m.opts.Records == nil {
		m.opts.Logger.Warn("steps are refused: " + m.opts.Unavailable)
		<-ctx.Done()
		return nil
	}
	m.sessions.start(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { m.placer.run(ctx) })
	m.keeper.run(ctx) // returns once its runners have: nothing opens a session after
	wg.Wait()
	m.sessions.wait()
	return nil
}

// Ready says whether the manager takes steps (its records are read and
// its Lease renewed), and if not why.
func (m *Manager) Ready() error {
	if m.opts.Records == nil {
		return fmt.Errorf("%w: %s", wire.ErrUnavailable, m.opts.Unavailable)
	}
	m.mu.Lock()
	started := m.ctx != nil && m.ctx.Err() == nil
	m.mu.Unlock()
	if !started {
		return errNotRunning
	}
	if ok, err := m.opts.Records.Synced(); !ok {
		msg := "the step records are not read yet"
		if err != nil {
			msg += ": " + err.Error()
		}
		return fmt.Errorf("%w: %s", wire.ErrUnavailable, msg)
	}
	if !m.opts.Owners.Valid() {
		return fmt.Errorf("%w: this gateway cannot renew its lease in the state namespace", wire.ErrUnavailable)
	}
	if k := m.opts.Pod.Key; k.Ready() != nil && k.IsZero() {
		return fmt.Errorf("%w: the installation's pod key is not read from the state namespace yet", wire.ErrUnavailable)
	}
	return nil
}

// Owned reports whether a step pod has a live owner of this
// installation, which deletes it itself gc-grace after its step ended:
// the lifecycle's garbage collection leaves it alone.
func (m *Manager) Owned(p *corev1.Pod) bool {
	owner := p.Labels[ownership.OwnerLabel]
	return owner != "" && m.opts.Owners != nil && m.opts.Owners.Synced() && m.opts.Owners.Alive(owner)
}

// Caller is who calls: an admin, or a team.
type Caller = streams.Caller

// visible finds the record of step (team, handle) if caller may see it.
func (m *Manager) visible(caller Caller, team, handle string) (*Record, error) {
	if !caller.Admin {
		if team != "" && team != caller.Team {
			return nil, wire.ErrNotFound // the same answer as for a missing step
		}
		team = caller.Team
	}
	if err := m.Ready(); err != nil {
		return nil, err
	}
	r, ok := m.opts.Records.Get(RecordName(m.opts.Pod.Installation, team, handle))
	if !ok {
		return nil, wire.ErrNotFound
	}
	return r, nil
}

// Submit accepts a step: its record is made, and it is placed now or as
// soon as a target has room, by whichever gateway places. The same handle
// again (within the team) returns the existing step and false.
func (m *Manager) Submit(caller Caller, req wire.Request) (wire.View, bool, error) {
	if ferr := req.Validate(); ferr != nil {
		return wire.View{}, false, ferr
	}
	if strings.TrimSpace(req.Image) == "" {
		return wire.View{}, false, &wire.FieldError{Field: "image", Msg: "required: a step on a cluster runs in a container of this image"}
	}
	if !caller.Admin {
		if req.Team != "" && req.Team != caller.Team {
			return wire.View{}, false, wire.ErrForbidden
		}
		req.Team = caller.Team
	}
	if err := m.Ready(); err != nil {
		return wire.View{}, false, err
	}
	if r, ok := m.opts.Records.Get(RecordName(m.opts.Pod.Installation, req.Team, req.Handle)); ok {
		return m.view(r), false, nil
	}
	if req.Resource != nil {
		resourceRun(&req, m.opts.ResourceDir)
	}
	if err := m.resolveInputs(&req); err != nil {
		return wire.View{}, false, err
	}
	raw, _ := json.Marshal(req)
	sum := summaryOf(req, caller.Admin, m.opts.Now())
	ctx, cancel := context.WithTimeout(m.ctxOrBackground(), storeTimeout)
	defer cancel()
	r, created, err := m.opts.Records.Create(ctx, sum, Status{Owner: m.me}, raw)
	if err != nil {
		return wire.View{}, false, err
	}
	if created {
		m.opts.Metrics.submitted(req.Type)
		m.placer.wake()
	}
	return m.view(r), created, nil
}

func (m *Manager) ctxOrBackground() context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx != nil {
		return m.ctx
	}
	return context.Background()
}

// resolveInputs turns {step, output} inputs into the pod volumes holding
// them.
func (m *Manager) resolveInputs(req *wire.Request) error {
	for i := range req.Inputs {
		from := &req.Inputs[i].From
		if from.Step == "" {
			continue
		}
		field := fmt.Sprintf("inputs[%d].from", i)
		src, ok := m.opts.Records.Get(RecordName(m.opts.Pod.Installation, req.Team, from.Step))
		if !ok {
			return fmt.Errorf("%w: %s: step %q not found", wire.ErrInput, field, from.Step)
		}
		got, err := src.View().OutputSource(field, from.Output)
		if err != nil {
			return err
		}
		*from = got
	}
	return nil
}

// view is a step's view, with what this gateway knows beyond its record:
// the events of a step it runs, and a resource step's answer.
func (m *Manager) view(r *Record) wire.View {
	v := r.View()
	if t := m.events.tail(r.Name); t != nil && !r.Ended() {
		v.Events = max(v.Events, t.count())
	}
	if r.Summary.Resource && v.Phase == wire.Succeeded {
		ctx, cancel := context.WithTimeout(m.ctxOrBackground(), storeTimeout)
		defer cancel()
		if res, err := m.opts.Records.Result(ctx, r.Name); err == nil {
			v.Result = res
		}
	}
	return v
}

// Get returns a step's view.
func (m *Manager) Get(caller Caller, team, handle string) (wire.View, error) {
	r, err := m.visible(caller, team, handle)
	if err != nil {
		return wire.View{}, err
	}
	return m.view(r), nil
}

// Events calls send with the step's events from since on, as they come,
// until the step has ended and all were sent, ctx ends or send fails.
func (m *Manager) Events(ctx context.Context, caller Caller, team, handle string, since int, send func([]wire.Event) error) error {
	r, err := m.visible(caller, team, handle)
	if err != nil {
		return err
	}
	return m.events.follow(ctx, r.Name, since, send)
}

// Readable says whether the step's events from since on can be read:
// those of the log of a step whose pod is gone cannot (ErrGone).
func (m *Manager) Readable(caller Caller, team, handle string, since int) error {
	r, err := m.visible(caller, team, handle)
	if err != nil {
		return err
	}
	end, ended := r.EndEvent()
	head, _ := r.Head()
	if ended && !r.Status.Released.IsZero() && since < end.N && since < len(head)+r.Status.End.LogEvents && r.Status.End.LogEvents > 0 {
		return fmt.Errorf("%w: step %s was released: the events of its log (%d to %d) went with its pod; its end is event %d",
			wire.ErrGone, handle, len(head), end.N-1, end.N)
	}
	return nil
}

// abortWaitPoll bounds how long Abort waits between looks at the record.
const abortWaitPoll = time.Second

// Abort asks for the step's release: a step not placed yet ends aborted
// at once; a running one's process is killed (it ends aborted) and its pod
// deleted, with its outputs, by its owner. It waits, within ctx, for the
// release.
func (m *Manager) Abort(ctx context.Context, caller Caller, team, handle string) (wire.View, error) {
	r, err := m.visible(caller, team, handle)
	if err != nil {
		return wire.View{}, err
	}
	now := m.opts.Now().UTC()
	r, err = m.opts.Records.Update(ctx, r.Name, func(r *Record) error {
		st := &r.Status
		switch {
		case !st.Released.IsZero() || st.Release:
			return errUnchanged
		case st.Placed == nil && st.End == nil:
			st.End = &End{Phase: wire.Aborted, Reason: "aborted", Message: "aborted before it was placed", At: now}
			st.Released, st.WaitingNow = now, ""
		default:
			st.Release = true
		}
		return nil
	})
	if err != nil {
		return wire.View{}, err
	}
	if r.Status.End != nil && r.Status.Placed == nil {
		m.opts.Metrics.finished(r.Summary.Type, wire.Aborted)
	}
	m.keeper.wake()
	for {
		if r.Status.Released.After(time.Time{}) {
			return m.view(r), nil
		}
		changed := m.opts.Records.Changed()
		select {
		case <-ctx.Done():
			return m.view(r), ctx.Err()
		case <-changed:
		case <-time.After(abortWaitPoll):
		}
		var ok bool
		if r, ok = m.opts.Records.Get(r.Name); !ok {
			return wire.View{}, wire.ErrNotFound
		}
	}
}
