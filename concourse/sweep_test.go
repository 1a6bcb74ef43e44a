package concourse

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

// recordingWeb answers sweeps with its destroy list and records commands.
type recordingWeb struct {
	mu       sync.Mutex
	commands []string
	destroy  string // the JSON sweep-containers answers
}

func (w *recordingWeb) Forward(context.Context, wire.Worker, http.Handler, http.Handler, func(Event)) error {
	return errors.New("not used")
}

func (w *recordingWeb) Command(_ context.Context, command string, _ wire.Worker) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.commands = append(w.commands, command)
	if command == "sweep-containers" {
		return []byte(w.destroy), nil
	}
	return []byte("[]"), nil
}

// heldContainers holds containers; foreign handles are refused.
type heldContainers struct {
	none
	held, foreign []string
	listErr       error
	destroyed     []string
}

func (h *heldContainers) Containers(context.Context, string) ([]string, error) {
	return h.held, h.listErr
}
func (h *heldContainers) DestroyContainer(_ context.Context, _, handle string) error {
	for _, f := range h.foreign {
		if f == handle {
			return ErrNotOurs
		}
	}
	h.destroyed = append(h.destroyed, handle)
	return nil
}

// TestSweepReportsThenDestroysWhatIsNamed: a round reports what is held,
// asks what to destroy and destroys that alone; what jetway did not make
// is left and counted apart; a list that failed is not reported (a short
// list would say the rest is missing), yet the round still destroys.
func TestSweepReportsThenDestroysWhatIsNamed(t *testing.T) {
	web := &recordingWeb{destroy: `["b","planted"]`}
	h := &heldContainers{held: []string{"a", "b"}, foreign: []string{"planted"}}
	r := New(Options{Web: web, Holdings: h})
	run := func(ctx context.Context, command string) ([]byte, error) {
		return web.Command(ctx, command, wire.Worker{Name: "t"})
	}
	k := r.kinds()[0]
	require.NoError(t, r.sweep(context.Background(), "t", k, run))
	assert.Equal(t, []string{"report-containers a b", "sweep-containers"}, web.commands)
	assert.Equal(t, []string{"b"}, h.destroyed)

	web.commands, h.destroyed = nil, nil
	h.listErr = errors.New("pods not listed yet")
	err := r.sweep(context.Background(), "t", k, run)
	require.ErrorContains(t, err, "list containers: pods not listed yet")
	assert.Equal(t, []string{"sweep-containers"}, web.commands, "nothing reported")
	assert.Equal(t, []string{"b"}, h.destroyed)

	web.destroy = `not json`
	require.ErrorContains(t, r.sweep(context.Background(), "t", k, run), "the web node's containers to destroy")
}
