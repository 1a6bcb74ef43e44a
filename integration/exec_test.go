package integration

import (
	"context"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// TestExecsCancelledWhileStartingLeaveNothing: an exec whose context ends
// at any moment of its setup (the gateway stopping, a timeout) leaves no
// goroutine behind. client-go's WebSocket executor leaked three (its
// stream readers) when the context ended between the upgrade and the start
// of its read loop.
func TestExecsCancelledWhileStartingLeaveNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[0], "exec-cancel", "{}\n", gatewayOptions{})
	g.run(t, shStep("idle", "exec sleep 600"))
	eventually(t, 20*time.Second, func() error {
		if v := g.step(t, "idle"); v.Phase != wire.Running {
			return errorf("phase %s", v.Phase)
		}
		return nil
	})
	pod := g.step(t, "idle").Pod
	tg, err := g.registry.Target("exec-cancel")
	require.NoError(t, err)

	// How long a whole exec takes here: cancel within it.
	start := time.Now()
	require.NoError(t, steppod.ExecPod(ctx, tg, pod, []string{"true"}, nil, io.Discard))
	whole := time.Since(start)

	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for range 120 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ectx, cancel := context.WithTimeout(ctx, time.Duration(rand.Int64N(int64(whole))))
			defer cancel()
			_ = steppod.ExecPod(ectx, tg, pod, []string{"sleep", "1"}, strings.NewReader(""), io.Discard)
		})
	}
	wg.Wait()
	g.stop() // its own execs (the idle step's log) end
	// client-go's heartbeat notices a closed connection at its next ping.
	eventually(t, 10*time.Second, func() error {
		if n := execGoroutines(); n > 0 {
			return errorf("%d exec goroutines left", n)
		}
		return nil
	})
}

// execGoroutines counts the goroutines of execs: client-go's
// remotecommand, and jetway's own WebSocket exec.
func execGoroutines() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "tools/remotecommand") || strings.Contains(g, "steps.execWebSocket") ||
			strings.Contains(g, "steps.copyStdin") {
			n++
		}
	}
	return n
}
