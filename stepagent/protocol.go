// Package stepagent is what jetway runs inside a step pod, and the contract
// between it and the gateway. One static binary (cmd/step-agent) is copied
// into the pod's shared emptyDir by an init container, so any image works,
// one without a shell too. The gateway drives it through pods/exec:
//
//	prepare  writes the step's spec and lays out its build dir and volumes
//	run      starts a detached supervisor (once; never twice) and tails its log
//	tail     copies the log from a position, following until the step ends
//	abort    asks the supervisor to kill the process
//	volumes  the volume sidecar (the baggageclaim API on port 7788)
//	install  copies the binary into the emptyDir (the init container)
//	pid1     the step container's command: reaps children, keeps the pod up
//
// Everything the gateway needs lives in files under the root (/jetway in
// a pod), so a dropped exec, an API-server restart or a gateway restart
// loses nothing: the gateway execs tail again from the last position it
// consumed, and the exit status is read from status.json, never from an
// exec's own exit code.
//
// The log is a sequence of frames: one byte of kind, four bytes of
// big-endian payload length, eight bytes of big-endian time (when the
// frame's content came to be, in Unix nanoseconds; 0 for none), then the
// payload (at most MaxPayload bytes). The supervisor stamps an output
// chunk with the time it read it from the process, the started frame with
// Started.At, the status frame with Status.FinishedAt. When the process
// has ended and all its output is in the log, the supervisor appends a
// KindStatus frame (the status, without log_size), then writes
// status.json.
//
// A step's events are the log's event frames (IsEvent), one frame one
// event, numbered by counting them from the log's start: a reader knows
// a position in the log as a byte offset and the number of event frames
// before it (Position), and any reader, at any time, numbers the same
// events the same way. tail starts from such a position, skipping event
// frames if asked, and writes a KindPosition frame naming where its
// output starts, then the log's frames. After the end of the log, tail
// writes one more KindStatus frame, a trailer carrying status.json, and
// exits 0: a reader stops at the first KindStatus frame, which it gets as
// soon as the supervisor wrote it; the trailer serves logs whose
// supervisor died (status "lost", written by tail).
package stepagent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	utilexec "k8s.io/client-go/util/exec"

	"github.com/jetway-ci/jetway/internal/pty"
)

// Root is the step pod's shared emptyDir, where the init container puts the
// binary and the supervisor its files. RootEnv overrides it (kwok test
// clusters run exec as a local process, in a folder standing in for it).
//
// It is under /tmp, as Concourse's own runtimes keep their init there
// (/tmp/gdn-init) and its build dirs (/tmp/build): what copies a
// container's own root leaves /tmp out, as Concourse's mock resource type
// does for mirror_self, and a folder at / would be copied, the copy
// itself with it. LegacyRoot was the root before; pods made then run
// with their RootEnv and working dir, so a gateway finds their agent
// either way (it runs it by the relative BinPath).
const (
	Root       = "/tmp/jetway"
	LegacyRoot = "/jetway"
	RootEnv    = "JETWAY_STEP_ROOT"
)

// FSEnv names, where it is set, a folder standing in for the step
// container's own filesystem for a process's absolute working dir: kwok
// test clusters run exec as a local process, and stand in for a
// container's mounts with links in that folder.
const FSEnv = "JETWAY_STEP_FS"

// Paths under the root.
const (
	BinPath     = "bin/step-agent" // the binary, copied by install
	SpecFile    = "run/spec.json"  // the step, written once by prepare
	InputsFile  = "run/inputs.json"
	LockFile    = "run/lock"         // flock held by the live supervisor
	StartLock   = "run/start.lock"   // flock held by whoever is starting the supervisor
	StartedFile = "run/started.json" // written once the process started
	LogFile     = "run/log"          // frames, appended by the supervisor only
	AbortFile   = "run/abort"        // present: kill the process
	StatusFile  = "run/status.json"  // written last, atomically
	// StdinFile holds what `run --stdin` streamed for a process whose
	// spec has StdinStream; StdinDone marks its end.
	StdinFile = "run/stdin"
	StdinDone = "run/stdin.done"
	// WindowFile holds the latest window size `run --stdin` was sent for
	// a process with a TTY (JSON pty.Size); the supervisor applies it.
	WindowFile = "run/window.json"
	BuildDir   = "build"   // the step's build dir: inputs and outputs live here
	VolumesDir = "volumes" // volumes/<handle> -> ../build/<path>, served by the sidecar
	// RunsDir holds a sandbox pod's runs: runs/<name> is a root of its own
	// for each step run there (see RunRoot).
	RunsDir = "runs"
)

