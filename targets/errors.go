package targets

import "errors"

// Sentinel errors, checked with errors.Is.
var (
	// ErrInvalidEntry: a directory entry is not a usable target definition.
	ErrInvalidEntry = errors.New("invalid target")
	// ErrRefused: the kubeconfig uses a feature the operator has not allowed.
	ErrRefused = errors.New("refused by credential policy")
	// ErrNotFound: no target has that name.
	ErrNotFound = errors.New("no such target")
	// ErrRunning: the operation needs a target that is not running.
	ErrRunning = errors.New("cannot prune running worker")
	// ErrNotOurs: an object with a name jetway uses exists but lacks the
	// installation's ownership labels; jetway never modifies or deletes it.
	ErrNotOurs = errors.New("exists without this installation's ownership labels; jetway leaves it alone")
)
