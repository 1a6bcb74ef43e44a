package steps

import (
	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// PlacementOptions are the configured chains and limits.
type PlacementOptions struct {
	// Strategy places steps with inputs (task, put); nil: volume-locality.
	Strategy selection.Chain
	// NoInputStrategy places get steps; nil: Strategy.
	NoInputStrategy selection.Chain
	// CheckStrategy places check steps; nil: random.
	CheckStrategy selection.Chain
	Limits        selection.Limits
}

// Chain picks the configured chain of a step type as Concourse does
// (atc/worker PlacementOptions, used by the step factory): task and put
// steps, which carry inputs, use container-placement-strategy; get steps,
// which have none, use no-input-container-placement-strategy; the checks
// the resource scanner runs use check-container-placement-strategy, and a
// check nested in a build (a get's image check) the no-input chain.
func (o PlacementOptions) Chain(stepType string, nested bool) selection.Chain {
	strategy := o.Strategy
	if strategy == nil {
		strategy = selection.DefaultChain
	}
	if stepType == selection.StepCheck && nested {
		stepType = selection.StepGet
	}
	switch stepType {
	case selection.StepGet:
		if o.NoInputStrategy != nil {
			return o.NoInputStrategy
		}
	case selection.StepCheck:
		if o.CheckStrategy != nil {
			return o.CheckStrategy
		}
		return selection.Chain{selection.Random}
	}
	return strategy
}

// Candidates are targets as selection reads them, with extra added to
// their counts (steps placed on them whose pods the watch has not shown
// yet); extra may be nil.
func Candidates(statuses []targets.Status, extra map[string]targets.Counts) []selection.Candidate {
	out := make([]selection.Candidate, len(statuses))
	for i, st := range statuses {
		c := st.Counts
		if e, ok := extra[st.Name]; ok {
			c.ActiveContainers += e.ActiveContainers
			c.BuildContainers += e.BuildContainers
			c.ActiveTasks += e.ActiveTasks
			c.ActiveVolumes += e.ActiveVolumes
		}
		out[i] = selection.Candidate{
			Name: st.Name, State: string(st.State), Team: st.Meta.Team, Tags: st.Meta.Tags,
			Platform: st.Meta.Platform, Version: wire.WorkerVersion, // as /api/v1/workers reports
			ActiveContainers: c.ActiveContainers, BuildContainers: c.BuildContainers,
			ActiveTasks: c.ActiveTasks, ActiveVolumes: c.ActiveVolumes,
			MaxActiveTasks: st.Meta.MaxActiveTasks, AllowPrivileged: st.Meta.Steps.AllowPrivileged,
		}
	}
	return out
}
