package stepagent

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// Install copies the running binary to dst (the init container's job) and
// makes the root's folders, and volumes (folders of VolumesDir, open to
// every user): a Concourse web node's container's mounts, which its
// sidecar writes into before the container's user works in them.
func Install(dst string, volumes ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o555)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	root := RootDir()
	for _, dir := range []string{"run", BuildDir, VolumesDir} {
		if err := mkdirOpen(Path(root, dir)); err != nil {
			return fmt.Errorf("install: %w", err)
		}
	}
	for _, v := range volumes {
		if v == "" || v != filepath.Base(v) || v[0] == '.' {
			return fmt.Errorf("install: volume %q is not a folder name", v)
		}
		if err := mkdirOpen(Path(root, filepath.Join(VolumesDir, v))); err != nil {
			return fmt.Errorf("install: %w", err)
		}
	}
	return nil
}

// Pid1 is the step container's command: it reaps every child that ends
// (the supervisors the execs leave, and their orphans) and keeps the
// container up, so the outputs stay served, until TERM or INT.
func Pid1() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
