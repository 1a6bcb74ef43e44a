package steppod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

// A process in a pod's run folder is what a Concourse web node's Garden
// runs in its container (package concourse): the agent's own run, as a
// check's in a sandbox, driven without a step record. It is started once
// (the agent never runs a spec twice) and read from its log, so a
// dropped exec, an API server restart or another gateway reading it
// loses nothing.

// stdinEnd ends a streamed stdin.
var stdinEnd = func() []byte {
	var b bytes.Buffer
	_ = stepagent.WriteFrame(&b, stepagent.KindStdinEnd, nil)
	return b.Bytes()
}()

// RunIn is one process in the run folder Run of Pod, reached through the
// step container's exec.
type RunIn struct {
	// Target is the pod's target as it is now: nil for an Exec that
	// reaches the step agent otherwise (an agent's machine, whose "pod"
	// is a folder); its error ends an attach, which is tried again.
	Target func(ctx context.Context) (*targets.Target, error)
	Pod    string
	Run    string
	// Exec runs an agent command in the pod; default ExecPod.
	Exec ExecStream
}

// Follow starts spec in the run folder if spec is not nil (once: the same
// spec again only reads it) and streams its log's frames to out from the
// start, until its status, attaching again from the last frame whenever
// the exec breaks (Follower). The process's stdin (a spec with
// StdinStream) is stdin as the first exec streams it, in
// stepagent.KindStdin frames up to a KindStdinEnd; an exec after a break
// ends it. With a nil spec it only reads what is there: ErrNoSuchRun if
// nothing is. out's error ends it.
func (p RunIn) Follow(ctx context.Context, spec []byte, stdin io.Reader, out func(stepagent.Frame) error) (stepagent.Status, error) {
	f := &Follower{
		Exec: func(ctx context.Context, args []string, in io.Reader, w io.Writer) error {
			t, err := p.Target(ctx)
			if err != nil {
				return err
			}
			return p.exec()(ctx, t, p.Pod, agentCmd(args...), in, w)
		},
		Next: func(_ context.Context, at Cursor, after error) (Command, error) {
			if spec == nil {
				if NotStarted(after) {
					return Command{}, ErrNoSuchRun
				}
				return Tail(p.Run, at, ""), nil
			}
			in := io.MultiReader(bytes.NewReader(spec), strings.NewReader("[]"), bytes.NewReader(stdinEnd))
			if stdin != nil {
				in, stdin = io.MultiReader(bytes.NewReader(spec), strings.NewReader("[]"), stdin), nil
			}
			return Command{Stdin: in, Args: []string{"run", "--run", p.Run, "--stdin", "--spec-bytes", strconv.Itoa(len(spec)),
				"--inputs-bytes", "2", "--offset", strconv.FormatInt(at.Offset, 10), "--events", strconv.Itoa(at.Events)}}, nil
		},
		Frame: func(fr stepagent.Frame, _ Cursor) error { return out(fr) },
	}
	st, err := f.Follow(ctx)
	if err != nil && !errors.Is(err, ctx.Err()) {
		if _, coded := stepagent.ExitCode(err); coded || errors.Is(err, ErrNoSuchRun) || errors.Is(err, ErrLost) {
			return st, fmt.Errorf("process %s in pod %s: %w", p.Run, p.Pod, err)
		}
	}
	return st, err
}

// Abort asks the process's supervisor to end it (TERM, then KILL after its
// kill grace); a process that has ended, or never started, is no error.
func (p RunIn) Abort(ctx context.Context) error {
	t, err := p.Target(ctx)
	if err != nil {
		return err
	}
	err = p.exec()(ctx, t, p.Pod, agentCmd("abort", "--run", p.Run), nil, io.Discard)
	if err == nil {
		return nil
	}
	if code, ok := stepagent.ExitCode(err); ok && (code == stepagent.ExitNotPrepared || code == stepagent.ExitNotStarted) {
		return nil
	}
	return err
}

func (p RunIn) exec() ExecStream {
	if p.Exec != nil {
		return p.Exec
	}
	return ExecPod
}
