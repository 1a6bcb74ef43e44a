package concourse

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"code.cloudfoundry.org/garden"
	corev1 "k8s.io/api/core/v1"

	"github.com/jetway-ci/jetway/internal/pty"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

// A process the web node runs in a container is a run of the step agent
// in the container's pod (steppod.RunIn): started once, its output and exit
// status in the pod's files, so it outlives a dropped connection and a
// gateway restart, and Attach replays its output and follows it. Its ID
// is recorded with the container before it starts, so any gateway knows
// it.

// validProcessID is a process ID jetway takes: a folder name.
var validProcessID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Bounds of a process's start.
const (
	// podStartTimeout bounds the wait for the container's pod to run (its
	// image pulled) before a process starts.
	podStartTimeout = 10 * time.Minute
	killGrace       = 10 * time.Second
)

// Process is a process of a container, ready to be followed.
type Process struct {
	ID  string
	run steppod.RunIn
	// spec is the agent's spec: nil for an attach.
	spec []byte
	ct   *Container
	w    worker // ct's
	c    *Containers
	// tap keeps the stdin of a registry-image in, whose credentials are
	// kept in its pod volume tapVolume once it ends 0 (pullcreds.go).
	tap       *stdinTap
	tapVolume string
}

// Run records a new process of spec in target's container handle and
// returns it, to be started and followed (Process.Follow). A process
// without an ID (fly intercept's) gets one.
func (c *Containers) Run(ctx context.Context, target, handle string, spec garden.ProcessSpec) (*Process, error) {
	ct, err := c.whole(ctx, target, handle) // its environment is the process's too
	if err != nil {
		return nil, err
	}
	if err := ct.lostError(); err != nil {
		return nil, err
	}
	id := spec.ID
	if id == "" {
		id = "jetway-" + strings.ToLower(rand.Text()[:12])
	}
	if !validProcessID.MatchString(id) {
		return nil, fmt.Errorf("process ID %q: jetway takes IDs of at most 63 letters, digits, '.', '_' and '-'", id)
	}
	if spec.Path == "" {
		return nil, errors.New("a process needs a path")
	}
	dir := spec.Dir
	if dir != "" && !path.IsAbs(dir) {
		return nil, fmt.Errorf("process %s: working dir %q is not absolute", id, dir)
	}
	if dir != "" {
		dir = path.Clean(dir)
	}
	w, err := c.workerOf(ct)
	if err != nil {
		return nil, err
	}
	user := w.user(spec.User)
	raw, err := json.Marshal(stepagent.Spec{Handle: id, Path: spec.Path, Args: spec.Args, Dir: dir,
		Env: append(slices.Clone(ct.Spec.Env), spec.Env...), User: user,
		StdinStream: true, TTY: terminal(spec.TTY), KillGrace: stepagent.Duration(killGrace)})
	if err != nil {
		return nil, err
	}
	if !ct.HasProcess(id) {
		// Recorded before it starts: an Attach on any gateway finds it.
		if err := c.Records.Change(ctx, target, handle, func(rc *Container) error {
			if !rc.HasProcess(id) {
				rc.processes = append(rc.processes, id)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	p, err := c.process(ct, id, raw)
	if err != nil {
		return nil, err
	}
	p.tap, p.tapVolume = c.credentialTap(ct, processSpec{Path: spec.Path, Args: spec.Args})
	return p, nil
}

// Attach is target's container handle's process id, to be followed from
// its start: garden.ProcessNotFoundError if none was run.
func (c *Containers) Attach(ctx context.Context, target, handle, id string) (*Process, error) {
	ct, err := c.Lookup(ctx, target, handle)
	if err != nil {
		return nil, err
	}
	if err := ct.lostError(); err != nil {
		return nil, err
	}
	if !ct.HasProcess(id) {
		// Run on another replica a moment ago, which the watch does
		// not show yet?
		if ct, err = c.whole(ctx, target, handle); err != nil {
			return nil, err
		}
		if !ct.HasProcess(id) {
			return nil, garden.ProcessNotFoundError{ProcessID: id}
		}
	}
	return c.process(ct, id, nil)
}

// Stop ends every process of target's container handle: TERM, then KILL
// after the grace (kill: at once). A lost container's ended with its pod.
func (c *Containers) Stop(ctx context.Context, target, handle string, kill bool) error {
	ct, err := c.Lookup(ctx, target, handle)
	if err != nil || ct.lostError() != nil {
		return err
	}
	var errs []error
	w, err := c.workerOf(ct)
	if err != nil {
		return err
	}
	for _, id := range ct.processes {
		if err := w.process(ct, id).Abort(ctx); err != nil {
			errs = append(errs, fmt.Errorf("process %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

func (c *Containers) process(ct *Container, id string, spec []byte) (*Process, error) {
	w, err := c.workerOf(ct)
	if err != nil {
		return nil, err
	}
	return &Process{ID: id, spec: spec, ct: ct, w: w, c: c, run: w.process(ct, id)}, nil
}

// trustedPod is the target of ct's pod, if the pod its watch shows under
// ct's name is the one jetway made (ownership.Key.Bound): each exec in a
// container goes by the pod's name, so it goes only while that name is
// jetway's pod's. A pod gone for good is an error wrapping
// steppod.ErrPodGone, recorded (lost.go): no exec is tried again.
func (c *Containers) trustedPod(ctx context.Context, ct *Container) (*targets.Target, error) {
	t, opts, err := c.target(ct.Target)
	if err != nil {
		return nil, err
	}
	p := t.CachedPod(ct.Pod)
	if p != nil {
		if err := c.refuse(t, opts, ct, p); err != nil {
			return nil, err
		}
	}
	if p == nil || lostWhy("", p) != "" {
		return nil, c.lose(ctx, clusterWorker{c: c, t: t, opts: opts}, ct)
	}
	return t, nil
}

// lose is the error of a call on ct whose pod is not listed, or is
// ending: ct lost (recorded so) if the API server says its pod is gone,
// else that it is not listed yet.
func (c *Containers) lose(ctx context.Context, w clusterWorker, ct *Container) error {
	why, err := w.lost(ctx, ct, true)
	switch {
	case err != nil:
		return err
	case why == "":
		return fmt.Errorf("container %s: its pod %s is not listed yet", ct.Handle(), ct.Pod)
	}
	if err := c.Records.markLost(context.WithoutCancel(ctx), ct, why, c.Metrics, c.logger().Warn); err != nil {
		c.logger().Warn("a lost container not recorded lost: the next sweep finds it", "target", ct.Target, "handle", ct.Handle(), "error", err.Error())
	}
	return lostError(ct, why)
}

// refuse is nil when p, ct's pod as listed, is the one jetway made; else
// why it gets nothing, counted.
func (c *Containers) refuse(t *targets.Target, opts steppod.Options, ct *Container, p *corev1.Pod) error {
	why := opts.Key.Verdict(t.Name(), p)
	if why == "" {
		return nil
	}
	c.Metrics.podRefused(why)
	return fmt.Errorf("container %s: its pod %s is not the one jetway made (%s: planted under its name, or made before pods were bound): "+
		"it gets nothing; destroy the container", ct.Handle(), ct.Pod, why)
}

// defaultWindow is a terminal's size when Garden's TTY names none, as
// Garden's own default.
var defaultWindow = pty.Size{Columns: 80, Rows: 24}

// terminal is the agent's terminal for Garden's TTY: nil for none.
func terminal(tty *garden.TTYSpec) *pty.Size {
	switch {
	case tty == nil:
		return nil
	case tty.WindowSize == nil:
		return &defaultWindow
	}
	return &pty.Size{Columns: tty.WindowSize.Columns, Rows: tty.WindowSize.Rows}
}

// Follow starts the process (a Run's; once) and writes its output to
// stdout and stderr until it ends, returning its exit status. stdin is
// the process's stdin. Before the process starts it waits for the pod to
// run, saying on stderr why it waits (scheduling, pulling the image). A
// pod that cannot run (its image cannot be pulled, it ended) is an error
// naming why.
func (p *Process) Follow(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := p.w.await(ctx, p.ct, stderr); err != nil {
		return 0, err
	}
	if p.spec != nil {
		if err := p.c.moveIn(ctx, p.ct); err != nil {
			return 0, err
		}
	}
	st, err := p.run.Follow(ctx, p.spec, stdin, func(f stepagent.Frame) error {
		var err error
		switch f.Kind {
		case stepagent.KindStdout, stepagent.KindAnswer:
			_, err = stdout.Write(f.Payload)
		case stepagent.KindStderr:
			_, err = stderr.Write(f.Payload)
		}
		return err
	})
	if errors.Is(err, steppod.ErrNoSuchRun) {
		return 0, garden.ProcessNotFoundError{ProcessID: p.ID}
	}
	if err != nil {
		return 0, err
	}
	if st.Reason == stepagent.ReasonSpawnFailed {
		return 0, spawnError(st)
	}
	if p.tap != nil && st.ExitStatus == 0 {
		p.c.keepCredential(ctx, p)
	}
	// What the process wrote is read by the web node from the volumes:
	// back out before the exit status says it is there.
	if err := p.c.moveOut(ctx, p.ct); err != nil {
		return 0, err
	}
	if st.Message != "" {
		_, _ = fmt.Fprintf(stderr, "%s\n", st.Message)
	}
	return st.ExitStatus, nil
}

// spawnError is a process that never started, an error as on a stock
// worker, not an exit status: Garden's Run fails, with
// garden.ExecutableNotFoundError where the program is missing (the
// agent's status 127). The web node then errors the step (a task whose
// path does not exist is errored, its on_error hooks run), and fly
// intercept, which tries bash first, tries sh: fly takes a process error
// naming "executable file not found" as Garden's (its hijacker). jetway
// answers the Run before the pod runs, so the error comes as the
// process's end.
func spawnError(st stepagent.Status) error {
	if st.ExitStatus == 127 {
		return garden.ExecutableNotFoundError{Message: st.Message}
	}
	return errors.New(st.Message)
}

// awaitPod waits until the container's step container runs, writing to
// progress what it waits for as that changes.
func (c *Containers) awaitPod(ctx context.Context, t *targets.Target, opts steppod.Options, ct *Container, progress io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, podStartTimeout)
	defer cancel()
	podState := func(p *corev1.Pod, ct *Container) (string, bool, error) {
		if p != nil {
			if err := c.refuse(t, opts, ct, p); err != nil {
				return "", false, err
			}
		}
		return podState(p, ct)
	}
	said := ""
	for {
		p := t.CachedPod(ct.Pod)
		if p == nil || lostWhy("", p) != "" {
			if err := c.lose(ctx, clusterWorker{c: c, t: t, opts: opts}, ct); errors.Is(err, steppod.ErrPodGone) {
				return err
			}
		}
		state, done, err := podState(p, ct)
		if done || err != nil {
			return err
		}
		if state != said && !strings.HasPrefix(state, sidecarWait) { // a moment: not worth a line
			_, _ = fmt.Fprintf(progress, "jetway: %s\n", state)
		}
		said = state
		// Wait for the pod to change.
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_ = t.AwaitPods(wctx, func(pods []*corev1.Pod) bool {
			i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return p.Name == ct.Pod })
			var p *corev1.Pod
			if i >= 0 {
				p = pods[i]
			}
			s, d, e := podState(p, ct)
			return s != said || d || e != nil
		})
		wcancel()
		if ctx.Err() != nil {
			return fmt.Errorf("container %s: its pod %s did not run within %s (%s)", ct.Handle(), ct.Pod, podStartTimeout, said)
		}
	}
}

// sidecarWait begins the state of a pod whose step container runs and
// whose volume sidecar has not started yet.
const sidecarWait = "waiting for the volume sidecar of pod "

// podState says what the container's pod is waiting for, done once its
// step container runs; an error if it never will.
func podState(p *corev1.Pod, ct *Container) (string, bool, error) {
	switch {
	case p == nil:
		return "waiting for pod " + ct.Pod + " to be listed", false, nil
	case p.DeletionTimestamp != nil:
		return "", false, fmt.Errorf("container %s: its pod %s is being deleted", ct.Handle(), ct.Pod)
	case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
		return "", false, fmt.Errorf("container %s: its pod %s has ended (%s)", ct.Handle(), ct.Pod, p.Status.Phase)
	case p.Spec.NodeName == "":
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Message != "" {
				return "waiting for pod " + ct.Pod + " to be scheduled: " + cond.Message, false, nil
			}
		}
		return "waiting for pod " + ct.Pod + " to be scheduled", false, nil
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != steppod.StepContainer {
			continue
		}
		switch {
		case cs.State.Running != nil && !steppod.SidecarRuns(p):
			return sidecarWait + ct.Pod + " to start", false, nil
		case cs.State.Running != nil:
			return "", true, nil
		case cs.State.Terminated != nil:
			return "", false, fmt.Errorf("container %s: its pod %s's step container has ended (%s)", ct.Handle(), ct.Pod, cs.State.Terminated.Reason)
		case cs.State.Waiting != nil:
			w := cs.State.Waiting
			if w.Reason == "ImagePullBackOff" && nodePortNotYet(ct.Image, w.Message) && time.Since(p.CreationTimestamp.Time) < servedImageGrace {
				return "pulling image " + ct.Image + " (its node does not answer on the volume holder's node port yet)", false, nil
			}
			switch w.Reason {
			case "ErrImageNeverPull", "InvalidImageName", "ImagePullBackOff", "CreateContainerConfigError":
				return "", false, fmt.Errorf("container %s: image %s: %s: %s", ct.Handle(), ct.Image, w.Reason, w.Message)
			}
			return "pulling image " + ct.Image + " (" + cmp.Or(w.Reason, "waiting") + ")", false, nil
		}
	}
	if p.Status.Phase == corev1.PodRunning {
		return "", true, nil // a node that reports no container states (kwok)
	}
	return "waiting for pod " + ct.Pod + " on node " + p.Spec.NodeName + " (" + string(p.Status.Phase) + ")", false, nil
}
