package integration

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// loopbackWebNode is the test web node's network: it calls the workers
// from loopback.
var loopbackWebNode = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}

// concourseREST is a REST API client of web as gateway run's
// concourse-url settings make it, the client c's, the workers' listeners
// on loopback, heartbeating every heartbeat.
func concourseREST(t *testing.T, web *cwn.WebNode, c cwn.Client, heartbeat time.Duration) *concourse.REST {
	t.Helper()
	r, err := concourse.NewREST(concourse.RESTOptions{URL: web.URL, ClientID: c.ID, ClientSecret: concourse.Secret(c.Secret),
		Insecure: true, WorkerHost: "127.0.0.1", WebNodeNetworks: loopbackWebNode, HeartbeatInterval: heartbeat})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	return r
}

// TestTargetsAreConcourseWorkersOverREST: registered through the web
// node's REST API instead of its TSA, jetway's running targets are its
// workers in fly, with their team, tags and platform, at the addresses of
// jetway's own listeners, which the web node calls; jetway's heartbeats
// keep them running past their TTL, and without them they stall; fly
// land-worker lands the target in jetway; jetway's land and retire, and
// the garbage-collection rounds, reach the web node.
func TestTargetsAreConcourseWorkersOverREST(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "rest-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second})
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "cwrest-plain", "{}\n", "")
	placeTarget(ctx, t, clusters[0], dir, "cwrest-team", "team: main\n", "")
	placeTarget(ctx, t, clusters[1], dir, "cwrest-tagged", "tags: [gpu, big]\n", "")
	rest := concourseREST(t, web, client, 2*time.Second) // a TTL of 4 s
	g := startGateway(t, dir, gatewayOptions{concourse: rest, sweep: time.Second})

	for name, want := range map[string]struct {
		team string
		tags []string
	}{"cwrest-plain": {}, "cwrest-team": {team: "main"}, "cwrest-tagged": {tags: []string{"gpu", "big"}}} {
		w := flyWorker(t, web, name, 30*time.Second, workerIn("running"))
		assert.Equal(t, want.team, w.Team, name)
		assert.ElementsMatch(t, want.tags, w.Tags, name)
		assert.Equal(t, "linux", w.Platform, name)
		assert.Equal(t, "2.5", w.Version, name)
		assert.Regexp(t, `^127\.0\.0\.1:\d+$`, w.GardenAddr, "jetway's own listener")
		assert.Regexp(t, `^http://127\.0\.0\.1:\d+$`, w.BaggageclaimURL, "jetway's own listener")
	}

	// The web node calls the workers at the addresses registered: a step
	// placed on one looks its container up with a Garden list, makes its
	// volumes (in the target's volume holder), then asks Garden to create
	// the container and runs the task in it.
	task := filepath.Join(t.TempDir(), "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox\nrun: {path: echo, args: [hi]}\n"))
	out, err := web.Fly("execute", "-c", task, "--tag", "gpu")
	require.NoError(t, err, out)
	assert.Contains(t, out, "hi\r\n")
	assertWebNodeListsGarden(ctx, t, web, client, task)

	// Heartbeats keep every worker running past its TTL: once a worker
	// has heartbeated for two TTLs more, every one is still running in
	// fly, each on the registration it had (not registered anew).
	regs := map[string]time.Time{}
	for name, tg := range g.targetsByName(t) {
		if tg.Concourse != nil {
			regs[name] = tg.Concourse.Since
		}
	}
	before := g.targetsByName(t)["cwrest-plain"].Concourse
	require.NotNil(t, before)
	eventually(t, 4*rest.TTL(), func() error {
		now := g.targetsByName(t)["cwrest-plain"].Concourse
		if now == nil || now.LastHeartbeat.Before(before.LastHeartbeat.Add(2*rest.TTL())) {
			return errorf("cwrest-plain's registration %+v: not heartbeated for two TTLs since %s yet", now, before.LastHeartbeat)
		}
		return nil
	})
	for _, w := range web.Workers(t) {
		require.Equal(t, "running", w.State, "%s past its TTL, heartbeated", w.Name)
	}
	for name, tg := range g.targetsByName(t) {
		if since, ok := regs[name]; ok {
			require.NotNil(t, tg.Concourse, name)
			assert.Equal(t, concourse.StateRunning, tg.Concourse.State, name)
			assert.True(t, tg.Concourse.Since.Equal(since), "%s registered anew: %s, then %s", name, since, tg.Concourse.Since)
		}
	}

	// The registrations' garbage-collection rounds go through the REST
	// API too; so do the sweeps' calls made here: the web node has
	// nothing for the worker to destroy, and takes its reports.
	eventually(t, 10*time.Second, func() error {
		for _, kind := range []string{"containers", "volumes"} {
			if n := metricValue(t, g, `jetway_concourse_sweeps_total{kind="`+kind+`",result="ok"}`); n < 3 {
				return errorf("%v rounds for %s, want 3 or more (one per worker)", n, kind)
			}
		}
		return nil
	})
	for _, kind := range []string{"containers", "volumes"} {
		assert.Zero(t, metricValue(t, g, `jetway_concourse_sweeps_total{kind="`+kind+`",result="error"}`), kind)
	}
	for _, command := range []string{"report-containers", "report-volumes", "sweep-containers", "sweep-volumes"} {
		out, err := rest.Command(ctx, command, wire.Worker{Name: "cwrest-plain"})
		require.NoError(t, err, command)
		if strings.HasPrefix(command, "sweep") {
			assert.Regexp(t, regexp.MustCompile(`^(null|\[\])$`), strings.TrimSpace(string(out)), command)
		}
	}

	bothWays(t, web, g, "cwrest-plain", "cwrest-team", "cwrest-tagged")
	eventually(t, 10*time.Second, func() error {
		land := metricValue(t, g, `jetway_concourse_commands_total{command="land-worker",result="ok"}`)
		retire := metricValue(t, g, `jetway_concourse_commands_total{command="retire-worker",result="ok"}`)
		if land != 1 || retire != 1 {
			return errorf("commands: land-worker %v, retire-worker %v; want one each", land, retire)
		}
		return nil
	})

	// Without jetway's heartbeats, a worker stalls within its TTL (and
	// the web node's next look): what kept them running was jetway.
	g.stop()
	flyWorker(t, web, "cwrest-plain", rest.TTL()+10*time.Second, workerIn("stalled"))
}

