package wire

import "errors"

// Errors of the step API: the API answers each with its status code
// (404, 403, 503, 400, 409, 410), and the engine, the agent and the
// client compare with them (errors.Is).
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
	// ErrGone: what was asked for went with the step's pod.
	ErrGone = errors.New("gone")
)

// Reasons of a waiting event: why no target takes the step yet.
const (
	// ReasonNoTargetFits: no target could ever run the step as things
	// are (its team, tags or platform); it waits for one to appear.
	ReasonNoTargetFits = "NoTargetFits"
	// ReasonTargetsAtLimit: compatible targets are all at a limit.
	ReasonTargetsAtLimit = "TargetsAtLimit"
)
