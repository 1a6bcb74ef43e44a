package steps

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// A step's record is what makes it durable: one Secret per step in the
// installation's state namespace (see Store), from its submission until
// it is forgotten. Its data holds the request as submitted, environment
// and stdin included, which only the step's owner reads, when it starts
// the step. Its annotations hold what every gateway of the installation
// reads from a watch of the records' metadata: the request's Summary,
// which never changes, and the step's Status, which its owner, the
// placer and the API change with optimistic concurrency. Nothing secret
// is in an annotation or a label.
const (
	// RecordLabel marks a step record; its value is the installation.
	RecordLabel = "jetway-ci.dev/step-record"
	// summaryAnnotation holds the Summary, statusAnnotation the Status.
	summaryAnnotation = "jetway-ci.dev/step"
	statusAnnotation  = "jetway-ci.dev/step-status"
	// requestKey is the data key of the request, resultKey of a resource
	// step's answer.
	requestKey = "request"
	resultKey  = "result"
	// recordType is the records' Secret type.
	recordType = "jetway-ci.dev/step"
)

// RecordName is the name of the record of team's step handle in an
// installation: handles are unique per team, and the API server makes
// sure two gateways never create one twice.
func RecordName(installation, team, handle string) string {
	sum := sha256.Sum256([]byte(installation + "\x00" + team + "\x00" + handle))
	return "jetway-step-" + hex.EncodeToString(sum[:])[:20]
}

// Record is a step record as the gateways read it.
type Record struct {
	metav1.ObjectMeta
	Summary Summary
	Status  Status

	// result, set by a change (setResult), is written beside its status.
	result []byte
}

// setResult makes a change write a resource step's answer with the
// status.
func (r *Record) setResult(b []byte) { r.result = b }

// NewResult is the answer a change set (setResult): for a Records
// implementation, to write with the status.
func (r *Record) NewResult() []byte { return r.result }

// Copy is a deep copy of the record, without a result to write: what a
// Records implementation hands a change, and keeps.
func (r *Record) Copy() *Record {
	return &Record{ObjectMeta: *r.ObjectMeta.DeepCopy(), Summary: r.Summary, Status: r.Status.clone()}
}

// Summary is what every gateway needs of the request: to place the step,
// show it and stream its inputs. It is written once, at submission.
type Summary struct {
	Team      string         `json:"team,omitempty"`
	Handle    string         `json:"handle"`
	Type      string         `json:"type"`
	Tags      []string       `json:"tags,omitempty"`
	Platform  string         `json:"platform,omitempty"`
	Image     string         `json:"image"`
	Inputs    []wire.Input   `json:"inputs,omitempty"`
	Outputs   []wire.Output  `json:"outputs,omitempty"`
	Resources wire.Resources `json:"resources,omitzero"`
	Timeout   string         `json:"timeout,omitempty"`
	ReuseKey  string         `json:"reuse_key,omitempty"`
	// Privileged asks for a privileged container (Request.Privileged).
	Privileged bool `json:"privileged,omitempty"`
	// Resource marks a resource step: its stdout is its answer.
	Resource bool `json:"resource,omitempty"`
	// Admin says an admin submitted it: its inputs are streamed as one.
	Admin bool `json:"admin,omitempty"`
	// Submitted is when the gateway that took it did, by its clock: the
	// queue's order (first come, first served).
	Submitted time.Time `json:"submitted"`
}

// summaryOf is the summary of a validated request.
func summaryOf(req wire.Request, admin bool, at time.Time) Summary {
	return Summary{Team: req.Team, Handle: req.Handle, Type: req.Type, Tags: req.Tags, Platform: req.Platform,
		Image: req.Image, Inputs: req.Inputs, Outputs: req.Outputs, Resources: req.Resources, Timeout: req.Timeout, ReuseKey: req.ReuseKey,
		Privileged: req.Privileged, Resource: req.Resource != nil, Admin: admin, Submitted: at.UTC()}
}

// timeout is the summary's validated timeout.
func (s Summary) timeout() time.Duration {
	d, _ := time.ParseDuration(s.Timeout)
	return d
}

