package concourse

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/httpjson"
	"github.com/jetway-ci/jetway/wire"
)

const testSecret = "s3cret+/="

// fakeWeb is the part of a web node's REST API a REST calls. The real web
// node is in the integration tests; this one tells what was asked.
type fakeWeb struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	issued    []string        // tokens, in order
	refused   map[string]bool // tokens the API answers 401
	expiresIn int
	calls     []string // "METHOD /path?query"
	bodies    [][]byte
	// heartbeat answers the nth heartbeat (from 1): status and state.
	heartbeat  func(n int) (int, string)
	beats      int
	registered wire.Worker
}

func newFakeWeb(t *testing.T) *fakeWeb {
	f := &fakeWeb{t: t, refused: map[string]bool{}, expiresIn: 3600,
		heartbeat: func(int) (int, string) { return http.StatusOK, "running" }}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeWeb) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.URL.Path == "/sky/issuer/token" {
		id, secret, _ := r.BasicAuth()
		form, _ := url.ParseQuery(string(body))
		if id != "jetway" || secret != url.QueryEscape(testSecret) || form.Get("grant_type") != "client_credentials" {
			// A careless server echoing what it got: the error must not.
			http.Error(w, `{"error":"invalid_client","got":"`+secret+`"}`, http.StatusUnauthorized)
			return
		}
		tok := fmt.Sprintf("token-%d", len(f.issued)+1)
		f.issued = append(f.issued, tok)
		httpjson.Write(w, http.StatusOK, map[string]any{"access_token": tok, "token_type": "bearer", "expires_in": f.expiresIn})
		return
	}
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if f.refused[tok] || !strings.HasPrefix(tok, "token-") {
		http.Error(w, "not authorized: "+tok, http.StatusUnauthorized)
		return
	}
	if len(body) > 0 && r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "parsed as a form", http.StatusBadRequest)
		return
	}
	f.calls = append(f.calls, r.Method+" "+r.URL.RequestURI())
	f.bodies = append(f.bodies, body)
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/workers":
		require.NoError(f.t, json.Unmarshal(body, &f.registered))
		w.WriteHeader(http.StatusOK)
	case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/heartbeat"):
		f.beats++
		code, state := f.heartbeat(f.beats)
		httpjson.Write(w, code, map[string]string{"name": "t", "state": state})
	case strings.HasSuffix(r.URL.Path, "/destroying"):
		httpjson.Write(w, http.StatusOK, []string{"h1", "h2"})
	case strings.HasSuffix(r.URL.Path, "/report"):
		w.WriteHeader(http.StatusNoContent)
	case strings.Contains(r.URL.Path, "/missing"):
		http.Error(w, strings.Repeat("x", 2*maxErrorBody), http.StatusNotFound)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

func (f *fakeWeb) rest(t *testing.T, opts RESTOptions) *REST {
	opts.URL, opts.ClientID, opts.WorkerHost, opts.Insecure = f.srv.URL, "jetway", "127.0.0.1", true
	if opts.ClientSecret == "" {
		opts.ClientSecret = testSecret
	}
	if opts.WebNodeNetworks == nil {
		opts.WebNodeNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	}
	r, err := NewREST(opts)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	return r
}

func (f *fakeWeb) callsSoFar() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeWeb) tokens() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.issued...)
}

func (f *fakeWeb) worker() wire.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registered
}

// forward runs Forward for worker t and returns its result and events.
func forward(ctx context.Context, r *REST) (error, []string) {
	var events []string
	err := r.Forward(ctx, wire.Worker{Name: "t", Platform: "linux", Version: wire.WorkerVersion}, gardenAPI("t", none{}, nil, nil), volumeAPI("t", none{}),
		func(e Event) { events = append(events, e.Type) })
	return err, events
}

