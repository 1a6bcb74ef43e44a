package cluster

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStartWaitsForAStopInProgress: a start while another goroutine stops
// the process (a test's time.AfterFunc(StopAPIServer), then its
// StartAPIServer) begins only once the old process is gone, so the new
// one never finds the old one's port taken.
func TestStartWaitsForAStopInProgress(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := &process{name: "stubborn", path: "/bin/sh", args: []string{"-c", "trap '' TERM; touch " + ready + "; sleep 30 & wait"},
		logPath: filepath.Join(dir, "log")}
	require.NoError(t, p.start())
	for { // TERM is ignored from here on
		if _, err := os.Stat(ready); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock()
	old := p.cmd.Process.Pid
	p.mu.Unlock()
	stopping := make(chan struct{})
	go func() {
		close(stopping)
		p.stop(500 * time.Millisecond) // TERM is ignored: KILL after the grace
	}()
	<-stopping
	for p.running() { // the stop has begun once it cleared the process
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, p.start())
	defer p.stop(0)
	assert.ErrorIs(t, syscall.Kill(old, 0), syscall.ESRCH, "the old process was gone before the new one started")
}