// VolumePort is where the volume sidecar listens.
const VolumePort = 7788

// ImagePort is where a Concourse volume holder's sidecar serves the
// rootfs it keeps as images, and nothing else (volumes.Server.ServeImages).
const ImagePort = 7789

// TokenHashEnv holds, in the volume sidecar's environment, the SHA-256
// (hex) of the token it serves (package volumes): the gateways derive the
// token, the pod holds only its hash.
const TokenHashEnv = "JETWAY_VOLUMES_TOKEN_SHA256"

// Spec is the step as the supervisor runs it. Prepare writes it once; the
// same spec again is a no-op, a different one an error.
type Spec struct {
	Handle string   `json:"handle"`
	Path   string   `json:"path"`
	Args   []string `json:"args,omitempty"`
	// Dir is the working directory, relative to the build dir.
	Dir string `json:"dir,omitempty"`
	// Env is the process's whole environment, as NAME=value.
	Env []string `json:"env,omitempty"`
	// User is a numeric uid[:gid] or a name from the image's /etc/passwd;
	// empty runs as the container's user.
	User  string `json:"user,omitempty"`
	Stdin []byte `json:"stdin,omitempty"`
	// StdinStream: the process's stdin is what `run --stdin` streams
	// after its inputs (a Concourse web node's process, whose stdin comes
	// after it started), read from StdinFile until StdinDone; not Stdin.
	StdinStream bool `json:"stdin_stream,omitempty"`
	// TTY, when set, runs the process in a new session on a terminal of
	// that size, as Garden does for a process with a TTY (a Concourse
	// task, `fly intercept` from a terminal): its stdin, stdout and
	// stderr are the terminal, so its output is all KindStdout frames,
	// with the terminal's line endings. A KindWindow frame streamed to
	// `run --stdin` resizes it.
	TTY *pty.Size `json:"tty,omitempty"`
	// Timeout counts from the process's start; zero means none.
	Timeout Duration `json:"timeout,omitempty"`
	// KillGrace is the time between TERM and KILL on abort and timeout;
	// zero means 10s.
	KillGrace Duration `json:"kill_grace,omitempty"`
	// Volumes are the step's inputs and outputs: folders of the build dir
	// that the sidecar serves by handle.
	Volumes []Volume `json:"volumes,omitempty"`
	// Answer says the process's stdout is the step's answer (a Concourse
	// resource script's JSON), not its log: the supervisor writes it as
	// KindAnswer frames, which are no events. Stderr stays the log.
	Answer bool `json:"answer,omitempty"`
}

// Volume is one folder of the build dir served as a volume.
type Volume struct {
	Handle string `json:"handle"`
	Path   string `json:"path"` // relative to the build dir
}

// Started is the payload of the KindStarted frame.
type Started struct {
	PID int       `json:"pid"`
	At  time.Time `json:"at"`
	// OOMKills is how many processes the kernel had killed in the
	// container at its memory limit before the process started: more at
	// the supervisor's death say how it died.
	OOMKills int64 `json:"oom_kills,omitempty"`
}

// Reasons a step ends, in Status.Reason.
const (
	ReasonExited      = "exited"       // the process exited or was killed by a signal
	ReasonTimeout     = "timeout"      // killed after Spec.Timeout
	ReasonAborted     = "aborted"      // killed on request
	ReasonSpawnFailed = "spawn-failed" // the process could not start
	ReasonLost        = "lost"         // the supervisor died without a status
	// ReasonOOMKilled: the kernel killed the process at its container's
	// memory limit (exit status 137).
	ReasonOOMKilled = "oom-killed"
)

// Status is status.json: how the step ended.
type Status struct {
	Reason string `json:"reason"`
	// ExitStatus is 0..255; a process killed by signal N reads 128+N.
	ExitStatus int    `json:"exit_status"`
	Signal     string `json:"signal,omitempty"`
	Message    string `json:"message,omitempty"`
	// LogSize is the log's final length: a reader at this offset has it all.
	LogSize    int64     `json:"log_size"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at"`
}

// Frame kinds.
const (
	KindStdout   byte = 1
	KindStderr   byte = 2
	KindInput    byte = 3 // JSON wire.InputDigest
	KindStarted  byte = 4 // JSON Started
	KindAnswer   byte = 5 // the process's stdout when Spec.Answer: no event
	KindPosition byte = 6 // JSON Position: tail's first frame, never in the log
	// KindStdin and KindStdinEnd carry a streamed stdin to `run --stdin`
	// (never in the log): a chunk of it, then its end. Its end is said in
	// the stream, not by closing the exec's stdin, which not every
	// exec path passes on (kwok's does not).
	KindStdin    byte = 0x20
	KindStdinEnd byte = 0x21
	KindWindow   byte = 0x22 // JSON pty.Size: the TTY's new window size
	KindStatus   byte = 0xFF
)