// uploads names the inputs the caller uploads.
func (s Summary) uploads() []string {
	var out []string
	for _, in := range s.Inputs {
		if in.From.Upload {
			out = append(out, in.Name)
		}
	}
	return out
}

// Status is where a step is, as its record says. Only the step's owner
// moves it once it is placed; the placer places it; the API asks for its
// release and records its uploads.
type Status struct {
	// Owner names the gateway (its identity, see Owners) that drives the
	// step: the one that took it, or one that took it over.
	Owner string `json:"owner"`
	// Waiting are the step's waiting events, at most maxWaiting of them;
	// WaitingNow is why it waits now ("" once placed).
	Waiting    []Waiting `json:"waiting,omitempty"`
	WaitingNow string    `json:"waiting_now,omitempty"`
	Placed     *Placed   `json:"placed,omitempty"`
	Scheduled  *Node     `json:"scheduled,omitempty"`
	// Prepared is when the step's spec reached its pod: uploads are taken
	// from then on.
	Prepared time.Time `json:"prepared,omitzero"`
	// Inputs are the inputs in the step's volumes, streamed or uploaded,
	// by name: none is brought in twice.
	Inputs map[string]wire.InputDigest `json:"inputs,omitempty"`
	// Uploading are the uploads under way, by input name.
	Uploading map[string]Claim `json:"uploading,omitempty"`
	// Started is when the process started.
	Started time.Time `json:"started,omitzero"`
	// Release asks for the step's release (DELETE): its process is
	// aborted if it runs, then its pod deleted.
	Release bool `json:"release,omitempty"`
	End     *End `json:"end,omitempty"`
	// Released is when the step's pod, and its outputs, went.
	Released time.Time `json:"released,omitzero"`
}

// Waiting is one waiting event.
type Waiting struct {
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
}

// maxWaiting bounds the waiting events of a step (a step whose reason
// keeps changing as targets come and go says so a few times, not forever),
// and maxWaitingMessage each message.
const (
	maxWaiting        = 10
	maxWaitingMessage = 2 << 10
)

// Placed is where the placer put the step.
type Placed struct {
	Target string    `json:"target"`
	Pod    string    `json:"pod"`
	At     time.Time `json:"at"`
	// Run is the step's folder in its check sandbox (Pod), if it runs in
	// one.
	Run string `json:"run,omitempty"`
	// KillGrace is the step's kill grace, fixed at placement so that every
	// owner gives its agent the same spec.
	KillGrace stepagent.Duration `json:"kill_grace"`
}

// Node is where the scheduler bound the step's pod, and when; and the
// pod's UID, for its owners to know it again (a pod made under its name
// after it was deleted is not the step's).
type Node struct {
	Name string    `json:"node"`
	At   time.Time `json:"at"`
	UID  types.UID `json:"pod_uid,omitempty"`
}

// Claim is an upload under way: the gateway receiving it, since when.
type Claim struct {
	By    string    `json:"by"`
	Since time.Time `json:"since"`
}

