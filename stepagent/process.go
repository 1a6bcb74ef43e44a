package stepagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/internal/pty"
)

// abortPoll is how often the supervisor looks for run/abort: the abort
// latency, at the cost of one stat.
const abortPoll = 50 * time.Millisecond

// run starts the process and supervises it to its status.
func run(root string, sp Spec, log *os.File) error {
	cmd, err := command(root, sp)
	if err != nil {
		return spawnFailed(root, err)
	}
	pio, err := attachIO(cmd, sp)
	if err != nil {
		return spawnFailed(root, err)
	}
	ooms := oomKills(cgroupFS)
	restore := preferForOOM()
	err = cmd.Start()
	restore()
	for _, f := range pio.child {
		f.Close() // the process's ends: with them closed, its output ends when it does
	}
	if err != nil {
		pio.close()
		return spawnFailed(root, err)
	}
	stdinStop := make(chan struct{})
	var stdinWG sync.WaitGroup
	if pio.stdin != nil {
		stdinWG.Go(func() { pumpStdin(root, pio.stdin, pio.tty, stdinStop) })
	}
	defer func() { close(stdinStop); stdinWG.Wait() }()
	started := Started{PID: cmd.Process.Pid, At: time.Now().UTC(), OOMKills: ooms}
	p, _ := json.Marshal(started)
	if err := writeAtomic(Path(root, StartedFile), p); err != nil {
		return err
	}
	if err := WriteFrameAt(log, KindStarted, started.At, p); err != nil {
		return err
	}
	if pio.note != "" {
		if err := WriteFrameAt(log, KindStderr, started.At, []byte(pio.note+"\n")); err != nil {
			return err
		}
	}
	copied := pump(log, started.At, pio.outputs...)
	stop := make(chan struct{})
	reason := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Go(func() { guard(root, sp, cmd.Process.Pid, started.At, stop, reason) })
	waitErr := cmd.Wait()
	// The process is gone; what it left running in its group would hold
	// the pipes open forever.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	close(stop)
	wg.Wait()
	if err := <-copied; err != nil {
		return err
	}
	st := exitStatus(cmd, waitErr)
	st.StartedAt = started.At
	select {
	case r := <-reason:
		st.Reason, st.Message = r, killMessage(r, sp)
	default:
		if st.Signal == syscall.SIGKILL.String() && oomKills(cgroupFS) > ooms {
			st.Reason, st.Message = ReasonOOMKilled, oomMessage
		}
	}
	// The status goes into the log first, as its last frame: whoever
	// follows the log has it at once, without waiting for status.json.
	st.FinishedAt = time.Now().UTC()
	b, _ := json.Marshal(st)
	if err := WriteFrameAt(log, KindStatus, st.FinishedAt, b); err != nil {
		return err
	}
	return writeStatus(root, st)
}

// processIO is the supervisor's side of a process's stdin and output.
type processIO struct {
	outputs []output // read into the log; pump closes them
	stdin   *os.File // written by pumpStdin; nil: not streamed
	tty     bool     // stdin is a terminal's master, also the only output
	child   []*os.File
	// note says, on the process's stderr, why it has no terminal though
	// it asked for one.
	note string
}

// openTerminal opens a process's terminal (tests: one that fails).
var openTerminal = pty.Open

