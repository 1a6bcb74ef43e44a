package stepagent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

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

// Abort asks the supervisor to kill the process. A step not started yet
// never starts, nor one not prepared yet (a run aborted before its spec
// came: its folder is made for the mark).
func Abort(root string) error {
	if err := mkdirOpen(filepath.Dir(Path(root, AbortFile))); err != nil {
		return err
	}
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
