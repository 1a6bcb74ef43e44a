package wire

import (
	"encoding/json"
	"fmt"
	"time"
)

// Phase is where a step is in its life.
type Phase string

// Phases. The last four are final.
const (
	Pending   Phase = "pending"  // waiting for a target with room
	Starting  Phase = "starting" // placed: pod scheduled, inputs streamed
	Running   Phase = "running"  // the process runs
	Succeeded Phase = "succeeded"
	Failed    Phase = "failed"  // the process exited non-zero
	Errored   Phase = "errored" // the step could not run to its end
	Aborted   Phase = "aborted"
)

// Final reports whether a step in phase p has ended.
func (p Phase) Final() bool {
	return p == Succeeded || p == Failed || p == Errored || p == Aborted
}

// Event types, in the order a step produces them.
const (
	EventWaiting   = "waiting"   // no target has room (or fits) yet
	EventPlaced    = "placed"    // a target was chosen and the pod made
	EventScheduled = "scheduled" // the pod is on a node
	EventInput     = "input"     // an input was streamed in
	EventStarted   = "started"   // the process started
	EventStdout    = "stdout"
	EventStderr    = "stderr"
	EventExited    = "exited" // the process ended; ExitStatus says how
	EventFailed    = "failed" // the step ended without an exit status of its process
)

// Event is one line of GET /api/v1/steps/{handle}/events.
type Event struct {
	N    int       `json:"n"`
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	// placed
	Target string `json:"target,omitempty"`
	Pod    string `json:"pod,omitempty"`
	// scheduled
	Node string `json:"node,omitempty"`
	// input
	Input  string `json:"input,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// stdout, stderr: Data when the chunk is UTF-8, else DataBase64.
	Data       string `json:"data,omitempty"`
	DataBase64 []byte `json:"data_base64,omitempty"`
	// exited, failed
	Phase      Phase  `json:"phase,omitempty"`
	ExitStatus *int   `json:"exit_status,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message,omitempty"`
}

// Output is a stdout or stderr event's chunk, as the process wrote it.
func (e Event) Output() []byte {
	if e.DataBase64 != nil {
		return e.DataBase64
	}
	return []byte(e.Data)
}

// View is GET /api/v1/steps/{handle}.
type View struct {
	Handle     string    `json:"handle"`
	Team       string    `json:"team,omitempty"`
	Type       string    `json:"type"`
	Phase      Phase     `json:"phase"`
	Target     string    `json:"target,omitempty"`
	Pod        string    `json:"pod,omitempty"`
	ExitStatus *int      `json:"exit_status,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	Message    string    `json:"message,omitempty"`
	CreatedAt  time.Time `json:"created_at,omitzero"`
	PlacedAt   time.Time `json:"placed_at,omitzero"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Outputs    []Volume  `json:"outputs,omitempty"`
	Released   bool      `json:"released,omitempty"` // its pod, and so its outputs, are gone
	// Result is a resource step's answer: check's versions, in's and
	// out's {version, metadata}.
	Result  json.RawMessage `json:"result,omitempty"`
	Events  int             `json:"events"`
	Waiting string          `json:"waiting,omitempty"` // why a pending step is not placed yet
}

// OutputSource is where output name of the step v is, for an input that
// names it as {step, output} in field: the step must have succeeded and
// kept its pod.
func (v View) OutputSource(field, name string) (InputSource, error) {
	if v.Phase != Succeeded || v.Released {
		return InputSource{}, fmt.Errorf("%w: %s: step %q is %s%s, not succeeded with its pod kept", ErrInput, field, v.Handle, v.Phase, map[bool]string{true: " and released"}[v.Released])
	}
	for _, out := range v.Outputs {
		if out.Name == name {
			return InputSource{Target: out.Target, Pod: out.Pod, Handle: out.Handle}, nil
		}
	}
	return InputSource{}, fmt.Errorf("%w: %s: step %q has no output %q", ErrInput, field, v.Handle, name)
}

// Volume is an output of a step: a volume of its pod, which a later step
// names as an input ({step, output}, or these fields as {target, pod,
// handle}).
type Volume struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Pod    string `json:"pod"`
	Handle string `json:"handle"`
}