// TestConcourseRESTFailuresAreNamed: a wrong client secret, a client the
// web node does not take for a worker's, and a web node nobody answers at
// each leave the registration failing with a reason that names what is
// wrong, and never the secret; nothing is registered.
func TestConcourseRESTFailuresAreNamed(t *testing.T) {
	good := cwn.Client{ID: "jetway", Secret: "rest-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{good}, Args: []string{"--add-client", "user-like:its-s3cret"}})
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := "http://" + closed.Addr().String()
	closed.Close()
	running := []targets.Status{{Name: "cwrf", State: targets.StateRunning, StartTime: time.Now()}}
	for _, tc := range []struct {
		name   string
		url    string
		client cwn.Client
		want   []string
	}{
		{"a wrong client secret", web.URL, cwn.Client{ID: "jetway", Secret: "wrong-s3cret"},
			[]string{"token for client jetway: the web node answered 401 Unauthorized", "--add-client"}},
		{"a client that is not a system client", web.URL, cwn.Client{ID: "user-like", Secret: "its-s3cret"},
			[]string{"register: POST /api/v1/workers: the web node answered 403 Forbidden", "--system-claim-value"}},
		{"nobody at the URL", nobody, good, []string{"reach the web node at " + nobody}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rest, err := concourse.NewREST(concourse.RESTOptions{URL: tc.url, ClientID: tc.client.ID, Insecure: true,
				ClientSecret: concourse.Secret(tc.client.Secret), WorkerHost: "127.0.0.1", WebNodeNetworks: loopbackWebNode})
			require.NoError(t, err)
			defer rest.Close()
			logs := &syncBuffer{}
			r := concourse.New(concourse.Options{Web: rest, Targets: staticTargets(running),
				RetryMin: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(logs, nil))})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- r.Start(ctx) }()
			defer func() { cancel(); require.NoError(t, <-done) }()
			eventually(t, 20*time.Second, func() error {
				reg, ok := r.Registration("cwrf")
				if !ok || reg.State != concourse.StateFailing {
					return errorf("registration %+v, want failing", reg)
				}
				for _, w := range tc.want {
					if !strings.Contains(reg.Error, w) {
						return errorf("registration %+v, want failing with %q", reg, w)
					}
				}
				return nil
			})
			reg, _ := r.Registration("cwrf")
			assert.NotContains(t, reg.Error, tc.client.Secret)
			assert.Contains(t, logs.String(), "registration with the web node failed")
			assert.NotContains(t, logs.String(), tc.client.Secret)
		})
	}
	assert.Empty(t, web.Workers(t), "nothing registered")
}

