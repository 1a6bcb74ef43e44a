package selection

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Step types, as Concourse names its container types.
const (
	StepTask  = "task"
	StepGet   = "get"
	StepPut   = "put"
	StepCheck = "check"
)

// StateRunning is the only state that takes new steps.
const StateRunning = "running"

// Step is what is being placed.
type Step struct {
	Type     string // task, get, put or check
	Team     string // the pipeline's team; empty places on global targets only
	Tags     []string
	Platform string // empty matches any platform
	// Inputs counts, per target name, the step's inputs already on it
	// (volume-locality prefers the target holding the most).
	Inputs map[string]int
	// Privileged asks for a privileged container: only a target whose
	// policy allows it (Candidate.AllowPrivileged) takes the step.
	Privileged bool
}

// Candidate is one target as placement sees it.
type Candidate struct {
	Name     string
	State    string
	Team     string // empty = global
	Tags     []string
	Platform string
	Version  string // worker version, e.g. "2.5"

	ActiveContainers int
	BuildContainers  int
	ActiveTasks      int
	ActiveVolumes    int
	MaxActiveTasks   int // the target's own limit; > 0 beats Limits.ActiveTasks
	// AllowPrivileged: the target's policy lets privileged steps run.
	AllowPrivileged bool
}

// Limits are the global per-target limits; 0 means no limit.
type Limits struct {
	ActiveTasks      int // max-active-tasks-per-target
	ActiveContainers int // max-active-containers-per-target
	ActiveVolumes    int // max-active-volumes-per-target
}

// Strategy is one link of a placement chain, named as Concourse names it.
type Strategy string

const (
	VolumeLocality        Strategy = "volume-locality"
	FewestBuildContainers Strategy = "fewest-build-containers"
	LimitActiveTasks      Strategy = "limit-active-tasks"
	LimitActiveContainers Strategy = "limit-active-containers"
	LimitActiveVolumes    Strategy = "limit-active-volumes"
	Random                Strategy = "random"
)

// Chain is an ordered list of strategies; the first is the primary key.
type Chain []Strategy

// DefaultChain is Concourse's default, volume-locality alone.
var DefaultChain = Chain{VolumeLocality}

// ErrBadChain marks every ParseChain failure.
var ErrBadChain = errors.New("invalid placement chain")

// ParseChain parses a comma list such as
// "fewest-build-containers,limit-active-tasks" and reports every problem at
// once: unknown names, duplicates, empty entries and random not alone.
func ParseChain(s string) (Chain, error) {
	var chain Chain
	var problems []string
	seen := map[Strategy]bool{}
	for _, part := range strings.Split(s, ",") {
		name := Strategy(strings.TrimSpace(part))
		switch {
		case name == "":
			problems = append(problems, "empty strategy name")
			continue
		case !known(name):
			problems = append(problems, fmt.Sprintf("unknown strategy %q", name))
			continue
		case seen[name]:
			problems = append(problems, fmt.Sprintf("strategy %q given twice", name))
			continue
		}
		seen[name] = true
		chain = append(chain, name)
	}
	if seen[Random] && len(seen) > 1 {
		problems = append(problems, "random must be the only strategy")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w %q: %s", ErrBadChain, s, strings.Join(problems, "; "))
	}
	return chain, nil
}

func known(s Strategy) bool {
	switch s {
	case VolumeLocality, FewestBuildContainers, LimitActiveTasks,
		LimitActiveContainers, LimitActiveVolumes, Random:
		return true
	}
	return false
}

// Options configure one decision.
type Options struct {
	Chain  Chain // nil = DefaultChain
	Limits Limits
	// WorkerVersion is the required worker version ("2.5"): a candidate's
	// major must equal it and its minor be at least it. Empty skips the check.
	WorkerVersion string
	// Rand breaks ties among equally good candidates; inject a seeded one for
	// deterministic tests. nil uses math/rand/v2's shared source.
	Rand *rand.Rand
	// Top caps Decision.Order at the best Top candidates; 0 orders them all.
	// A step needs only the first, so Top: 1 is the fast path.
	Top int
}

// Decision is the outcome of Place.
type Decision struct {
	// Order holds the approved candidates, best first (capped at Options.Top).
	Order []string
	// Rejected maps each candidate that fell out to its reason; Place fills
	// it, Pool.Place leaves it to Reasons.
	Rejected map[string]string
	// Compatible reports whether any candidate passed the compatibility rules
	// (state, team, version, platform, tags). False: nothing can ever run the
	// step as the targets stand (an API maps it to 422).
	Compatible bool
	// AllAtLimit reports that compatible candidates exist but every one is at
	// a limit: the step waits (an API maps it to 503).
	AllAtLimit bool

	// What Reasons needs to name the rejected candidates later.
	pool      *Pool
	step      Step
	opts      Options
	teamFound bool
}

// ReasonPrivileged is given to the targets whose policy refuses a
// privileged step: the key of target.yaml that would allow it.
const ReasonPrivileged = "privileged step; the target's policy does not allow it (steps.allowPrivileged in its target.yaml)"

// ReasonGlobalNotPreferred is given to compatible global targets when a
// compatible target of the step's team exists.
const ReasonGlobalNotPreferred = "global target; team targets preferred"
