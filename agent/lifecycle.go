package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jetway-ci/jetway/internal/atomicfile"
	"github.com/jetway-ci/jetway/lifecycle"
	"github.com/jetway-ci/jetway/targets"
)

// lifeState is the agent's lifecycle, kept in the work dir's state.json
// so that a restarted agent comes back landed if it was landed.
type lifeState struct {
	State targets.State `json:"state"`
	Since time.Time     `json:"since"`
}

// stateGone is an agent retired or pruned: it announces no target, and
// its process leaves the mesh. Never written to state.json.
const stateGone targets.State = "gone"

const stateFile = "state.json"

func readLife(dir string) (lifeState, error) {
	raw, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return lifeState{State: targets.StateRunning, Since: time.Now()}, nil
	}
	if err != nil {
		return lifeState{}, fmt.Errorf("agent: %w", err)
	}
	var l lifeState
	if err := json.Unmarshal(raw, &l); err != nil {
		return lifeState{}, fmt.Errorf("agent: %s: %w", filepath.Join(dir, stateFile), err)
	}
	switch l.State {
	case targets.StateRunning, targets.StateLanding, targets.StateLanded, targets.StateRetiring:
		return l, nil
	}
	return lifeState{}, fmt.Errorf("agent: %s: unknown state %q", filepath.Join(dir, stateFile), l.State)
}

// setLifeLocked moves to state, records it and wakes the readers of
// Changed. Called with a.mu held.
func (a *Agent) setLifeLocked(state targets.State) error {
	if a.life.State == state {
		return nil
	}
	l := lifeState{State: state, Since: a.opts.Now().UTC()}
	if state != stateGone {
		raw, _ := json.Marshal(l)
		if err := atomicfile.Write(filepath.Join(a.opts.WorkDir, stateFile), raw, 0o600); err != nil {
			return fmt.Errorf("agent: record state %s: %w", state, err)
		}
	}
	a.opts.Logger.Info("agent state", "target", a.opts.Name, "from", string(a.life.State), "to", string(state))
	a.life = l
	a.notifyLocked()
	if state == stateGone {
		close(a.gone)
	}
	return nil
}

// mine checks that name is this agent's target.
func (a *Agent) mine(name string) error {
	if name != a.opts.Name || a.life.State == stateGone {
		return fmt.Errorf("%w: %s", targets.ErrNotFound, name)
	}
	return nil
}

// Land stops new steps; the target is landing until its running steps
// have ended, then landed.
func (a *Agent) Land(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.mine(name); err != nil {
		return err
	}
	if a.life.State != targets.StateRunning {
		return nil // landing, landed or retiring already
	}
	if err := a.setLifeLocked(targets.StateLanding); err != nil {
		return err
	}
	return a.settleLocked()
}

// Retire lands, then, once the running steps have ended, deletes every
// step's folder and forgets the target: the agent leaves the mesh.
func (a *Agent) Retire(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.mine(name); err != nil {
		return err
	}
	if err := a.setLifeLocked(targets.StateRetiring); err != nil {
		return err
	}
	return a.settleLocked()
}

// Prune forgets an agent that is not running: it leaves the mesh, its
// folders kept. (A stalled agent, which cannot be asked, is pruned by
// the gateway it had joined.)
func (a *Agent) Prune(_ context.Context, name string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.mine(name); err != nil {
		return "", err
	}
	if a.life.State == targets.StateRunning {
		return "", targets.ErrRunning
	}
	return lifecycle.PrunedFromMesh, a.setLifeLocked(stateGone)
}

// Resume takes a landing or landed agent back to running. A retiring
// one stays retiring.
func (a *Agent) Resume(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.mine(name); err != nil {
		return err
	}
	if a.life.State == targets.StateRetiring {
		return fmt.Errorf("%w: %s is retiring", lifecycle.ErrBusy, name)
	}
	return a.setLifeLocked(targets.StateRunning)
}

// Sync releases the ended steps whose handles are not in wanted (the CI
// core's list of what it still uses) and returns their folders.
func (a *Agent) Sync(ctx context.Context, name string, wanted []string) ([]string, error) {
	a.mu.Lock()
	if err := a.mine(name); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	var drop []*step
	for k, s := range a.steps {
		if v := s.snapshot(); v.Phase.Final() && !v.Released && !slices.Contains(wanted, k.handle) {
			drop = append(drop, s)
		}
	}
	a.mu.Unlock()
	var released []string
	for _, s := range drop {
		if err := a.release(s); err != nil {
			return released, err
		}
		released = append(released, s.pod)
	}
	slices.Sort(released)
	return released, nil
}

// settleLocked ends landing and retiring once no step runs: landing
// becomes landed; retiring deletes the steps' folders and forgets the
// target. Called with a.mu held, after every change of a step's phase.
func (a *Agent) settleLocked() error {
	state := a.life.State
	if state != targets.StateLanding && state != targets.StateRetiring {
		return nil
	}
	for _, s := range a.steps {
		if !s.snapshot().Phase.Final() {
			return nil
		}
	}
	if state == targets.StateLanding {
		return a.setLifeLocked(targets.StateLanded)
	}
	for _, s := range a.steps {
		s.stopVolumes()
	}
	for _, f := range []string{stepsDir, stateFile} {
		if err := os.RemoveAll(filepath.Join(a.opts.WorkDir, f)); err != nil {
			return fmt.Errorf("agent: retire: %w", err)
		}
	}
	a.opts.Logger.Info("agent retired: its steps' folders are deleted", "target", a.opts.Name)
	return a.setLifeLocked(stateGone)
}