// assertWebNodeListsGarden registers a worker over REST whose Garden
// counts its lists and whose heartbeat is a minute away, and places a step
// on it: the web node's own Garden list reaches the listener registered.
func assertWebNodeListsGarden(ctx context.Context, t *testing.T, web *cwn.WebNode, client cwn.Client, task string) {
	t.Helper()
	var lists atomic.Int64
	garden := http.NewServeMux()
	garden.HandleFunc("GET /containers", func(w http.ResponseWriter, _ *http.Request) {
		lists.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"handles":[]}`)
	})
	volumes := http.NewServeMux()
	volumes.HandleFunc("GET /volumes", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `[]`)
	})
	volumes.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"the probe has no volumes"}`, http.StatusNotImplemented)
	})
	probe := concourseREST(t, web, client, time.Minute)
	fctx, stop := context.WithCancel(ctx)
	registered := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- probe.Forward(fctx, wire.Worker{Name: "cwrest-probe", Platform: "linux", Tags: []string{"probe"},
			Version: wire.WorkerVersion}, garden, volumes, func(e concourse.Event) {
			if e.Type == "registered" {
				registered <- struct{}{}
			}
		})
	}()
	defer func() { stop(); assert.ErrorIs(t, <-done, context.Canceled) }()
	select {
	case <-registered:
	case err := <-done:
		t.Fatalf("the probe's registration: %v", err)
	}
	ownLists := lists.Load() // the registration's own, through the listener
	out, err := web.Fly("execute", "-c", task, "--tag", "probe")
	require.Error(t, err)
	assert.Contains(t, err.Error()+out, "the probe has no volumes")
	assert.Greater(t, lists.Load(), ownLists, "the web node listed the probe's containers")
	_, err = probe.Command(ctx, "delete-worker", wire.Worker{Name: "cwrest-probe"})
	require.NoError(t, err)
	flyWorker(t, web, "cwrest-probe", 10*time.Second, func(_ wire.Worker, found bool) bool { return !found })
}

