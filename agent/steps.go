package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/tarsafe"
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// record is what the agent keeps of a step beside its folder (record.json),
// so that a restarted agent knows it: the request without its environment
// and stdin, which the step agent has in the folder's spec.
type record struct {
	Caller    streams.Caller  `json:"caller"`
	Team      string          `json:"team,omitempty"`
	Handle    string          `json:"handle"`
	Type      string          `json:"type"`
	Inputs    []wire.Input    `json:"inputs,omitempty"`
	Outputs   []wire.Output   `json:"outputs,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	PlacedAt  time.Time       `json:"placed_at"`
	End       *wire.Event     `json:"end,omitempty"` // set once the step ended
	StartedAt time.Time       `json:"started_at,omitzero"`
	Result    json.RawMessage `json:"result,omitempty"`
}

const recordFile = "record.json"

// step is one step's state, shared by its runner and the API. Every field
// below mu is read and written under it.
type step struct {
	key  key
	pod  string // its folder's name, standing for a pod in views and volumes
	root string // its folder: the step agent's root
	req  wire.Request

	mu   sync.Mutex
	rec  record
	view wire.View
	// logEvents counts the events of the step's log its reader has read:
	// the number of the end event is one (placed) more.
	logEvents int
	changed   chan struct{} // closed and replaced on every change
	abort     chan struct{} // closed by Abort
	aborted   bool
	done      chan struct{} // closed when the runner returned
	forget    time.Time     // when a released step is dropped
	vol       *volumes.Server
	volToken  string         // vol's credential, made with it
	extract   tarsafe.Limits // what one archive streamed into its volumes may write
	uploads   map[string]*upload
	ready     chan struct{} // closed once the folder takes uploads
}

// upload is an input the caller sends.
type upload struct {
	done   chan struct{}
	result wire.InputDigest
	taken  bool
}

func newStep(k key, pod, root string, req wire.Request, rec record, extract tarsafe.Limits) *step {
	s := &step{key: k, pod: pod, root: root, req: req, rec: rec, extract: extract, changed: make(chan struct{}),
		abort: make(chan struct{}), done: make(chan struct{}), ready: make(chan struct{})}
	s.view = wire.View{Handle: rec.Handle, Team: rec.Team, Type: rec.Type, Phase: wire.Starting,
		CreatedAt: rec.CreatedAt, PlacedAt: rec.PlacedAt, Events: 1}
	for _, in := range rec.Inputs {
		if in.From.Upload {
			if s.uploads == nil {
				s.uploads = map[string]*upload{}
			}
			s.uploads[in.Name] = &upload{done: make(chan struct{})}
		}
	}
	return s
}

func (s *step) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *step) snapshot() wire.View {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view
	v.Outputs = append([]wire.Volume(nil), v.Outputs...)
	return v
}

// logged counts the log events the step's reader read up to the log's
// position next (the number of events before it), and one more when e is
// one: the process's start shows in the view.
func (s *step) logged(next int, e *wire.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view.Phase.Final() {
		return
	}
	s.logEvents = next
	if e != nil && e.Type == wire.EventStarted {
		s.view.Phase, s.view.StartedAt, s.rec.StartedAt = wire.Running, e.Time, e.Time
	}
	s.view.Events = 1 + s.logEvents
	s.notify()
}

// finish ends the step with e, its last event (numbered after its log's
// events), and records the end in the step's folder. It reports false if
// the step had ended.
func (s *step) finish(e wire.Event, at time.Time, outputs []wire.Volume) bool {
	s.mu.Lock()
	if s.view.Phase.Final() {
		s.mu.Unlock()
		return false
	}
	if e.Time.IsZero() {
		e.Time = at
	}
	e.N = 1 + s.logEvents
	v := &s.view
	v.Phase, v.ExitStatus, v.Reason, v.Message, v.FinishedAt = e.Phase, e.ExitStatus, e.Reason, e.Message, at
	v.Events, v.Outputs = e.N+1, outputs
	s.rec.End = &e
	rec := s.rec
	s.notify()
	s.mu.Unlock()
	_ = writeRecord(s.root, rec) // best effort: without it a restart ends the step again, from its log
	return true
}

// restore shows a step that ended before the agent restarted as it ended:
// its record holds its end, numbered after its log's events.
func (s *step) restore(end wire.Event, outputs []wire.Volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := &s.view
	v.Phase, v.ExitStatus, v.Reason, v.Message, v.FinishedAt = end.Phase, end.ExitStatus, end.Reason, end.Message, end.Time
	v.StartedAt, v.Events, v.Outputs = s.rec.StartedAt, end.N+1, outputs
	s.logEvents = end.N - 1
	s.notify()
}

// journal is the step as steppod.FollowJournal reads it: placed, its log
// in its folder, its end.
type journal struct{ s *step }

func (j journal) State() ([]wire.Event, bool, *wire.Event, <-chan struct{}, bool) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	head := []wire.Event{{N: 0, Type: wire.EventPlaced, Time: s.rec.PlacedAt, Target: s.view.Target, Pod: s.pod}}
	logged := !s.rec.StartedAt.IsZero() || s.rec.End != nil
	var end *wire.Event
	if s.rec.End != nil {
		e := *s.rec.End
		end = &e
	}
	return head, logged, end, s.changed, true
}

func (j journal) ReadLog(ctx context.Context, base, n int, send func([]wire.Event) error) (int, error) {
	s := j.s
	s.mu.Lock()
	released := s.view.Released
	s.mu.Unlock()
	if released {
		return n, steppod.ErrLogGone
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() {
		pw.CloseWithError(stepagent.TailFrom(ctx, s.root, stepagent.TailOptions{Skip: n - base}, pw))
	})
	defer func() {
		cancel()
		pr.Close()
		wg.Wait()
	}()
	next, err := steppod.ReadEvents(pr, base, n, send, nil)
	if errors.Is(err, os.ErrNotExist) {
		err = steppod.ErrLogGone // its folder went
	}
	return next, err
}

func (s *step) stopVolumes() {
	s.mu.Lock()
	vol := s.vol
	s.vol = nil
	s.mu.Unlock()
	if vol != nil {
		_ = vol.Kill()
	}
}

func writeRecord(root string, rec record) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, recordFile), raw, 0o600)
}

// visible finds the step (team, handle) if caller may see it; another
// team's step is as missing as one that does not exist.
func (a *Agent) visible(caller streams.Caller, team, handle string) (*step, error) {
	if !caller.Admin {
		if team != "" && team != caller.Team {
			return nil, wire.ErrNotFound
		}
		team = caller.Team
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.steps[key{team, handle}]
	if !ok {
		return nil, wire.ErrNotFound
	}
	return s, nil
}

// Submit runs a step on this machine: 202 when new, 200 with the
// existing step when the team has that handle already. The gateway's
// placement chose this agent; it is checked again here, as the agent may
// have landed since.
func (a *Agent) Submit(caller streams.Caller, req wire.Request) (wire.View, bool, error) {
	if ferr := req.Validate(); ferr != nil {
		return wire.View{}, false, ferr
	}
	if !caller.Admin {
		if req.Team != "" && req.Team != caller.Team {
			return wire.View{}, false, wire.ErrForbidden
		}
		req.Team = caller.Team
	}
	if err := a.fits(req); err != nil {
		return wire.View{}, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	k := key{req.Team, req.Handle}
	if s, ok := a.steps[k]; ok {
		return s.snapshot(), false, nil
	}
	if a.ctx == nil {
		return wire.View{}, false, fmt.Errorf("%w: agent %s is starting or stopping", wire.ErrUnavailable, a.opts.Name)
	}
	if a.life.State != targets.StateRunning {
		return wire.View{}, false, fmt.Errorf("%w: agent %s is %s and takes no new step", wire.ErrUnavailable, a.opts.Name, a.life.State)
	}
	s, err := a.create(k, caller, req)
	if err != nil {
		return wire.View{}, false, err
	}
	a.steps[k] = s
	a.notifyLocked()
	a.wg.Go(func() { a.run(a.ctx, s, false) })
	return s.snapshot(), true, nil
}

// fits refuses a step this agent cannot run: a resource step (an agent
// has no resource types, as a Concourse darwin worker has none), or one
// the placement rules keep off it (platform, team, tags).
func (a *Agent) fits(req wire.Request) error {
	if req.Type != selection.StepTask {
		return &wire.FieldError{Field: "type", Msg: fmt.Sprintf("agent %s runs tasks only: it has no resource types", a.opts.Name)}
	}
	me := selection.Candidate{Name: a.opts.Name, State: selection.StateRunning, Team: a.opts.Team,
		Tags: a.opts.Tags, Platform: a.opts.Platform}
	// An agent runs a step as a process of its machine: it has no
	// privileged container to give, so a privileged step is refused
	// here as on a target whose policy does not allow it.
	d := selection.Place(selection.Step{Type: req.Type, Team: req.Team, Tags: req.Tags, Platform: req.Platform, Privileged: req.Privileged},
		[]selection.Candidate{me}, selection.Options{})
	if !d.Compatible {
		return fmt.Errorf("%w: agent %s cannot run this step: %s", wire.ErrUnavailable, a.opts.Name, d.Rejected[a.opts.Name])
	}
	return nil
}

// create makes the step's folder and record. Called with a.mu held.
func (a *Agent) create(k key, caller streams.Caller, req wire.Request) (*step, error) {
	pod := steppod.Name(k.team, k.handle)
	root := filepath.Join(a.opts.WorkDir, stepsDir, pod)
	if err := os.Mkdir(root, 0o700); err != nil {
		return nil, fmt.Errorf("step folder: %w", err)
	}
	now := a.opts.Now().UTC()
	rec := record{Caller: caller, Team: req.Team, Handle: req.Handle, Type: req.Type, Inputs: req.Inputs,
		Outputs: req.Outputs, CreatedAt: now, PlacedAt: now}
	if err := writeRecord(root, rec); err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("step record: %w", err)
	}
	return newStep(k, pod, root, req, rec, a.opts.Extract), nil
}

// Get is the step's view.
func (a *Agent) Get(caller streams.Caller, team, handle string) (wire.View, error) {
	s, err := a.visible(caller, team, handle)
	if err != nil {
		return wire.View{}, err
	}
	return s.snapshot(), nil
}

// Events sends the step's events from since on, following until the step
// has ended or ctx ends.
func (a *Agent) Events(ctx context.Context, caller streams.Caller, team, handle string, since int, send func([]wire.Event) error) error {
	s, err := a.visible(caller, team, handle)
	if err != nil {
		return err
	}
	return steppod.FollowJournal(ctx, journal{s}, since, send)
}

// Readable says whether the step's events from since on can be read:
// those of the log of a released step (its folder is gone) cannot.
func (a *Agent) Readable(caller streams.Caller, team, handle string, since int) error {
	s, err := a.visible(caller, team, handle)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.rec.End; e != nil && s.view.Released && since < e.N && e.N > 1 {
		return fmt.Errorf("%w: step %s was released: the events of its log (1 to %d) went with its folder; its end is event %d",
			wire.ErrGone, handle, e.N-1, e.N)
	}
	return nil
}

// Abort stops a running step (its process gets TERM, then KILL after the
// kill grace) and deletes its folder; on an ended step it deletes the
// folder. It waits up to 45 s for the step's end.
func (a *Agent) Abort(ctx context.Context, caller streams.Caller, team, handle string) (wire.View, error) {
	s, err := a.visible(caller, team, handle)
	if err != nil {
		return wire.View{}, err
	}
	s.mu.Lock()
	if !s.aborted {
		s.aborted = true
		close(s.abort)
	}
	s.mu.Unlock()
	wait := time.NewTimer(45 * time.Second)
	defer wait.Stop()
	select {
	case <-s.done:
	case <-wait.C:
		return s.snapshot(), nil
	case <-ctx.Done():
		return wire.View{}, ctx.Err()
	}
	if err := a.release(s); err != nil {
		return wire.View{}, err
	}
	return s.snapshot(), nil
}

// release deletes an ended step's folder; the step stays visible,
// released, for Retain.
func (a *Agent) release(s *step) error {
	s.stopVolumes()
	if err := os.RemoveAll(s.root); err != nil {
		return fmt.Errorf("release step %s: %w", s.key.handle, err)
	}
	s.mu.Lock()
	s.view.Released = true
	s.forget = a.opts.Now().Add(a.opts.Retain)
	s.notify()
	s.mu.Unlock()
	a.notify()
	return nil
}

// sweep drops released steps past their retention.
func (a *Agent) sweep() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.opts.Now()
	for k, s := range a.steps {
		s.mu.Lock()
		gone := s.view.Released && now.After(s.forget)
		s.mu.Unlock()
		if gone {
			delete(a.steps, k)
		}
	}
}

// Upload streams an input the caller sends into the step's folder, once
// the folder is prepared: at most once per input.
func (a *Agent) Upload(ctx context.Context, caller streams.Caller, team, handle, input, encoding string, body io.Reader) (wire.InputDigest, error) {
	s, err := a.visible(caller, team, handle)
	if err != nil {
		return wire.InputDigest{}, err
	}
	s.mu.Lock()
	u, ok := s.uploads[input]
	switch {
	case !ok:
		s.mu.Unlock()
		return wire.InputDigest{}, fmt.Errorf("%w: step %q uploads no input %q", wire.ErrNotFound, handle, input)
	case u.taken:
		s.mu.Unlock()
		return wire.InputDigest{}, fmt.Errorf("%w: input %q was uploaded already", wire.ErrConflict, input)
	}
	u.taken = true
	s.mu.Unlock()
	select {
	case <-s.ready:
	case <-s.done:
		return wire.InputDigest{}, fmt.Errorf("%w: the step ended before its inputs came", wire.ErrConflict)
	case <-ctx.Done():
		return wire.InputDigest{}, ctx.Err()
	}
	in, err := s.putVolume(ctx, steppod.InputVolume(input), encoding, body)
	in.Name = input
	if err == nil {
		u.result = in
		close(u.done)
	} else {
		s.mu.Lock()
		u.taken = false // the caller may send it again
		s.mu.Unlock()
	}
	return in, err
}

// Download streams an output of an ended step whose folder is kept.
func (a *Agent) Download(ctx context.Context, caller streams.Caller, team, handle, output, encoding string) (io.ReadCloser, error) {
	s, err := a.visible(caller, team, handle)
	if err != nil {
		return nil, err
	}
	v := s.snapshot()
	switch {
	case !v.Phase.Final():
		return nil, fmt.Errorf("%w: step %q is %s", wire.ErrConflict, handle, v.Phase)
	case v.Released:
		return nil, fmt.Errorf("%w: step %q was released", wire.ErrConflict, handle)
	}
	for _, o := range v.Outputs {
		if o.Name == output {
			return s.openVolume(ctx, o.Handle, "", encoding)
		}
	}
	return nil, fmt.Errorf("%w: step %q has no output %q", wire.ErrNotFound, handle, output)
}

var errNoVolumes = errors.New("the step's volumes are not served")