// TestRESTForward: Forward registers the worker with the addresses its
// listeners got (which answer), heartbeats it, and ends as the web node
// says: nil when it is landed or gone, an error once heartbeats failed
// for the TTL, ctx's error when ctx ends, its listeners closed.
func TestRESTForward(t *testing.T) {
	for _, tt := range []struct {
		name      string
		heartbeat func(n int) (int, string)
		events    []string
		err       string
	}{
		{name: "landed at the third", heartbeat: func(n int) (int, string) {
			return http.StatusOK, map[bool]string{true: "landed", false: "landing"}[n == 3]
		}, events: []string{"registered", "heartbeated", "heartbeated", "heartbeated"}},
		{name: "retired: 404", heartbeat: func(n int) (int, string) {
			return map[bool]int{true: http.StatusNotFound, false: http.StatusOK}[n == 2], "running"
		}, events: []string{"registered", "heartbeated"}},
		{name: "failing for the TTL", heartbeat: func(int) (int, string) { return http.StatusInternalServerError, "" },
			events: []string{"registered"}, err: "no heartbeat for 200ms, the worker's TTL (the web node stalls it): heartbeat: PUT /api/v1/workers/t/heartbeat: the web node answered 500"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeWeb(t)
			f.heartbeat = tt.heartbeat
			r := f.rest(t, RESTOptions{HeartbeatInterval: 100 * time.Millisecond, RetryInterval: 20 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err, events := forward(ctx, r)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, tt.events, events)
			calls := f.callsSoFar()
			require.NotEmpty(t, calls)
			assert.Equal(t, "POST /api/v1/workers?ttl=200ms", calls[0])
			assert.Contains(t, calls[1:], "PUT /api/v1/workers/t/heartbeat?ttl=200ms")
			w := f.worker()
			assert.Regexp(t, `^127\.0\.0\.1:\d+$`, w.GardenAddr)
			assert.Regexp(t, `^http://127\.0\.0\.1:\d+$`, w.BaggageclaimURL)
			_, err = net.DialTimeout("tcp", w.GardenAddr, time.Second)
			assert.Error(t, err, "the listeners are closed once Forward returned")
		})
	}

	t.Run("ctx ends", func(t *testing.T) {
		f := newFakeWeb(t)
		reached := make(chan error, 1)
		f.heartbeat = func(int) (int, string) {
			// The web node reaches the worker's Garden at its address.
			resp, err := http.Get("http://" + f.registered.GardenAddr + "/containers")
			if err == nil {
				resp.Body.Close()
			}
			select {
			case reached <- err:
			default:
			}
			return http.StatusOK, "running"
		}
		r := f.rest(t, RESTOptions{HeartbeatInterval: 50 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { err, _ := forward(ctx, r); done <- err }()
		select {
		case err := <-reached:
			require.NoError(t, err)
		case err := <-done:
			t.Fatalf("Forward returned before a heartbeat: %v", err)
		}
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	})
}

// TestRESTToken: one token serves every call until three quarters of its
// lifetime, then a new one is fetched; a 401 fetches a new one once; a
// refused client or token fails naming the status, never the secret or
// the token.
func TestRESTToken(t *testing.T) {
	f := newFakeWeb(t)
	now := time.Now()
	r := f.rest(t, RESTOptions{Now: func() time.Time { return now }})
	ctx := context.Background()
	land := func() error { _, err := r.Command(ctx, "land-worker", wire.Worker{Name: "t"}); return err }

	require.NoError(t, land())
	require.NoError(t, land())
	assert.Equal(t, []string{"token-1"}, f.tokens(), "one token for both")
	now = now.Add(44 * time.Minute)
	require.NoError(t, land())
	assert.Len(t, f.tokens(), 1, "before three quarters of the hour")
	now = now.Add(2 * time.Minute)
	require.NoError(t, land())
	assert.Len(t, f.tokens(), 2, "after")

	f.mu.Lock()
	f.refused["token-2"] = true
	f.mu.Unlock()
	require.NoError(t, land(), "a 401 fetches a new token")
	assert.Len(t, f.tokens(), 3)

	f.mu.Lock()
	f.refused["token-3"], f.refused["token-4"] = true, true
	f.mu.Unlock()
	err := land()
	assert.ErrorContains(t, err, "land-worker t: PUT /api/v1/workers/t/land: the web node answered 401 Unauthorized: not authorized: [redacted]")
	assert.Len(t, f.tokens(), 4, "one new token, not more")

	wrong := f.rest(t, RESTOptions{ClientSecret: "wrong+secret"})
	_, err = wrong.Command(ctx, "land-worker", wire.Worker{Name: "t"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "token for client jetway: the web node answered 401 Unauthorized")
	assert.Contains(t, err.Error(), "is the client in the web node's --add-client")
	assert.NotContains(t, err.Error(), "wrong")
	shown, err := json.Marshal(struct{ ClientSecret Secret }{"x"})
	require.NoError(t, err)
	assert.Equal(t, `{"ClientSecret":"[redacted]"}`, string(shown))
	assert.Equal(t, "[redacted] [redacted] [redacted] [redacted] [redacted]",
		fmt.Sprintf("%v %s %#v %q %d", Secret("x"), Secret("x"), Secret("x"), Secret("x"), Secret("x")))
}

// TestRESTCommand: each TSA command is its REST call.
func TestRESTCommand(t *testing.T) {
	f := newFakeWeb(t)
	r := f.rest(t, RESTOptions{})
	w := wire.Worker{Name: "a b"}
	for _, tt := range []struct {
		command, call, body, out string
	}{
		{"land-worker", "PUT /api/v1/workers/a%20b/land", "", ""},
		{"retire-worker", "PUT /api/v1/workers/a%20b/retire", "", ""},
		{"delete-worker", "DELETE /api/v1/workers/a%20b", "", ""},
		{"report-containers h1 h2", "PUT /api/v1/containers/report?worker_name=a+b", `["h1","h2"]`, ""},
		{"report-volumes", "PUT /api/v1/volumes/report?worker_name=a+b", `[]`, ""},
		{"sweep-containers", "GET /api/v1/containers/destroying?worker_name=a+b", "", `["h1","h2"]`},
		{"sweep-volumes", "GET /api/v1/volumes/destroying?worker_name=a+b", "", `["h1","h2"]`},
	} {
		out, err := r.Command(context.Background(), tt.command, w)
		require.NoError(t, err, tt.command)
		assert.Equal(t, tt.out, strings.TrimSpace(string(out)), tt.command)
		f.mu.Lock()
		assert.Equal(t, tt.call, f.calls[len(f.calls)-1], tt.command)
		assert.Equal(t, tt.body, string(f.bodies[len(f.bodies)-1]), tt.command)
		f.mu.Unlock()
	}
	_, err := r.Command(context.Background(), "land-worker", wire.Worker{Name: "missing"})
	assert.ErrorContains(t, err, "land-worker missing: PUT /api/v1/workers/missing/land: the web node answered 404 Not Found: xxx")
	assert.Less(t, len(err.Error()), maxErrorBody+200, "the body in an error is bounded")
	_, err = r.Command(context.Background(), "forward-worker", w)
	assert.ErrorContains(t, err, "forward-worker: not a command jetway sends the web node")
}

// A REST registration refuses to open listeners that anyone may reach,
// and to send its client's secret over plain http unless told it may.
func TestNewRESTRefusesOpenListenersAndPlainHTTP(t *testing.T) {
	nets := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")}
	for name, tt := range map[string]struct {
		o   RESTOptions
		err string
	}{
		"https":            {RESTOptions{URL: "https://ci.example.com", WebNodeNetworks: nets}, ""},
		"http, allowed":    {RESTOptions{URL: "http://ci.example.com", Insecure: true, WebNodeNetworks: nets}, ""},
		"http":             {RESTOptions{URL: "http://ci.example.com", WebNodeNetworks: nets}, `"http://ci.example.com" is http://: the client secret would travel unencrypted`},
		"no web node nets": {RESTOptions{URL: "https://ci.example.com"}, "no web node networks: the workers' listeners take no credential"},
	} {
		t.Run(name, func(t *testing.T) {
			o := tt.o
			o.ClientID, o.ClientSecret, o.WorkerHost = "jetway", testSecret, "127.0.0.1"
			r, err := NewREST(o)
			if tt.err == "" {
				require.NoError(t, err)
				r.Close()
				return
			}
			assert.ErrorContains(t, err, tt.err)
		})
	}
}