// TestRESTWorkersAdmitOnlyTheWebNode: with concourse-web-node-networks,
// the workers' listeners (on 127.0.0.2 here) serve the gateway's own
// lists, so the worker runs, but close on the web node's calls when it
// is outside those networks: a build placed there reaches nothing (no
// volume holder is made) and the refusals are counted. With the web
// node's own network (127.0.0.1/32) the same build reaches the worker.
func TestRESTWorkersAdmitOnlyTheWebNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "rest-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second})
	dir := t.TempDir()
	const name = "cwrest-nets"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	// Each REST client counts its refusals on a registry of its own.
	refused := func(reg *prometheus.Registry) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "jetway_concourse_refused_connections_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	rest := func(reg *prometheus.Registry, networks ...string) *concourse.REST {
		var nets []netip.Prefix
		for _, n := range networks {
			nets = append(nets, netip.MustParsePrefix(n))
		}
		r, err := concourse.NewREST(concourse.RESTOptions{URL: web.URL, ClientID: client.ID, ClientSecret: concourse.Secret(client.Secret),
			Insecure: true, WorkerHost: "127.0.0.2", HeartbeatInterval: 2 * time.Second, WebNodeNetworks: nets, Metrics: concourse.NewMetrics(reg)})
		require.NoError(t, err)
		t.Cleanup(r.Close)
		return r
	}
	reg, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	state := newState(t)
	g := startGateway(t, dir, gatewayOptions{concourse: rest(reg, "10.0.0.0/8"), state: state})
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	task := filepath.Join(t.TempDir(), "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox\nrun: {path: echo, args: [hi]}\n"))
	execute := func() (string, error) {
		fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
		defer fcancel()
		return web.FlyContext(fctx, "execute", "-c", task)
	}
	out, err := execute()
	require.Error(t, err, "the web node reached nothing: %s", out)
	assert.NotContains(t, out, "succeeded")
	assert.GreaterOrEqual(t, refused(reg), 1.0)
	_, err = clusters[0].Client.CoreV1().Pods(name).Get(ctx, steppod.HolderName("jetway"), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "no volume holder: %v", err)
	flyWorker(t, web, name, time.Second, workerIn("running"))

	g.stop()
	startGateway(t, dir, gatewayOptions{concourse: rest(reg2, "127.0.0.1/32"), state: state})
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	out, err = execute()
	require.NoError(t, err, out)
	assert.Contains(t, out, "hi\r\n")
	assert.Equal(t, 0.0, refused(reg2))
}

// TestConcourseWorkerOptions: a target's `concourse:` options reach an
// unmodified web node as a stock worker's flags do. Its proxies are in
// the worker's registration, and the web node gives them to the worker's
// containers: a task sees http_proxy, https_proxy and no_proxy (nothing
// is sent to them). The worker is ephemeral: once its heartbeats stop,
// the web node deletes it instead of keeping it stalled.
func TestConcourseWorkerOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "options-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}, GCInterval: time.Second})
	dir := t.TempDir()
	const name = "cw-options"
	placeTarget(ctx, t, clusters[0], dir, name, "concourse:\n  ephemeral: true\n  httpProxy: http://proxy.jetway.test:3128\n"+
		"  httpsProxy: http://proxy.jetway.test:3129\n  noProxy: localhost,.svc\n", "")
	rest := concourseREST(t, web, client, 2*time.Second) // a TTL of 4 s
	g := startGateway(t, dir, gatewayOptions{concourse: rest, sweep: time.Second, state: newState(t)})

	w := flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	assert.True(t, w.Ephemeral, "ephemeral")
	assert.Equal(t, "http://proxy.jetway.test:3128", w.HTTPProxyURL)
	assert.Equal(t, "http://proxy.jetway.test:3129", w.HTTPSProxyURL)
	assert.Equal(t, "localhost,.svc", w.NoProxy)

	task := filepath.Join(t.TempDir(), "env.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox#1.36\nrun: {path: sh, args: [-c, 'env | grep -i _proxy= | sort']}\n"))
	fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
	out, err := web.FlyContext(fctx, "execute", "-c", task)
	fcancel()
	require.NoError(t, err, out)
	for _, env := range []string{"http_proxy=http://proxy.jetway.test:3128", "https_proxy=http://proxy.jetway.test:3129", "no_proxy=localhost,.svc"} {
		assert.Contains(t, out, env+"\r\n", "the task's environment")
	}

	g.stop()
	flyWorker(t, web, name, rest.TTL()+20*time.Second, func(_ wire.Worker, found bool) bool { return !found })
}
