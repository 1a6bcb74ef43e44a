package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/wire"
)

// gatewayProcess is the real `gateway run` binary running as a child
// process, and its log lines.
type gatewayProcess struct {
	cmd   *exec.Cmd
	addr  string
	logs  *syncBuffer
	lines chan map[string]any
	done  chan error // the exit, once the logs are read
}

// runGateway starts `gateway run` on dir with args and returns once it
// serves.
func runGateway(t *testing.T, dir string, args ...string) *gatewayProcess {
	t.Helper()
	return startGatewayProcess(t, append([]string{"run", "--listen", "127.0.0.1:0", "--targets-dir", dir, "--no-auth"}, args...)...)
}

// startGatewayProcess starts the gateway binary with args (a `gateway
// run`) and returns once it serves.
func startGatewayProcess(t *testing.T, args ...string) *gatewayProcess {
	t.Helper()
	cmd := exec.Command(gatewayBinary(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &gatewayProcess{cmd: cmd, logs: &syncBuffer{}, lines: make(chan map[string]any, 1000), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.logs.Write(append(sc.Bytes(), '\n'))
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				select {
				case p.lines <- line:
				default: // nobody waits for this many lines
				}
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		if t.Failed() {
			t.Logf("gateway logs:\n%s", p.logs.String())
		}
	})
	p.addr = p.waitLog(t, "serving http", 10*time.Second)["addr"].(string)
	return p
}

// waitLog waits for a log line with message msg.
func (p *gatewayProcess) waitLog(t *testing.T, msg string, within time.Duration) map[string]any {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case line := <-p.lines:
			if line["msg"] == msg {
				return line
			}
		case <-timeout:
			t.Fatalf("gateway did not log %q within %s", msg, within)
		}
	}
}

// wait returns the process's exit.
func (p *gatewayProcess) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(within):
		t.Fatalf("gateway still running after %s", within)
		return nil
	}
}

// progressStream posts req asking for NDJSON progress. It sends on moving
// once the first line reports bytes carried, and returns the last line.
func progressStream(ctx context.Context, base string, req wire.StreamRequest, moving chan<- struct{}) (api.ProgressLine, error) {
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/streams", bytes.NewReader(body))
	if err != nil {
		return api.ProgressLine{}, err
	}
	hreq.Header.Set("Accept", api.NDJSON)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return api.ProgressLine{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.ProgressLine{}, fmt.Errorf("stream: %s", resp.Status)
	}
	var last api.ProgressLine
	dec := json.NewDecoder(resp.Body)
	for {
		var line api.ProgressLine
		if err := dec.Decode(&line); err != nil {
			return last, fmt.Errorf("read progress after %+v: %w", last, err)
		}
		last = line
		if line.Result != nil || line.Error != "" {
			return line, nil
		}
		if line.Bytes > 0 && moving != nil {
			close(moving)
			moving = nil
		}
	}
}

// TestSIGTERMDrainsStreams sends SIGTERM to the real `gateway run` while
// a stream between two clusters runs: the gateway stops accepting
// connections, lets the stream finish intact over the port-forwards it
// uses, and only then stops and exits 0.
func TestSIGTERMDrainsStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, dir := lifecycleTarget(ctx, t, clusters[0], "sd-a")
	b, _ := lifecycleTarget(ctx, t, clusters[1], "sd-c")
	writeFile(t, filepath.Join(dir, "sd-c.kubeconfig"), b.Kubeconfig)
	src := volumePod(ctx, t, clusters[0], "sd-a", "src")
	dst := volumePod(ctx, t, clusters[1], "sd-c", "dst")
	data := fill(t, src, "big", 8<<20)
	want := directSHA(t, src, "big", "raw")
	p := runGateway(t, dir, append(stateOf(t, dir).flags(t), "--shutdown-timeout", "30s")...)
	base := "http://" + p.addr
	req := func(handle string) wire.StreamRequest {
		return wire.StreamRequest{
			From: wire.Endpoint{Target: "sd-a", Pod: "src", Handle: "big", Path: "out"},
			To:   wire.Endpoint{Target: "sd-c", Pod: "dst", Handle: handle, Path: "in"}, Encoding: "raw",
		}
	}
	// The targets run, and kwok picks up the PortForward objects shortly
	// after they are made.
	require.NoError(t, os.MkdirAll(dst.Path("warmup"), 0o755))
	eventually(t, 30*time.Second, func() error {
		last, err := progressStream(ctx, base, req("warmup"), nil)
		if err == nil && last.Result == nil {
			err = errors.New(last.Error)
		}
		return err
	})

	src.SetRate(2 << 20) // 8 MiB at 2 MiB/s: four seconds in flight
	require.NoError(t, os.MkdirAll(dst.Path("drained"), 0o755))
	moving := make(chan struct{})
	type outcome struct {
		last api.ProgressLine
		err  error
	}
	finished := make(chan outcome, 1)
	go func() {
		last, err := progressStream(ctx, base, req("drained"), moving)
		finished <- outcome{last, err}
	}()
	select {
	case <-moving:
	case out := <-finished:
		t.Fatalf("the stream ended before it was seen moving: %+v, %v", out.last, out.err)
	}

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.waitLog(t, "shutting down", 5*time.Second)
	eventually(t, 5*time.Second, func() error {
		conn, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			conn.Close()
			return errors.New("the gateway still accepts connections")
		}
		return nil
	})
	select {
	case out := <-finished:
		t.Fatalf("the stream ended before the listener closed: %+v, %v", out.last, out.err)
	default:
	}

	out := <-finished
	require.NoError(t, out.err)
	require.NotNil(t, out.last.Result, "the stream finished: %+v", out.last)
	assert.Equal(t, want, out.last.Result.SHA256)
	got, err := os.ReadFile(filepath.Join(dst.Path("drained"), "in", "artifact.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got), "the drained stream landed intact")

	p.waitLog(t, "gateway stopped", 10*time.Second)
	require.NoError(t, p.wait(t, 10*time.Second), "a drained shutdown exits 0")
	assert.NotContains(t, p.logs.String(), "context canceled")
	assert.NotContains(t, p.logs.String(), `"level":"ERROR"`, "no errors logged")
}