// attachIO gives cmd its stdin and output: pipes, or a terminal
// (Spec.TTY) in a session of its own. Where no terminal can be opened (a
// container without /dev/pts), the process runs without one, as on a
// worker without terminals, and says so on its stderr: a task fails for
// what it does, not for its log's line ends.
func attachIO(cmd *exec.Cmd, sp Spec) (*processIO, error) {
	if sp.TTY == nil {
		return attachPipes(cmd, sp)
	}
	master, slave, err := openTerminal(*sp.TTY)
	if err != nil {
		pio, perr := attachPipes(cmd, sp)
		if perr != nil {
			return nil, perr
		}
		pio.note = "jetway: the process runs without a terminal: " + err.Error()
		return pio, nil
	}
	if c := cmd.SysProcAttr.Credential; c != nil {
		_ = slave.Chown(int(c.Uid), -1) // the process may open its terminal again by name
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own, the terminal its controlling one (fd 0 in the
	// process): ^C interrupts its foreground job. The session is its
	// process group, killed as a whole.
	cmd.SysProcAttr.Setpgid = false
	cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
	pio := &processIO{outputs: []output{{master, sp.stdoutKind()}}, child: []*os.File{slave}}
	if sp.StdinStream {
		pio.stdin, pio.tty = master, true
	}
	return pio, nil
}

// attachPipes gives cmd pipes for its stdout and stderr, and for its
// stdin if it is streamed.
func attachPipes(cmd *exec.Cmd, sp Spec) (*processIO, error) {
	pio := &processIO{}
	for _, kind := range []byte{sp.stdoutKind(), KindStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			pio.close()
			return nil, err
		}
		pio.outputs = append(pio.outputs, output{r, kind})
		pio.child = append(pio.child, w)
	}
	cmd.Stdout, cmd.Stderr = pio.child[0], pio.child[1]
	if sp.StdinStream {
		r, w, err := os.Pipe()
		if err != nil {
			pio.close()
			return nil, err
		}
		cmd.Stdin, pio.stdin = r, w
		pio.child = append(pio.child, r)
	}
	return pio, nil
}

// close closes every file of a process that did not start.
func (pio *processIO) close() {
	for _, o := range pio.outputs {
		o.f.Close()
	}
	for _, f := range pio.child {
		f.Close()
	}
	if pio.stdin != nil && !pio.tty { // a terminal's master is its output too, closed above
		pio.stdin.Close()
	}
}

// stdinPoll is how often pumpStdin looks for more of a streamed stdin,
// and for a new window size of a terminal.
const stdinPoll = 20 * time.Millisecond

// eot is the terminal's end of input (^D): what a terminal's stdin gets
// at its end, since closing the master would hang the terminal up.
const eot = 0x04

// pumpStdin copies StdinFile into the process's stdin as `run --stdin`
// appends to it, ending the stdin once StdinDone marks its end and all
// of it is copied, or when stop is closed (the process ended). On a
// terminal (tty) it also applies each new WindowFile.
func pumpStdin(root string, w *os.File, tty bool, stop <-chan struct{}) {
	if !tty {
		defer w.Close()
	}
	f, err := os.OpenFile(Path(root, StdinFile), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	var window []byte // WindowFile, once applied
	buf := make([]byte, 32<<10)
	for {
		done := exists(Path(root, StdinDone)) // before the read: all written by then is read
		n, err := f.Read(buf)
		if tty {
			// After the read: a size sent before this stdin applies
			// before the process reads it.
			window = resize(root, w, window)
		}
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the process closed its stdin
			}
			continue
		}
		if err != nil && err != io.EOF {
			return
		}
		if done {
			if tty {
				_, _ = w.Write([]byte{eot})
			}
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(stdinPoll):
		}
	}
}

// resize applies WindowFile to the terminal master if it differs from
// what was applied, returning what is applied now. It compares what the
// file holds, not its time: two sizes sent within the file system's
// clock tick would have the same.
func resize(root string, master *os.File, applied []byte) []byte {
	b, err := os.ReadFile(Path(root, WindowFile))
	if err != nil || bytes.Equal(b, applied) {
		return applied
	}
	var size pty.Size
	if json.Unmarshal(b, &size) != nil {
		return applied
	}
	_ = pty.Resize(master, size)
	return b
}

// StreamStdin appends the KindStdin frames read from in to the run's
// StdinFile until a KindStdinEnd frame, or until in ends or breaks, then
// marks the stdin's end: the process reads it as its stdin
// (Spec.StdinStream). A KindWindow frame replaces WindowFile.
func StreamStdin(root string, in io.Reader) error {
	f, err := os.OpenFile(Path(root, StdinFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	for {
		fr, rerr := ReadFrame(in)
		if rerr != nil || fr.Kind == KindStdinEnd {
			break
		}
		switch fr.Kind {
		case KindStdin:
			_, err = f.Write(fr.Payload)
		case KindWindow:
			var size pty.Size
			if json.Unmarshal(fr.Payload, &size) == nil {
				err = writeAtomic(Path(root, WindowFile), fr.Payload)
			}
		}
		if err != nil {
			break
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.WriteFile(Path(root, StdinDone), nil, 0o600)
}

// stdoutKind is the kind of the frames of the process's stdout.
func (sp Spec) stdoutKind() byte {
	if sp.Answer {
		return KindAnswer
	}
	return KindStdout
}

// cgroupFS is where the container sees its own cgroups.
var cgroupFS = os.DirFS("/sys/fs/cgroup")

// oomMessage says what ReasonOOMKilled means.
const oomMessage = "the kernel killed the process: its container reached its memory limit"

// oomKills is how many processes the kernel's OOM killer has killed in the
// container's memory cgroup (cgroup v2 memory.events, v1
// memory.oom_control; 0 where neither can be read: outside a container, a
// kernel before 4.13). A process that died of SIGKILL while it grew was
// one of them: the kernel kills the largest process of a cgroup at its
// limit, which is the step's, not the agent's pid1, so the container
// lives on and only the agent can tell.
func oomKills(cgroups fs.FS) int64 {
	for _, file := range []string{"memory.events", "memory/memory.oom_control"} {
		b, err := fs.ReadFile(cgroups, file)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
	}
	return 0
}

// killMessage says why guard killed the process.
func killMessage(reason string, sp Spec) string {
	if reason == ReasonTimeout {
		return "timed out after " + time.Duration(sp.Timeout).String()
	}
	return "aborted"
}

// spawnFailed ends a step whose process could not start: 127 when the
// program is missing, 126 when it cannot be run, as shells say.
func spawnFailed(root string, err error) error {
	code := 126
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		code = 127
	}
	return writeStatus(root, Status{Reason: ReasonSpawnFailed, ExitStatus: code, Message: err.Error()})
}

// exitStatus reads how the process ended.
func exitStatus(cmd *exec.Cmd, err error) Status {
	st := Status{Reason: ReasonExited}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		st.ExitStatus, st.Signal = 128+int(ws.Signal()), ws.Signal().String()
	case ok:
		st.ExitStatus = ws.ExitStatus()
	case err != nil:
		st.ExitStatus = 1
		st.Message = err.Error()
	}
	return st
}

// guard kills the process group on timeout or abort: TERM, then KILL
// after the kill grace. It says why on reason.
func guard(root string, sp Spec, pid int, started time.Time, stop <-chan struct{}, reason chan<- string) {
	var timeout <-chan time.Time
	if sp.Timeout > 0 {
		t := time.NewTimer(time.Until(started.Add(time.Duration(sp.Timeout))))
		defer t.Stop()
		timeout = t.C
	}
	tick := time.NewTicker(abortPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timeout:
			reason <- ReasonTimeout
		case <-tick.C:
			if !exists(Path(root, AbortFile)) {
				continue
			}
			reason <- ReasonAborted
		}
		break
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	grace := time.Duration(sp.KillGrace)
	if grace <= 0 {
		grace = defaultKillGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-stop:
	case <-t.C:
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// output is one of the process's pipes and the kind of its frames.
type output struct {
	f    *os.File
	kind byte
}

// pump copies the pipes into the log through one writer, so the log has
// one order; the channel gets the first write error, or nil at all EOFs.
// Each chunk is stamped with the time it was read, never before since nor
// before the chunk ahead of it in the log (a wall clock may step back).
func pump(log io.Writer, since time.Time, outputs ...output) <-chan error {
	frames := make(chan Frame, 64)
	var (
		mu   sync.Mutex // orders the stamps as the frames
		last = since
	)
	var readers sync.WaitGroup
	for _, o := range outputs {
		readers.Go(func() {
			defer o.f.Close()
			for {
				buf := make([]byte, MaxPayload)
				n, err := o.f.Read(buf)
				if n > 0 {
					at := time.Now().UTC()
					mu.Lock()
					if at.Before(last) {
						at = last
					}
					last = at
					frames <- Frame{Kind: o.kind, Time: at, Payload: buf[:n]}
					mu.Unlock()
				}
				if err != nil {
					return
				}
			}
		})
	}
	go func() { readers.Wait(); close(frames) }()
	done := make(chan error, 1)
	go func() {
		var werr error
		for f := range frames {
			if werr == nil {
				if err := WriteFrameAt(log, f.Kind, f.Time, f.Payload); err != nil {
					werr = fmt.Errorf("write log: %w", err)
				}
			}
		}
		done <- werr
	}()
	return done
}

// preferForOOM makes the step's process, and what it starts, the kernel's
// first choice when the container outgrows its memory limit. Without it
// the kernel picks the largest process, and a step whose process is
// smaller than the supervisor at that moment lost its supervisor instead
// (the step errored "lost" rather than failing OOMKilled; seen on the real
// node).
//
// The process must have the score from its first instruction, so the
// supervisor takes it for the moment of the fork and the process inherits
// it; set after the start, a fast step ran with the supervisor's (seen on
// the real node, on one CPU). The returned func gives the supervisor its
// own back. Raising needs no privilege, and lowering back to the score the
// container started with neither: the kernel refuses only a score below
// the last one a privileged process set. Where the score cannot be
// written the kernel chooses as before; where it cannot be given back the
// supervisor stays an equal choice, and the kernel takes the larger.
func preferForOOM() (restore func()) {
	const file = "/proc/self/oom_score_adj"
	own, err := os.ReadFile(file)
	if err != nil || os.WriteFile(file, []byte("1000"), 0) != nil {
		return func() {}
	}
	return func() { _ = os.WriteFile(file, own, 0) }
}