// End is how the step ended.
type End struct {
	Phase      wire.Phase `json:"phase"`
	ExitStatus *int       `json:"exit_status,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Message    string     `json:"message,omitempty"`
	At         time.Time  `json:"at"`
	// LogEvents counts the events of the step's log: the end event's
	// number is the head's length plus it.
	LogEvents int `json:"log_events"`
	// Kept says the pod stays for the step's outputs and log.
	Kept bool `json:"kept,omitempty"`
}

// clone is a deep copy of the status, for a change.
func (s Status) clone() Status {
	out := s
	out.Waiting = slices.Clone(s.Waiting)
	out.Inputs = maps.Clone(s.Inputs)
	out.Uploading = maps.Clone(s.Uploading)
	if s.Placed != nil {
		p := *s.Placed
		out.Placed = &p
	}
	if s.Scheduled != nil {
		n := *s.Scheduled
		out.Scheduled = &n
	}
	if s.End != nil {
		e := *s.End
		out.End = &e
	}
	return out
}

// key is the step's team and handle.
func (r *Record) key() key { return key{r.Summary.Team, r.Summary.Handle} }

// Ended reports whether the step has ended.
func (r *Record) Ended() bool { return r.Status.End != nil }

// pending reports whether the step waits for the placer.
func (r *Record) pending() bool { return r.Status.Placed == nil && r.Status.End == nil }

// Phase is the step's phase by its record.
func (r *Record) Phase() wire.Phase {
	st := &r.Status
	switch {
	case st.End != nil:
		return st.End.Phase
	case !st.Started.IsZero():
		return wire.Running
	case st.Placed != nil:
		return wire.Starting
	}
	return wire.Pending
}

// Head is the events a step has before its log: its waiting events, then
// placed, then scheduled, each as recorded. final says no more come: the
// step's log may have begun (it was scheduled) or it ended.
func (r *Record) Head() (head []wire.Event, final bool) {
	st := &r.Status
	for _, w := range st.Waiting {
		head = append(head, wire.Event{N: len(head), Type: wire.EventWaiting, Time: w.At, Reason: w.Reason, Message: w.Message})
	}
	if p := st.Placed; p != nil {
		head = append(head, wire.Event{N: len(head), Type: wire.EventPlaced, Time: p.At, Target: p.Target, Pod: p.Pod})
	}
	if n := st.Scheduled; n != nil {
		head = append(head, wire.Event{N: len(head), Type: wire.EventScheduled, Time: n.At, Node: n.Name})
	}
	return head, st.Scheduled != nil || st.End != nil
}

// EndEvent is the step's last event, numbered, once it has ended.
func (r *Record) EndEvent() (wire.Event, bool) {
	e := r.Status.End
	if e == nil {
		return wire.Event{}, false
	}
	head, _ := r.Head()
	typ := wire.EventFailed
	if e.Phase == wire.Succeeded || e.Phase == wire.Failed {
		typ = wire.EventExited
	}
	return wire.Event{N: len(head) + e.LogEvents, Type: typ, Time: e.At, Phase: e.Phase, ExitStatus: e.ExitStatus,
		Reason: e.Reason, Message: e.Message}, true
}

// View is the step's view by its record. Events counts the events the
// record holds: all of them once the step has ended, its head before.
func (r *Record) View() wire.View {
	st := &r.Status
	v := wire.View{Handle: r.Summary.Handle, Team: r.Summary.Team, Type: r.Summary.Type, Phase: r.Phase(),
		CreatedAt: r.Summary.Submitted, StartedAt: st.Started, Waiting: st.WaitingNow}
	if p := st.Placed; p != nil {
		v.Target, v.Pod, v.PlacedAt = p.Target, p.Pod, p.At
	}
	head, _ := r.Head()
	v.Events = len(head)
	if e := st.End; e != nil {
		v.ExitStatus, v.Reason, v.Message, v.FinishedAt = e.ExitStatus, e.Reason, e.Message, e.At
		v.Events += e.LogEvents + 1
		if e.Kept && st.Released.IsZero() && st.Placed != nil && st.Placed.Run == "" {
			v.Outputs = steppod.OutputVolumes(r.Summary.Outputs, st.Placed.Target, st.Placed.Pod)
		}
	}
	v.Released = !st.Released.IsZero() && st.Placed != nil
	return v
}

// decodeRecord reads a record from its object's metadata.
func decodeRecord(m metav1.ObjectMeta) (*Record, error) {
	r := &Record{ObjectMeta: m}
	if err := json.Unmarshal([]byte(m.Annotations[summaryAnnotation]), &r.Summary); err != nil {
		return nil, fmt.Errorf("step record %s: annotation %s: %w", m.Name, summaryAnnotation, err)
	}
	if raw, ok := m.Annotations[statusAnnotation]; ok {
		if err := json.Unmarshal([]byte(raw), &r.Status); err != nil {
			return nil, fmt.Errorf("step record %s: annotation %s: %w", m.Name, statusAnnotation, err)
		}
	}
	// What the cache keeps: the decoded values, not their JSON twice.
	r.Annotations = nil
	return r, nil
}

// encodeStatus is the status annotation's value.
func encodeStatus(st Status) string {
	b, _ := json.Marshal(st)
	return string(b)
}
