package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/jetway-ci/jetway/wire"
)

// The addresses a worker names in forward-worker. They are only names:
// the TSA matches each to a tcpip-forward request with the same bind
// address, listens on a port of its own for it and records that port as
// the worker's addr and baggageclaim_url. Nothing listens on them here,
// and they must differ (the TSA keys its forwards by them).
const (
	gardenName       = "127.0.0.1:7777"
	baggageclaimName = "127.0.0.1:7788"
)

// tsaWorker is the least a worker does to stay running in `fly workers`
// (../shared/CONCOURSE-WORKER.md): one SSH connection to the TSA, two
// forwards through it, `forward-worker` with the worker's JSON on stdin,
// and a Garden and a baggageclaim that answer the TSA's lists.
type tsaWorker struct {
	client  *ssh.Client
	session *ssh.Session
	events  chan string // "registered", "heartbeated": the session's stdout
	exited  chan error  // forward-worker's end: nil is exit status 0
	servers []*http.Server
	lists   atomic.Int64 // list calls the TSA made
	wg      sync.WaitGroup
}

func registerOverTSA(t *testing.T, w *WebNode, keyPath string, worker wire.Worker) *tsaWorker {
	t.Helper()
	config, err := w.SSHConfig(keyPath)
	require.NoError(t, err)
	client, err := ssh.Dial("tcp", w.TSAAddr, config)
	require.NoError(t, err)
	tw := &tsaWorker{client: client, events: make(chan string, 100), exited: make(chan error, 1)}
	t.Cleanup(tw.close)

	// Client.Listen sends tcpip-forward for the name; the TSA's
	// connections to its port arrive as forwarded-tcpip channels, which
	// the listener accepts.
	garden, err := client.Listen("tcp", gardenName)
	require.NoError(t, err)
	baggageclaim, err := client.Listen("tcp", baggageclaimName)
	require.NoError(t, err)
	tw.serve(garden, "GET /containers", `{"handles":[]}`)
	tw.serve(baggageclaim, "GET /volumes", `[]`)

	tw.session, err = client.NewSession()
	require.NoError(t, err)
	body, err := json.Marshal(worker)
	require.NoError(t, err)
	tw.session.Stdin = bytes.NewReader(body)
	stdout, err := tw.session.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, tw.session.Start(fmt.Sprintf("forward-worker --garden %s --baggageclaim %s", gardenName, baggageclaimName)))
	tw.wg.Add(1)
	go func() {
		defer tw.wg.Done()
		dec := json.NewDecoder(stdout)
		for {
			var ev struct {
				Event string `json:"event"`
			}
			if err := dec.Decode(&ev); err != nil {
				tw.exited <- tw.session.Wait()
				return
			}
			tw.events <- ev.Event
		}
	}()
	return tw
}

// serve answers route with body on ln and 404 otherwise.
func (tw *tsaWorker) serve(ln net.Listener, route, body string) {
	mux := http.NewServeMux()
	mux.HandleFunc(route, func(rw http.ResponseWriter, _ *http.Request) {
		tw.lists.Add(1)
		rw.Header().Set("Content-Type", "application/json")
		io.WriteString(rw, body)
	})
	srv := &http.Server{Handler: mux}
	tw.servers = append(tw.servers, srv)
	tw.wg.Add(1)
	go func() {
		defer tw.wg.Done()
		_ = srv.Serve(ln)
	}()
}

// wait returns once the TSA sent event.
func (tw *tsaWorker) wait(t *testing.T, event string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-tw.events:
			if ev == event {
				return
			}
		case err := <-tw.exited:
			t.Fatalf("forward-worker ended before %q: %v", event, err)
		case <-timeout:
			t.Fatalf("no %q event from the TSA in 30 s", event)
		}
	}
}

// close ends the SSH connection, which ends forward-worker and the
// forwards, and waits for the servers.
func (tw *tsaWorker) close() {
	tw.client.Close()
	for _, srv := range tw.servers {
		srv.Close()
	}
	tw.wg.Wait()
}

