package concourse

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// changingTargets are targets a test changes.
type changingTargets struct {
	mu   sync.Mutex
	list []targets.Status
}

func (c *changingTargets) Snapshot() []targets.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

func (c *changingTargets) Changed() <-chan struct{} { return nil }

func (c *changingTargets) set(list ...targets.Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = list
}

// sessionWeb registers every worker at once and keeps it until ctx ends
// or the test lands it; it records the one-shot commands.
type sessionWeb struct {
	mu       sync.Mutex
	commands []string
	land     map[string]chan struct{}
}

func (w *sessionWeb) Forward(ctx context.Context, wk wire.Worker, _, _ http.Handler, on func(Event)) error {
	w.mu.Lock()
	landed := make(chan struct{})
	w.land[wk.Name] = landed
	w.mu.Unlock()
	on(Event{Type: "registered"})
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-landed:
		return nil
	}
}

func (w *sessionWeb) Command(_ context.Context, command string, wk wire.Worker) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if command == "land-worker" || command == "retire-worker" || command == "delete-worker" {
		w.commands = append(w.commands, command+" "+wk.Name)
	}
	return []byte("[]"), nil
}

func (w *sessionWeb) landFromTheWebNode(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.land[name])
}

func (w *sessionWeb) told() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.commands)
}

// look lets the registrar's 2 s look pass on synctest's clock (no real
// time), then waits until what it started is blocked again.
func look() {
	time.Sleep(3 * time.Second)
	synctest.Wait()
}

// TestRegistrarTellsWhatTheWebNodeHas: a target landed here and then gone
// is deleted from the web node, which had its worker; a target the web
// node never had is not; a retired one is not deleted again; an agent
// landed by the web node and resumed between two looks is registered
// anew, and an agent gone is not deleted.
func TestRegistrarTellsWhatTheWebNodeHas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tg := &changingTargets{}
		var agents changingTargets
		web := &sessionWeb{land: map[string]chan struct{}{}}
		var landed []string
		var mu sync.Mutex
		r := New(Options{Web: web, Targets: tg, Agents: agents.Snapshot,
			LandAgent: func(_ context.Context, name string) error {
				mu.Lock()
				landed = append(landed, name)
				mu.Unlock()
				return nil
			}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Start(ctx) }()

		running := func(name string) targets.Status { return targets.Status{Name: name, State: targets.StateRunning} }
		mac := func(state targets.State, since time.Time) targets.Status {
			return targets.Status{Name: "mac", State: state, Server: targets.AgentServer("mac"), LastCheck: since}
		}
		t0 := time.Now()
		tg.set(running("a"), running("r"), targets.Status{Name: "never", State: targets.StateStalled})
		agents.set(mac(targets.StateRunning, t0))
		look()
		for _, name := range []string{"a", "r", "mac"} {
			reg, ok := r.Registration(name)
			assert.True(t, ok && reg.State == StateRunning, "%s: %+v", name, reg)
		}

		// Landed and retired here: told; then gone: a is deleted, r is not
		// (retired there already), never was never there.
		tg.set(targets.Status{Name: "a", State: targets.StateLanded}, targets.Status{Name: "r", State: targets.StateRetiring},
			targets.Status{Name: "never", State: targets.StateStalled})
		look()
		tg.set()
		look()
		assert.ElementsMatch(t, []string{"land-worker a", "retire-worker r", "delete-worker a"}, web.told())

		// The web node lands the agent; it lands and is resumed before
		// the registrar looks again: its state time tells.
		web.landFromTheWebNode("mac")
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []string{"mac"}, landed)
		mu.Unlock()
		agents.set(mac(targets.StateRunning, t0.Add(time.Minute)))
		look()
		reg, _ := r.Registration("mac")
		assert.Equal(t, StateRunning, reg.State, "registered anew")

		agents.set()
		look()
		_, ok := r.Registration("mac")
		assert.False(t, ok)
		assert.NotContains(t, web.told(), "delete-worker mac", "an agent gone is not deleted")
		cancel()
		assert.NoError(t, <-done)
	})
}

// TestRetiringAWorkerTheWebNodeLanded: a worker landed from the web node
// has no address there, so the web node cannot retire it (its workers
// table refuses a retiring worker without one): jetway's retire of such
// a target deletes the worker instead.
func TestRetiringAWorkerTheWebNodeLanded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tg := &changingTargets{}
		web := &sessionWeb{land: map[string]chan struct{}{}}
		r := New(Options{Web: web, Targets: tg})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Start(ctx) }()

		tg.set(targets.Status{Name: "w", State: targets.StateRunning})
		look()
		web.landFromTheWebNode("w")
		synctest.Wait()
		tg.set(targets.Status{Name: "w", State: targets.StateLanded})
		look()
		tg.set(targets.Status{Name: "w", State: targets.StateRetired})
		look()
		assert.Equal(t, []string{"delete-worker w"}, web.told())
		cancel()
		assert.NoError(t, <-done)
	})
}
