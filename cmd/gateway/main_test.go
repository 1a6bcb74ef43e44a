package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var gatewayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gateway-test-")
	if err != nil {
		panic(err)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	out, err := exec.Command("go", "build", "-o", gatewayBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build gateway: %v\n%s", err, out)
		os.Exit(1)
	}
	// run's components are tested in process (runAll): none may outlive a test.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

func TestBadConfigExitsTwo(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{name: "listen", args: []string{"run", "--listen", "nonsense", "--no-auth"}, want: []string{`listen: "nonsense" is not a host:port address`}},
		{name: "no auth choice", args: []string{"run"}, want: []string{"auth-tokens-file: required", "--no-auth"}},
		{name: "every bad key", args: []string{"run", "--listen", "nonsense", "--log-level", "loud"},
			env: []string{"JETWAY_SHUTDOWN_TIMEOUT=soon"}, want: []string{"listen:", "log-level:", "shutdown-timeout:"}},
		{name: "unknown flag", args: []string{"run", "--lisen", ":80"}, want: []string{"unknown flag: --lisen"}},
		{name: "stray argument", args: []string{"run", "extra"}, want: []string{`unknown command "extra"`}},
		{name: "unknown command", args: []string{"rnu"}, want: []string{`unknown command "rnu"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(gatewayBin, tt.args...)
			cmd.Env = append(os.Environ(), tt.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "output: %s", out)
			assert.Equal(t, 2, exit.ExitCode(), "output: %s", out)
			for _, w := range tt.want {
				assert.Contains(t, string(out), w)
			}
			assert.NotContains(t, string(out), "serving http", "nothing may start")
		})
	}
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(gatewayBin, "version").CombinedOutput()
	require.NoError(t, err)
	assert.Regexp(t, `^gateway \S+ \(worker API 2\.5, go1\.\d+`, string(out))
}

// gateway is a running `gateway run` and its JSON log lines.
type gateway struct {
	cmd   *exec.Cmd
	base  string
	lines chan map[string]any
	done  chan error
	// sawWarning: the --no-auth warning was logged before serving.
	sawWarning bool
}

func startGateway(t *testing.T, args ...string) *gateway {
	t.Helper()
	base := []string{"run", "--listen", "127.0.0.1:0", "--targets-dir", t.TempDir(), "--no-auth"}
	return attach(t, exec.Command(gatewayBin, append(base, args...)...))
}

// attach starts cmd, a `gateway run`, and returns once it serves.
func attach(t *testing.T, cmd *exec.Cmd) *gateway {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	g := &gateway{cmd: cmd, lines: make(chan map[string]any, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line map[string]any
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				line = map[string]any{"msg": "NOT JSON: " + sc.Text()}
			}
			g.lines <- line
		}
		close(g.lines)
		g.done <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-g.done })
	line := g.waitLog(t, "serving http")
	g.base = "http://" + line["addr"].(string)
	return g
}

func (g *gateway) waitLog(t *testing.T, msg string) map[string]any {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-g.lines:
			require.True(t, ok, "gateway exited before logging %q", msg)
			require.NotContains(t, line["msg"], "NOT JSON")
			if line["level"] == "WARN" && strings.Contains(line["msg"].(string), "without authentication") {
				g.sawWarning = true
			}
			if line["msg"] == msg {
				return line
			}
		case <-timeout:
			t.Fatalf("gateway did not log %q", msg)
		}
	}
}

func (g *gateway) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	for range g.lines { // drain so the reader can finish
	}
	select {
	case err := <-g.done:
		g.done <- err
		return err
	case <-time.After(within):
		t.Fatalf("gateway still running after %s", within)
		return nil
	}
}

func TestRunServesAndStopsOnSignal(t *testing.T) {
	g := startGateway(t, "--concourse-version", "7.14.2")

	resp, err := http.Get(g.base + "/api/v1/info")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"version":"7.14.2","worker_version":"2.5"}`, string(body))

	resp, err = http.Get(g.base + "/metrics")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), "go_goroutines")
	assert.Contains(t, string(body), "process_resident_memory_bytes")
	http.DefaultClient.CloseIdleConnections()

	require.NoError(t, g.cmd.Process.Signal(syscall.SIGTERM))
	g.waitLog(t, "gateway stopped")
	assert.True(t, g.sawWarning, "--no-auth is logged as a warning")
	require.NoError(t, g.wait(t, 10*time.Second), "a graceful stop exits 0")
}

func TestSIGINTStopsToo(t *testing.T) {
	g := startGateway(t)
	require.NoError(t, g.cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, g.wait(t, 10*time.Second))
}

// A second signal must not wait for the graceful shutdown: an operator
// pressing Ctrl-C twice wants the process gone.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	g := startGateway(t, "--shutdown-timeout", "1m")
	// A request whose body never comes keeps the drain waiting. The server
	// answers "100 Continue" once the handler reads the body: the request
	// is then in flight.
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("POST /api/v1/streams HTTP/1.1\r\nHost: gateway\r\n" +
		"Content-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	status, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", status)

	require.NoError(t, g.cmd.Process.Signal(syscall.SIGTERM))
	g.waitLog(t, "shutting down")
	start := time.Now()
	require.NoError(t, g.cmd.Process.Signal(syscall.SIGTERM))
	err = g.wait(t, 5*time.Second)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Less(t, time.Since(start), 3*time.Second)
}

