package steps

import (
	"context"
	"log/slog"

	"github.com/jetway-ci/jetway/steppod"
)

// What the package's external tests (package steps_test, which use
// stepstest) reach inside.

var SummaryOf = summaryOf

const LostAfter = steppod.LostAfter

// Driving reports whether this gateway runs a runner for the record name.
func (m *Manager) Driving(name string) bool {
	m.keeper.mu.Lock()
	defer m.keeper.mu.Unlock()
	return m.keeper.runners[name] != nil
}

// FollowPlaced runs a runner's follow of the step of rec, placed as
// placed, to its end: the process's start, or the reading of its log.
func (m *Manager) FollowPlaced(ctx context.Context, rec *Record, placed Placed) error {
	r := &runner{k: m.keeper, name: rec.Name, sum: rec.Summary, placed: placed, log: slog.New(slog.DiscardHandler)}
	_, err := r.follow(ctx, rec)
	return err
}