func stockWorker(name, team string, tags ...string) wire.Worker {
	return wire.Worker{
		Name:     name,
		Platform: "linux",
		Team:     team,
		Tags:     tags,
		Version:  "2.5",
		ResourceTypes: []wire.ResourceType{{Type: "registry-image",
			Image: "k8s-image://docker.io/concourse/registry-image-resource:1.14.2", Version: "1.14.2"}},
	}
}

// TestTSAWorkers: workers registered over the TSA with the harness's key
// and an added one show in `fly workers` as the worker JSON says, and
// `fly land-worker` ends a landed worker's forward-worker with status 0.
func TestTSAWorkers(t *testing.T) {
	t.Parallel()
	w := ForTest(t, Options{HeartbeatInterval: time.Second, GCInterval: time.Second, Clients: []Client{{ID: "jetway", Secret: "s3cret"}}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	otherKey, err := w.AddWorkerKey(ctx, "other_worker_key")
	require.NoError(t, err)

	global := registerOverTSA(t, w, w.WorkerKey, stockWorker("target-a", "", "gpu", "big"))
	teamed := registerOverTSA(t, w, otherKey, stockWorker("target-b", Team))
	global.wait(t, "registered")
	teamed.wait(t, "registered")
	teamed.wait(t, "heartbeated")
	assert.Positive(t, teamed.lists.Load(), "the TSA listed containers and volumes")

	workers := w.Workers(t)
	slices.SortFunc(workers, func(a, b wire.Worker) int { return strings.Compare(a.Name, b.Name) })
	require.Len(t, workers, 2)
	for i, want := range []struct {
		name, team string
		tags       []string
	}{{"target-a", "", []string{"gpu", "big"}}, {"target-b", Team, nil}} {
		got := workers[i]
		assert.Equal(t, want.name, got.Name)
		assert.Equal(t, "running", got.State, got.Name)
		assert.Equal(t, want.team, got.Team, got.Name)
		assert.ElementsMatch(t, want.tags, got.Tags, got.Name)
		assert.Equal(t, "linux", got.Platform, got.Name)
		assert.Equal(t, "2.5", got.Version, got.Name)
		assert.Regexp(t, `^127\.0\.0\.1:\d+$`, got.GardenAddr, "the TSA's port for the garden forward")
		assert.Regexp(t, `^http://127\.0\.0\.1:\d+$`, got.BaggageclaimURL)
		assert.Equal(t, stockWorker("", "").ResourceTypes, got.ResourceTypes)
	}
	table, err := w.Fly("workers", "--details")
	require.NoError(t, err)
	assert.Contains(t, table, "target-a")

	out, err := w.Fly("land-worker", "-w", "target-b")
	require.NoError(t, err, out)
	select {
	case err := <-teamed.exited:
		assert.NoError(t, err, "a landed worker's forward-worker exits 0")
	case <-ctx.Done():
		t.Fatal("forward-worker did not end after land-worker")
	}
	for _, wk := range w.Workers(t) {
		if wk.Name == "target-b" {
			assert.Equal(t, "landed", wk.State)
		}
	}
}

// TestRESTWorker: a system client registers a worker over the REST API;
// the web node then lists it without any TSA.
func TestRESTWorker(t *testing.T) {
	t.Parallel()
	c := Client{ID: "jetway", Secret: "s3cret"}
	w := ForTest(t, Options{Clients: []Client{c}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	token, err := w.ClientToken(ctx, c)
	require.NoError(t, err)

	worker := stockWorker("target-rest", Team, "rest")
	worker.GardenAddr, worker.BaggageclaimURL = "127.0.0.1:1", "http://127.0.0.1:2"
	body, err := json.Marshal(worker)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/api/v1/workers?ttl=60s", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(answer))

	workers := w.Workers(t)
	require.Len(t, workers, 1)
	assert.Equal(t, "target-rest", workers[0].Name)
	assert.Equal(t, "running", workers[0].State)
	assert.Equal(t, Team, workers[0].Team)
	assert.Equal(t, []string{"rest"}, workers[0].Tags)
	assert.Equal(t, "127.0.0.1:1", workers[0].GardenAddr)
}
