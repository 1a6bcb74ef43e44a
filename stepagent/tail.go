package stepagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// tailPoll backs up fsnotify: how long tail waits without an event before
// it looks again (and checks the supervisor is alive).
const tailPoll = 200 * time.Millisecond

// Start starts a supervisor for the prepared step unless one ever did,
// with the inputs it writes to the log first, and returns once a
// supervisor holds the step (or it has ended). Starting twice runs the
// process once.
func Start(root string, inputs []byte) error { return start(root, inputs, spawnSupervisor) }

// startHere is Start with the supervisor a goroutine of this process, a
// sandbox session's: a check starts without a process of the agent's
// own (~10 ms here), and is lost if the session's process dies.
func startHere(root string, inputs []byte) error {
	return start(root, inputs, func(root string) error {
		go func() { _ = Supervise(root) }()
		return nil
	})
}

func start(root string, inputs []byte, spawn func(root string) error) error {
	if _, err := ReadSpec(root); err != nil {
		return err
	}
	// One start at a time: without this, starts side by side each see no
	// supervisor yet and spawn one, and the extra ones linger, blocked on
	// the lock, to touch the folder after the step has ended.
	gate, err := os.OpenFile(Path(root, StartLock), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer gate.Close()
	deadline := time.Now().Add(startWait)
	if err := lockBy(gate, deadline); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if !exists(Path(root, StartedFile)) && !exists(Path(root, StatusFile)) && !supervised(root) {
		if err := writeAtomic(Path(root, InputsFile), inputs); err != nil {
			return err
		}
		if err := spawn(root); err != nil {
			return err
		}
	}
	return awaitSupervisor(root, deadline)
}

// startWait bounds a start: waiting for another start, and for the
// supervisor to take its lock.
const startWait = 10 * time.Second

// lockBy takes f's lock, waiting for its holder until deadline.
func lockBy(f *os.File, deadline time.Time) error {
	for {
		ok, err := tryLock(f)
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("another start of this step holds its lock")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// supervised says whether a live supervisor holds the step's lock.
func supervised(root string) bool {
	held := true
	_ = ifNoSupervisor(root, func() error { held = false; return nil })
	return held
}

// SelfArgs come before the agent's command when this binary runs it
// again (a supervisor, a session daemon): none for step-agent; the
// gateway, whose agent runs steps on its machine, sets its hidden
// subcommand.
var SelfArgs []string

// spawnSupervisor starts `step-agent supervise` in a session of its own,
// with no tie to this exec: a dropped exec, or a kwok node killing what it
// ran, leaves it running.
func spawnSupervisor(root string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append(slices.Clone(SelfArgs), "supervise")...)
	cmd.Env = append(os.Environ(), RootEnv+"="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	return cmd.Process.Release()
}

// awaitSupervisor waits until a supervisor holds the lock or the step
// has started or ended.
func awaitSupervisor(root string, deadline time.Time) error {
	lock, err := openLock(root)
	if err != nil {
		return err
	}
	defer lock.Close()
	for {
		if exists(Path(root, StartedFile)) || exists(Path(root, StatusFile)) {
			return nil
		}
		free, err := tryLock(lock)
		if err != nil {
			return err
		}
		if !free {
			return nil
		}
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		if time.Now().After(deadline) {
			return errors.New("the supervisor did not start")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Tail writes the log from offset on to out as it grows and, once the
// step has ended and the log is all out, a KindStatus trailer. It returns
// ErrNotPrepared or ErrNotStarted when there is nothing to follow.
func Tail(root string, offset int64, out io.Writer) error {
	return TailContext(context.Background(), root, offset, out)
}

// TailContext is Tail that returns ctx's error once ctx ends: for a
// reader in a long-lived process (an agent) rather than an exec.
func TailContext(ctx context.Context, root string, offset int64, out io.Writer) error {
	if _, err := ReadSpec(root); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(Path(root, "run")); err != nil {
		return err
	}
	var log *os.File
	defer func() {
		if log != nil {
			log.Close()
		}
	}()
	polled := false
	for {
		if log == nil {
			if log, err = os.Open(Path(root, LogFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		if log != nil {
			n, err := copyFrom(log, offset, out)
			offset += n
			if err != nil {
				return err
			}
		}
		st, done, err := ReadStatus(root)
		if err != nil {
			return err
		}
		if done && offset >= st.LogSize {
			if offset > st.LogSize {
				return fmt.Errorf("offset %d is past the log's end, %d", offset, st.LogSize)
			}
			b, _ := json.Marshal(st)
			return WriteFrame(out, KindStatus, b)
		}
		// Is anyone writing? Asked only when nothing happened for a while:
		// it costs a lock round trip, and output does not wait for it.
		if !done && polled {
			if err := checkSupervisor(root); err != nil {
				return err
			}
		}
		if polled, err = next(ctx, w); err != nil {
			return err
		}
	}
}

// next waits for the log to grow or the status to appear (true: neither
// did within tailPoll).
func next(ctx context.Context, w *fsnotify.Watcher) (bool, error) {
	timer := time.NewTimer(tailPoll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case ev := <-w.Events:
			switch filepath.Base(ev.Name) {
			case filepath.Base(LogFile), filepath.Base(StatusFile):
				drain(w.Events)
				return false, nil
			}
		case err := <-w.Errors:
			return false, err
		case <-timer.C:
			return true, nil
		}
	}
}

// drain drops the events already queued: one look at the log covers them.
func drain(ch <-chan fsnotify.Event) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// copyFrom copies what f holds from offset to its current end.
func copyFrom(f *os.File, offset int64, out io.Writer) (int64, error) {
	return io.Copy(out, io.NewSectionReader(f, offset, 1<<62))
}

// checkSupervisor: with no supervisor alive and no status, a step that
// started lost its supervisor (it is reported lost, never run again); one
// that never started is for run to start.
func checkSupervisor(root string) error {
	return ifNoSupervisor(root, func() error {
		if exists(Path(root, StatusFile)) {
			return nil
		}
		if !exists(Path(root, StartedFile)) {
			return ErrNotStarted
		}
		return writeStatus(root, lostStatus)
	})
}

// Abort asks the supervisor to kill the process. A step not started yet
// never starts.
func Abort(root string) error {
	if err := writeAtomic(Path(root, AbortFile), []byte("TERM\n")); err != nil {
		return err
	}
	// A live supervisor sees the file; without one, the step is ended here.
	return ifNoSupervisor(root, func() error {
		if exists(Path(root, StartedFile)) || exists(Path(root, StatusFile)) {
			return nil
		}
		return finishUnstarted(root)
	})
}

// RunRoot is the root of one run of a sandbox pod, where several steps
// run one after another (or side by side), each in its own folder.
func RunRoot(root, name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
		return "", fmt.Errorf("run %q: not a folder name", name)
	}
	return Path(root, RunsDir+"/"+name), nil
}

// Forget deletes an ended run's folder. A run whose supervisor still
// lives after forgetWait stays: forget it once it has ended. (The log's
// status frame comes a moment before status.json and the supervisor's
// exit: a reader of the log may ask that early.)
func Forget(root string) error {
	deadline := time.Now().Add(forgetWait)
	for {
		if !exists(Path(root, SpecFile)) || exists(Path(root, StatusFile)) {
			return os.RemoveAll(root) // never prepared, forgotten already, or ended
		}
		var ended bool
		if err := ifNoSupervisor(root, func() error { ended = true; return nil }); err != nil {
			return err
		}
		if ended {
			return os.RemoveAll(root)
		}
		if time.Now().After(deadline) {
			return errors.New("the run's process still runs: abort it first")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// forgetWait is how long forget waits for a run's end.
const forgetWait = 2 * time.Second

// ifNoSupervisor runs f holding the supervisor's lock, if no supervisor
// holds it.
func ifNoSupervisor(root string, f func() error) error {
	lock, err := openLock(root)
	if err != nil {
		return err
	}
	defer lock.Close()
	free, err := tryLock(lock)
	if err != nil || !free {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	return f()
}