// IsEvent says whether frames of kind are a step's events, one frame one
// event: output, inputs and the start. A step's events are numbered by
// counting exactly these frames from the log's start.
func IsEvent(kind byte) bool {
	switch kind {
	case KindStdout, KindStderr, KindInput, KindStarted:
		return true
	}
	return false
}

// Position is a place in the log, and a KindPosition frame's JSON.
type Position struct {
	// Offset is the byte offset, in the log, of the next frame a reader
	// gets: a frame boundary.
	Offset int64 `json:"offset"`
	// Events is how many event frames (IsEvent) the log holds before
	// Offset: the number of the next event.
	Events int `json:"events"`
}

// MaxPayload caps a frame's payload, so that one frame is one event.
const MaxPayload = 32 << 10

// HeaderSize is a frame's header: kind, payload length and time.
const HeaderSize = 13

// Frame is one record of the log.
type Frame struct {
	Kind byte
	// Time is when the frame's content came to be, in UTC; zero for none.
	Time    time.Time
	Payload []byte
}

// Size is the frame's length on the wire.
func (f Frame) Size() int64 { return HeaderSize + int64(len(f.Payload)) }

// WriteFrame writes one frame stamped with the time now.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	return WriteFrameAt(w, kind, time.Now(), payload)
}

// WriteFrameAt writes one frame stamped with at, in one Write; a zero at
// stamps none.
func WriteFrameAt(w io.Writer, kind byte, at time.Time, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(payload), MaxPayload)
	}
	var ns int64
	if !at.IsZero() {
		ns = at.UnixNano()
	}
	var h [HeaderSize]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:5], uint32(len(payload)))
	binary.BigEndian.PutUint64(h[5:], uint64(ns))
	if _, err := w.Write(append(h[:], payload...)); err != nil {
		return err
	}
	return nil
}

// ErrFrame says a log is not made of frames.
var ErrFrame = errors.New("malformed frame")

// ReadFrame reads one frame. A stream that ends between frames returns
// io.EOF; one that ends inside a frame io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader) (Frame, error) {
	f, n, err := readHeader(r)
	if err != nil {
		return Frame{}, err
	}
	f.Payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
}

// readHeader reads a frame's header: the frame without its payload, and
// the payload's length.
func readHeader(r io.Reader) (Frame, int, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, 0, err
	}
	n := binary.BigEndian.Uint32(h[1:5])
	if n > MaxPayload {
		return Frame{}, 0, fmt.Errorf("%w: length %d exceeds %d", ErrFrame, n, MaxPayload)
	}
	f := Frame{Kind: h[0]}
	if ns := int64(binary.BigEndian.Uint64(h[5:])); ns != 0 {
		f.Time = time.Unix(0, ns).UTC()
	}
	return f, int(n), nil
}

// Duration is a time.Duration that reads and writes as "90s" in JSON.
type Duration time.Duration

// MarshalText writes d as time.Duration's String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what time.ParseDuration reads.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Exit codes of the agent's own commands (not the step's).
const (
	ExitUsage       = 2 // bad flags or input
	ExitSpecDiffers = 3 // prepare: a different spec is already there
	ExitNotPrepared = 4 // run, tail: no spec yet
	ExitNotStarted  = 5 // tail: prepared, but no supervisor ever started the process
)

// kwokExit is how a kwok node reports a non-zero exit: as an internal
// error whose message ends "…: exit status N" (the command line comes
// first and may contain anything, so the last match counts).
var kwokExit = regexp.MustCompile(`: exit status (\d+)\s*$`)

// ExitCode reads the exit code of a failed exec, as a real kubelet reports
// it (a NonZeroExitCode status, which client-go turns into CodeExitError)
// or as a kwok node does. ok is false when err carries none.
func ExitCode(err error) (code int, ok bool) {
	var ce utilexec.CodeExitError
	if errors.As(err, &ce) {
		return ce.Code, true
	}
	if m := kwokExit.FindStringSubmatch(err.Error()); m != nil {
		if n, perr := strconv.Atoi(m[1]); perr == nil && n <= 255 {
			return n, true
		}
	}
	return 0, false
}

// Path joins root and one of the paths above.
func Path(root, rel string) string { return filepath.Join(root, filepath.FromSlash(rel)) }
