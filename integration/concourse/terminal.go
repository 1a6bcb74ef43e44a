package concourse

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetway-ci/jetway/internal/pty"
)

// Terminal is fly running on a terminal, as a user at a shell would run
// `fly intercept`: the test types into it and reads what it shows.
type Terminal struct {
	cmd    *exec.Cmd
	master *os.File
	mu     sync.Mutex
	shown  strings.Builder
	read   chan struct{} // closed when the terminal has nothing more to show
	waited chan struct{}
	err    error
}

// FlyOnTerminal starts fly with args on a new terminal of size, in a
// session of its own (the terminal is its controlling one); ctx's end
// kills it.
func (w *WebNode) FlyOnTerminal(ctx context.Context, size pty.Size, args ...string) (*Terminal, error) {
	home := filepath.Join(w.Dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	master, slave, err := pty.Open(size)
	if err != nil {
		return nil, err
	}
	defer slave.Close()
	cmd := exec.CommandContext(ctx, w.flyBin, append([]string{"-t", FlyTarget}, args...)...)
	cmd.Env = append(webEnv(), "HOME="+home, "TERM=xterm")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		master.Close()
		return nil, fmt.Errorf("fly %s: %w", strings.Join(args, " "), err)
	}
	t := &Terminal{cmd: cmd, master: master, read: make(chan struct{}), waited: make(chan struct{})}
	go func() {
		defer close(t.read)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			t.mu.Lock()
			t.shown.Write(buf[:n])
			t.mu.Unlock()
			if err != nil {
				return // EIO: fly and all it started are gone
			}
		}
	}()
	go func() {
		defer close(t.waited)
		t.err = cmd.Wait()
	}()
	return t, nil
}

// Type writes s to the terminal, as keys typed.
func (t *Terminal) Type(s string) error {
	_, err := t.master.Write([]byte(s))
	return err
}

// Resize changes the terminal's size: fly gets SIGWINCH.
func (t *Terminal) Resize(size pty.Size) error { return pty.Resize(t.master, size) }

// Shown is all the terminal has shown so far.
func (t *Terminal) Shown() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.shown.String()
}

// AwaitShown waits until the terminal has shown s (from position from
// of Shown), within timeout; then it returns the position after it.
func (t *Terminal) AwaitShown(s string, from int, timeout time.Duration) (int, error) {
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		shown := t.Shown()
		if i := strings.Index(shown[min(from, len(shown)):], s); i >= 0 {
			return min(from, len(shown)) + i + len(s), nil
		}
		select {
		case <-deadline:
			return 0, fmt.Errorf("the terminal did not show %q within %s; it shows:\n%s", s, timeout, shown)
		case <-t.waited:
			select {
			case <-t.read:
			case <-time.After(time.Second):
			}
			if strings.Contains(t.Shown()[min(from, len(shown)):], s) {
				continue
			}
			return 0, fmt.Errorf("fly ended (%v) before the terminal showed %q; it shows:\n%s", t.err, s, t.Shown())
		case <-tick.C:
		}
	}
}

// Wait waits for fly to end (killing it when ctx ends) and returns its
// exit code. It closes the terminal: call it once, always.
func (t *Terminal) Wait(ctx context.Context) (int, error) {
	select {
	case <-t.waited:
	case <-ctx.Done():
		_ = t.cmd.Process.Kill()
		<-t.waited
	}
	select {
	case <-t.read: // all it showed
	case <-time.After(5 * time.Second): // a process fly left holds the terminal
	}
	t.master.Close()
	<-t.read
	var ee *exec.ExitError
	if errors.As(t.err, &ee) {
		return ee.ExitCode(), nil
	}
	return 0, t.err
}
