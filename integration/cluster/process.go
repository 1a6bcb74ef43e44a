package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one control-plane binary run by the harness. Its output goes
// to a log file; it dies with the test process (Pdeathsig) so an
// interrupted or crashed test leaves nothing running.
type process struct {
	name    string
	path    string
	args    []string
	logPath string
	env     []string // added to the test's environment

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// stopped is closed once the last process stopped is gone: a start
	// waits for it, so a restart never races the old process for its port.
	stopped chan struct{}
}

// running reports whether the process was started and not stopped.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped != nil {
		<-p.stopped // a stop in progress, maybe in another goroutine
	}
	if p.cmd != nil {
		return fmt.Errorf("start %s: already running", p.name)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// exited reports whether the process has ended on its own.
func (p *process) exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, then SIGKILL after grace (at once when grace is 0),
// and waits for the process to be gone. Stopping a stopped process is a
// no-op.
func (p *process) stop(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	if cmd != nil {
		p.stopped = done
	}
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if grace > 0 {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
			return
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// logTail returns the last n lines of the process's log.
func (p *process) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// errExited is returned by readiness waits when the process died first.
var errExited = errors.New("process exited")

func (p *process) exitedErr() error {
	return fmt.Errorf("%s: %w; last log lines:\n%s", p.name, errExited, indent(p.logTail(20)))
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }
