package api

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startServer(t *testing.T) (*Server, string, context.CancelFunc, chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	s := New(Options{
		Listener: ln, ConcourseVersion: "8.2.5", WorkerVersion: "2.5",
		Gatherer: reg, ShutdownTimeout: time.Second,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, "http://" + ln.Addr().String(), cancel, done
}

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func TestRoutes(t *testing.T) {
	_, base, _, _ := startServer(t)
	defer http.DefaultClient.CloseIdleConnections()

	require.Eventually(t, func() bool {
		code, _, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	}, 5*time.Second, 10*time.Millisecond)

	code, body, hdr := get(t, base+"/api/v1/info")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	var info map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &info))
	assert.Equal(t, map[string]any{"version": "8.2.5", "worker_version": "2.5"}, info)

	code, _, _ = get(t, base+"/healthz")
	assert.Equal(t, http.StatusOK, code)

	code, body, _ = get(t, base+"/metrics")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "go_goroutines")

	code, _, _ = get(t, base+"/api/v1/nonsense")
	assert.Equal(t, http.StatusNotFound, code)
}

func TestStartStopsOnCancel(t *testing.T) {
	s, _, cancel, done := startServer(t)
	require.Eventually(t, func() bool { return s.Addr() != nil }, 5*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
		done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after cancel")
	}
}

func TestStartReportsListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	s := New(Options{Listen: ln.Addr().String(), Gatherer: prometheus.NewRegistry(), ShutdownTimeout: time.Second})
	err = s.Start(context.Background())
	require.ErrorContains(t, err, "listen "+ln.Addr().String())
}
