// Package selection places a step on a target with Concourse's rules. It
// owns the decision and nothing else: it reads plain values (a Step and its
// Candidates), imports no Kubernetes client and starts no goroutines.
//
// Place keeps running targets only, drops those of another team, of an
// incompatible worker version (same major, minor at least the required
// one), of another platform, whose tags do not fit (a tagged target
// refuses an untagged step; a tagged step needs all its tags), or whose
// policy does not allow a privileged step (Candidate.AllowPrivileged).
// Among the compatible targets, those of the step's team win; global ones
// are used only when no team target is compatible, and are otherwise rejected with
// ReasonGlobalNotPreferred. The chain (ParseChain) then refuses targets at a
// limit and orders the rest: Concourse shuffles and applies each strategy as
// a stable sort from last to first; Place gets the same order from one
// composite key per target plus a random tie-break draw from the injected
// source. With Options.Top k it keeps only the best k in a bounded heap and
// draws only for targets that can still be kept (the draws are independent,
// so ties stay as likely as the shuffle makes them); with Top 1 it keeps the
// best keys and the targets tied at them, and one draw picks among those.
// The one-target decision a step makes never sorts.
//
// A Pool is the fast path for repeated decisions over the same targets:
// NewPool interns what decisions compare into 48-byte slots, remembers for
// each kind of step (team, platform, tags, privileged, version) which targets are
// compatible with it, and SetLoad moves a target's counts without
// preparing again. For a one-target decision (Top 1) over a large class
// it also keeps, per chain, the targets filed in buckets of equal load
// keys (build containers, active tasks), best first, which SetLoad keeps
// current: the decision takes the targets holding the step's inputs first
// when the chain starts with volume-locality, then the best bucket with a
// target that is compatible and at no limit, and picks one of those
// uniformly; it visits a handful of targets, not all of them. Chains with
// volume-locality after another key, and small classes, walk the class.
// Pool.Place leaves the reasons for Decision.Reasons, so a step that only
// needs its target never formats one. Place is NewPool + Pool.Place +
// Reasons, for callers that show every reason.
//
// Every target that falls out gets a reason: "state landed", "team other",
// "worker version 1.2", "platform windows", "untagged step",
// "missing tags gpu, big", ReasonPrivileged, "at limit active-tasks 4/4",
// "global target; team targets preferred". Decision.Compatible false means
// no target can ever take the step; AllAtLimit means it must wait.
package selection
