package steps

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/jetway-ci/jetway/targets"
)

// Exec runs a command in a step pod's step container through the API
// server's pods/exec, streaming stdin in and stdout out; it returns when
// the command ends, with its error (see stepagent.ExitCode). It is a seam
// for tests; the default is execPod.
type Exec func(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin []byte, stdout io.Writer) error

// stderrLimit bounds what is kept of an agent command's stderr for errors.
const stderrLimit = 4 << 10

// ExecStream is Exec with a stdin that streams: a sandbox's session.
type ExecStream func(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin io.Reader, stdout io.Writer) error

// execPod is ExecPod with all of stdin at once (nil: none).
func execPod(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin []byte, stdout io.Writer) error {
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	return ExecPod(ctx, t, pod, cmd, in, stdout)
}

// ExecPod runs a command in a step pod's step container (the default
// ExecStream), returning when it ends. It speaks WebSocket to the API
// server, falling back to SPDY where an older server or a proxy refuses
// the upgrade, as kubectl does.
func ExecPod(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin io.Reader, stdout io.Writer) error {
	req := t.Core.RESTClient().Post().Namespace(t.Namespace()).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: StepContainer, Command: cmd, Stdin: stdin != nil, Stdout: true, Stderr: true},
			scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(t.Config.REST, "GET", req.URL().String())
	if err != nil {
		return fmt.Errorf("exec in %s: %w", pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(t.Config.REST, "POST", req.URL())
	if err != nil {
		return fmt.Errorf("exec in %s: %w", pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("exec in %s: %w", pod, err)
	}
	stderr := &capped{limit: stderrLimit}
	opts := remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if err := ex.StreamWithContext(ctx, opts); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("agent said %q: %w", msg, err)
		}
		return err
	}
	return nil
}

// capped keeps the first limit bytes written to it. client-go may still
// write to it after the exec returned, hence the lock.
type capped struct {
	mu    sync.Mutex
	b     []byte
	limit int
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.b)
}
