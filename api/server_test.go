package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
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

// pipeListener is an in-memory listener: Dial hands Accept one end of a
// net.Pipe. Its blocking is durable, so a server on it runs under synctest.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

var errRefused = errors.New("connection refused")

func (l *pipeListener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, errRefused
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// slowStreamer is a stream that takes took to finish, or until its ctx ends.
type slowStreamer struct {
	took    time.Duration
	started chan struct{}
	// cancelled receives how long after start the request's ctx ended.
	cancelled chan time.Duration
}

func (s *slowStreamer) Stream(ctx context.Context, _ streams.Request, _ *streams.Progress) (wire.StreamResult, error) {
	start := time.Now()
	close(s.started)
	select {
	case <-time.After(s.took):
		return wire.StreamResult{Mode: streams.ModeRelay, Bytes: 3, SHA256: "abc"}, nil
	case <-ctx.Done():
		s.cancelled <- time.Since(start)
		return wire.StreamResult{}, ctx.Err()
	}
}

func (s *slowStreamer) Send(context.Context, streams.Caller, wire.Endpoint, string, func() io.Writer) (int64, error) {
	return 0, errors.New("slowStreamer sends nothing")
}

type drainResult struct {
	code int
	body string
	err  error
}

// drainCase serves one stream taking took on a server with a drain bound
// of 10s, ends the server's ctx once the stream runs, and returns the
// server's and client's results and how long Start took to return.
func drainCase(t *testing.T, took time.Duration) (streamer *slowStreamer, served error, got drainResult, stopping time.Duration) {
	ln := newPipeListener()
	streamer = &slowStreamer{took: took, started: make(chan struct{}), cancelled: make(chan time.Duration, 1)}
	s := New(Options{Listener: ln, Gatherer: prometheus.NewRegistry(), Targets: fleet, Streams: streamer,
		NoAuth: true, ShutdownTimeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	client := &http.Client{Transport: &http.Transport{DialContext: ln.DialContext}}
	defer client.CloseIdleConnections()

	answer := make(chan drainResult, 1)
	go func() {
		body := `{"from": {"target": "global", "pod": "a", "handle": "h"}, "to": {"target": "global", "pod": "b", "handle": "h"}}`
		resp, err := client.Post("http://gateway/api/v1/streams", "application/json", strings.NewReader(body))
		if err != nil {
			answer <- drainResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		answer <- drainResult{code: resp.StatusCode, body: string(b), err: err}
	}()
	<-streamer.started
	start := time.Now()
	cancel()
	synctest.Wait()
	_, err := client.Get("http://gateway/healthz")
	require.ErrorIs(t, err, errRefused, "no new connections once the drain starts")
	served = <-done
	stopping = time.Since(start)
	return streamer, served, <-answer, stopping
}

// A request in flight when the server's ctx ends finishes: the drain
// waits for it instead of cancelling it.
func TestShutdownDrainsInFlightRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		streamer, served, got, stopping := drainCase(t, 3*time.Second)
		require.NoError(t, served)
		require.NoError(t, got.err)
		assert.Equal(t, http.StatusOK, got.code, got.body)
		assert.JSONEq(t, `{"mode": "relay", "bytes": 3, "sha256": "abc", "seconds": 0}`, got.body)
		assert.Empty(t, streamer.cancelled, "the stream was not cancelled")
		// http.Server.Shutdown polls for idle connections at most every 500ms.
		assert.GreaterOrEqual(t, stopping, 3*time.Second, "Start waits for the stream")
		assert.LessOrEqual(t, stopping, 3*time.Second+500*time.Millisecond, "Start returns once the stream has finished")
	})
}

// A request still running when ShutdownTimeout passes is cancelled then,
// not before, and Start says how many it cut off.
func TestShutdownCancelsRequestsAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		streamer, served, _, stopping := drainCase(t, time.Hour)
		require.EqualError(t, served, "shut down http server: cancelled 1 request(s) still running after 10s")
		assert.Equal(t, 10*time.Second, <-streamer.cancelled, "cancelled at the drain deadline")
		assert.Equal(t, 10*time.Second, stopping)
	})
}

// A connection that never finished a request's headers holds the drain to
// its deadline, then is closed; no request was cut off, so Start succeeds.
func TestShutdownClosesUnfinishedRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newPipeListener()
		s := New(Options{Listener: ln, Gatherer: prometheus.NewRegistry(), ShutdownTimeout: 5 * time.Second})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Start(ctx) }()
		conn, err := ln.DialContext(ctx, "pipe", "gateway")
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET /healthz HTTP/1.1\r\n"))
		require.NoError(t, err)
		synctest.Wait()
		start := time.Now()
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, 5*time.Second, time.Since(start))
		_, err = conn.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "the connection was closed")
	})
}
