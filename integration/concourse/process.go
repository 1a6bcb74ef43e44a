package concourse

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one long-running child: PostgreSQL's postmaster or the web
// node. Its output goes to a log file, it runs in its own process group,
// and it dies with the test process (Pdeathsig, which Go sets after
// switching to Credential's user) so an interrupted test leaves nothing.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
}

// startProcess starts path with args, as the user of cred when it is not
// nil, in dir, with env (nil: the test's environment).
func startProcess(name, logPath, path string, args, env []string, cred *syscall.Credential) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process, then SIGKILL to its group after grace,
// and returns once it is gone. It reports whether sig alone stopped it.
func (p *process) stop(sig syscall.Signal, grace time.Duration) bool {
	if p == nil || p.exited() {
		return true
	}
	_ = p.cmd.Process.Signal(sig)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		// Children of a clean exit (PostgreSQL's backends) are gone too;
		// the group kill below is for a process that hung.
		return true
	case <-timer.C:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return false
}

// logTail returns the last n lines of the process's log.
func (p *process) logTail(n int) string { return tail(p.logPath, n) }

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }
