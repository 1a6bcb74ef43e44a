package steppod

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	gws "github.com/gorilla/websocket"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/websocket"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/jetway-ci/jetway/internal/capped"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

// Exec runs a command in a container of a step pod (the step container,
// or the volume sidecar when the step's container has ended) through the
// API server's pods/exec, streaming stdin in and stdout out; it returns
// when the command ends, with its error (see stepagent.ExitCode). It is a
// seam for tests; the default is ExecBytes.
type Exec func(ctx context.Context, t *targets.Target, pod, container string, cmd []string, stdin []byte, stdout io.Writer) error

// stderrLimit bounds what is kept of an agent command's stderr for errors.
const stderrLimit = 4 << 10

// ExecStream is Exec with a stdin that streams: a sandbox's session.
type ExecStream func(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin io.Reader, stdout io.Writer) error

// ErrNotTrusted: a command was not run in a pod because it is not the
// one jetway made under its name.
var ErrNotTrusted = errors.New("is not the pod jetway made under its name: it gets no command")

// TrustedPod is nil when pod, of t, is the very pod jetway made under its
// name (ownership.Key.Bound), as the target's watch shows it or, where it
// shows it otherwise (not yet listed, or listed before its binding), as
// the API server has it now. An exec goes by the pod's name: this is
// what it is sent to.
func TrustedPod(ctx context.Context, key ownership.Key, t *targets.Target, pod string) error {
	if p := t.CachedPod(pod); p != nil && key.Bound(t.Name(), p) {
		return nil
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := t.Pod(gctx, pod)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod, err)
	}
	if why := key.Verdict(t.Name(), p); why != "" {
		return fmt.Errorf("pod %s %w (%s)", pod, ErrNotTrusted, why)
	}
	return nil
}

// TrustedExec and TrustedExecStream run exec only in a pod TrustedPod
// trusts.
func TrustedExec(key ownership.Key, exec Exec) Exec {
	return func(ctx context.Context, t *targets.Target, pod, container string, cmd []string, stdin []byte, stdout io.Writer) error {
		if err := TrustedPod(ctx, key, t, pod); err != nil {
			return err
		}
		return exec(ctx, t, pod, container, cmd, stdin, stdout)
	}
}

func TrustedExecStream(key ownership.Key, exec ExecStream) ExecStream {
	return func(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin io.Reader, stdout io.Writer) error {
		if err := TrustedPod(ctx, key, t, pod); err != nil {
			return err
		}
		return exec(ctx, t, pod, cmd, stdin, stdout)
	}
}

// ExecBytes is ExecContainer with all of stdin at once (nil: none).
func ExecBytes(ctx context.Context, t *targets.Target, pod, container string, cmd []string, stdin []byte, stdout io.Writer) error {
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	return ExecContainer(ctx, t, pod, container, cmd, in, stdout)
}

// ExecPod runs a command in a step pod's step container (the default
// ExecStream), returning when it ends.
func ExecPod(ctx context.Context, t *targets.Target, pod string, cmd []string, stdin io.Reader, stdout io.Writer) error {
	return ExecContainer(ctx, t, pod, StepContainer, cmd, stdin, stdout)
}

// ExecContainer runs a command in a container of a step pod, returning
// when it ends. It speaks WebSocket to the API server, falling back to
// SPDY where an older server or a proxy refuses the upgrade, as kubectl
// does.
func ExecContainer(ctx context.Context, t *targets.Target, pod, container string, cmd []string, stdin io.Reader, stdout io.Writer) error {
	req := t.Core.RESTClient().Post().Namespace(t.Namespace()).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdin: stdin != nil, Stdout: true, Stderr: true},
			scheme.ParameterCodec)
	stderr := &capped.Buffer{Limit: stderrLimit} // client-go may still write to it after the exec returned
	err := execWebSocket(ctx, t.RESTConfig(), req.URL(), stdin, stdout, stderr)
	if httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err) {
		var spdy remotecommand.Executor
		if spdy, err = remotecommand.NewSPDYExecutor(t.RESTConfig(), "POST", req.URL()); err == nil {
			err = spdy.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
		}
	}
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("agent said %q: %w", msg, err)
		}
		return err
	}
	return nil
}

// The exec WebSocket protocol (v5.channel.k8s.io): each binary message
// starts with the stream it belongs to.
const (
	execProtocol = "v5.channel.k8s.io"
	streamStdin  = 0
	streamStdout = 1
	streamStderr = 2
	streamError  = 3
	streamClose  = 255 // v5: closes the stream named by the next byte
	// execPing keeps the connection alive and execIdle bounds a silence:
	// an API server gone without closing the connection is noticed.
	execPing = 5 * time.Second
	execIdle = 12*execPing + time.Second
)

// execWebSocket runs an exec over one WebSocket connection. It is
// client-go's WebSocket executor without its leak: that one, cancelled
// between the upgrade and the start of its read loop, left its stream
// readers blocked forever. Here one loop reads everything, and the
// context ending closes the connection, which ends the loop.
func execWebSocket(ctx context.Context, cfg *rest.Config, u *url.URL, stdin io.Reader, stdout, stderr io.Writer) error {
	rt, holder, err := websocket.RoundTripperFor(cfg)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	conn, err := websocket.Negotiate(rt, holder, req, execProtocol)
	if err != nil {
		return err
	}
	if conn.Subprotocol() != execProtocol {
		conn.Close()
		return &httpstream.UpgradeFailureError{Cause: fmt.Errorf("the API server speaks exec protocol %q, not %q", conn.Subprotocol(), execProtocol)}
	}
	// The context ending closes the connection: the read loop below ends.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	_ = conn.SetReadDeadline(time.Now().Add(execIdle))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(execIdle)) })
	wg.Go(func() {
		tick := time.NewTicker(execPing)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if conn.WriteControl(gws.PingMessage, nil, time.Now().Add(execPing)) != nil {
					return
				}
			}
		}
	})
	if stdin != nil {
		// Not waited for: it returns when stdin does, which the caller
		// ends (a session's stdin ends after its exec).
		go copyStdin(conn, stdin)
	}
	var status []byte
	for {
		typ, msg, err := conn.ReadMessage()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if gws.IsCloseError(err, gws.CloseNormalClosure) {
				return execStatus(status)
			}
			return fmt.Errorf("exec stream: %w", err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(execIdle))
		if typ != gws.BinaryMessage || len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case streamStdout:
			if stdout != nil && len(msg) > 1 {
				if _, err := stdout.Write(msg[1:]); err != nil {
					stdout = nil // its reader is gone: the rest is dropped, as the exec goes on
				}
			}
		case streamStderr:
			_, _ = stderr.Write(msg[1:])
		case streamError:
			status = append(status, msg[1:]...)
		}
	}
}

// copyStdin sends stdin to the exec, then closes the exec's stdin.
func copyStdin(conn *gws.Conn, stdin io.Reader) {
	buf := make([]byte, 32<<10)
	buf[0] = streamStdin
	for {
		n, err := stdin.Read(buf[1:])
		if n > 0 {
			if conn.WriteMessage(gws.BinaryMessage, buf[:1+n]) != nil {
				return
			}
		}
		if err != nil {
			_ = conn.WriteMessage(gws.BinaryMessage, []byte{streamClose, streamStdin})
			return
		}
	}
}

// execStatus reads the exec's error stream, a metav1.Status, as client-go
// does: nothing or Success is a success; a NonZeroExitCode failure is a
// CodeExitError with the exit code.
func execStatus(raw []byte) error {
	if len(raw) == 0 {
		return nil
	}
	var st metav1.Status
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("exec status %q: %w", raw, err)
	}
	switch {
	case st.Status == metav1.StatusSuccess:
		return nil
	case st.Reason == remotecommandconsts.NonZeroExitCodeReason && st.Details != nil:
		for _, c := range st.Details.Causes {
			if c.Type == remotecommandconsts.ExitCodeCauseType {
				code, err := strconv.ParseUint(c.Message, 10, 8)
				if err != nil {
					return fmt.Errorf("exec status: invalid exit code %q", c.Message)
				}
				return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: int(code)}
			}
		}
	}
	return errors.New(cmp.Or(st.Message, "exec failed with status "+string(raw)))
}

// agentCmd is a step agent command line: the agent's path, then args.
func agentCmd(args ...string) []string { return append([]string{stepagent.BinPath}, args...) }
