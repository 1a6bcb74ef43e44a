package concourse

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/jetway-ci/jetway/targets"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixedTargets []targets.Status

func (f fixedTargets) Snapshot() []targets.Status { return f }
func (f fixedTargets) Changed() <-chan struct{}   { return nil }

// TestRegistrarStopsCleanly: a registrar whose TSA nobody answers says so
// for each running target (and none for the others), keeps trying, and
// returns from Start with every session's goroutine gone once ctx ends.
func TestRegistrarStopsCleanly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(k)
	require.NoError(t, err)
	r := New(Options{Web: TSA{Addrs: []string{addr}, Key: signer}, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		Targets: fixedTargets{{Name: "up", State: targets.StateRunning}, {Name: "down", State: targets.StateStalled}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Start(ctx) }()
	require.Eventually(t, func() bool {
		reg, ok := r.Registration("up")
		return ok && reg.State == StateFailing && strings.Contains(reg.Error, "reach the TSA at "+addr)
	}, 10*time.Second, 10*time.Millisecond)
	_, ok := r.Registration("down")
	assert.False(t, ok, "a target that is not running is not registered")
	cancel()
	require.NoError(t, <-done)
	var none *Registrar
	_, ok = none.Registration("up")
	assert.False(t, ok)
}