// stage records a component's stop: asked, then (after drain) returned.
type stages struct {
	mu     sync.Mutex
	events []string
}

func (s *stages) add(e string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
}

// draining stops drain after its ctx ends, as the API drains requests.
func (s *stages) draining(name string, drain time.Duration) component {
	return componentFunc(func(ctx context.Context) error {
		<-ctx.Done()
		s.add(name + " stopping")
		time.Sleep(drain) // the component's own work, in the bubble's time
		s.add(name + " stopped")
		return nil
	})
}

// Components stop one at a time in the order given, each once the one
// before has returned: the API drains while streams and the dialer it uses
// still run, on a signal and when a component fails.
func TestRunAllStopsInOrder(t *testing.T) {
	for _, trigger := range []string{"signal", "failure"} {
		t.Run(trigger, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var s stages
				fail := make(chan struct{})
				last := componentFunc(func(ctx context.Context) error {
					select {
					case <-ctx.Done():
						s.add("registry stopping")
						return nil
					case <-fail:
						return fmt.Errorf("boom")
					}
				})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() {
					done <- runAll(ctx, 10*time.Second, s.draining("api", 3*time.Second), s.draining("streams", time.Second), last)
				}()
				synctest.Wait()
				start := time.Now()
				want := []string{"api stopping", "api stopped", "streams stopping", "streams stopped"}
				if trigger == "signal" {
					cancel()
					require.NoError(t, <-done)
					want = append(want, "registry stopping")
				} else {
					close(fail)
					require.EqualError(t, <-done, "boom")
				}
				assert.Equal(t, want, s.events)
				assert.Equal(t, 4*time.Second, time.Since(start), "the drains run one after the other")
			})
		})
	}
}

// A component that ignores its stop holds back the rest only until the
// shutdown's bound; then they are all told to stop and runAll gives up.
func TestRunAllBoundsShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		stuck := componentFunc(func(ctx context.Context) error {
			<-ctx.Done()
			<-release // ignores its deadline until the test ends
			return nil
		})
		stopped := make(chan struct{})
		after := componentFunc(func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		err := runAll(ctx, 100*time.Millisecond, stuck, after)
		require.ErrorContains(t, err, "main.componentFunc still running")
		assert.Equal(t, 100*time.Millisecond+stopGrace, time.Since(start))
		synctest.Wait()
		select {
		case <-stopped:
		default:
			t.Error("the component after the stuck one was not stopped")
		}
	})
}

func TestRunAllStopsOthersWhenOneFails(t *testing.T) {
	failing := componentFunc(func(context.Context) error { return fmt.Errorf("boom") })
	waiting := componentFunc(func(ctx context.Context) error { <-ctx.Done(); return nil })
	err := runAll(context.Background(), time.Second, failing, waiting)
	require.EqualError(t, err, "boom")
}
