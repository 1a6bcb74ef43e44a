package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"code.cloudfoundry.org/garden"
	gclient "code.cloudfoundry.org/garden/client"
	gconn "code.cloudfoundry.org/garden/client/connection"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// concourseTSA is a TSA client of web with its keys, as gateway run's
// concourse-* settings make it.
func concourseTSA(t *testing.T, web *cwn.WebNode) *concourse.TSA {
	t.Helper()
	hostKeys, err := concourse.LoadHostKeys(web.TSAPublicKey)
	require.NoError(t, err)
	key, err := concourse.LoadWorkerKey(web.WorkerKey)
	require.NoError(t, err)
	return &concourse.TSA{Addrs: []string{web.TSAAddr}, HostKeys: hostKeys, Key: key}
}

// flyWorker waits until fly lists worker name satisfying ok, and returns
// it.
func flyWorker(t *testing.T, web *cwn.WebNode, name string, within time.Duration, ok func(wire.Worker, bool) bool) wire.Worker {
	t.Helper()
	var last wire.Worker
	eventually(t, within, func() error {
		workers := web.Workers(t)
		i := slices.IndexFunc(workers, func(w wire.Worker) bool { return w.Name == name })
		found := i >= 0
		if found {
			last = workers[i]
		}
		if !ok(last, found) {
			return errorf("fly workers: %s is %+v (listed: %v)", name, last, found)
		}
		return nil
	})
	return last
}

func workerIn(state string) func(wire.Worker, bool) bool {
	return func(w wire.Worker, found bool) bool { return found && w.State == state }
}

// TestTargetsAreConcourseWorkers: an unmodified Concourse v8.2.5 web node
// lists jetway's running targets as its workers, with their team, tags and
// platform, through real fly; fly land-worker lands the target in jetway,
// which registers it again only once resumed; jetway's land and retire
// reach the web node.
func TestTargetsAreConcourseWorkers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second, GCInterval: time.Second})
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "cw-plain", "{}\n", "")
	placeTarget(ctx, t, clusters[0], dir, "cw-team", "team: main\n", "")
	placeTarget(ctx, t, clusters[1], dir, "cw-tagged", "tags: [gpu, big]\n", "")
	placeTarget(ctx, t, clusters[2], dir, "cw-stall", "{}\n", "")
	state := newState(t)
	g := startGateway(t, dir, gatewayOptions{concourse: concourseTSA(t, web), state: state})

	for name, want := range map[string]struct {
		team string
		tags []string
	}{"cw-plain": {}, "cw-team": {team: "main"}, "cw-tagged": {tags: []string{"gpu", "big"}}, "cw-stall": {}} {
		w := flyWorker(t, web, name, 30*time.Second, workerIn("running"))
		assert.Equal(t, want.team, w.Team, name)
		assert.ElementsMatch(t, want.tags, w.Tags, name)
		assert.Equal(t, "linux", w.Platform, name)
		assert.Equal(t, "2.5", w.Version, name)
	}
	details, err := web.Fly("workers", "--details")
	require.NoError(t, err)
	assert.Contains(t, details, "cw-tagged")
	eventually(t, 10*time.Second, func() error {
		tg := g.targetsByName(t)["cw-plain"]
		if tg.Concourse == nil || tg.Concourse.State != concourse.StateRunning || tg.Concourse.LastHeartbeat.IsZero() {
			return errorf("cw-plain's registration: %+v", tg.Concourse)
		}
		return nil
	})

	bothWays(t, web, g, "cw-plain", "cw-team", "cw-tagged")
	// A target whose API server is gone stalls here, and so, no longer
	// registered, on the web node, where fly prune-worker removes it; it
	// registers again once it runs again.
	clusters[2].StopAPIServer()
	g.waitTarget(t, "cw-stall", 20*time.Second, func(tg api.Target) bool { return tg.State == "stalled" })
	flyWorker(t, web, "cw-stall", 30*time.Second, workerIn("stalled"))
	_, err = web.Fly("prune-worker", "-w", "cw-stall")
	require.NoError(t, err)
	flyWorker(t, web, "cw-stall", 10*time.Second, func(_ wire.Worker, found bool) bool { return !found })
	require.NoError(t, clusters[2].StartAPIServer(ctx))
	flyWorker(t, web, "cw-stall", 30*time.Second, workerIn("running"))

	// A target gone from the targets directory is deleted from the web
	// node, running (cw-plain) or landed here (cw-team, registered no more),
	// and the records of its containers (made through its Garden API, as
	// the web node would) are forgotten with it; another's stay.
	records := func(target string) int {
		list, err := clusters[0].Client.CoreV1().Secrets(state.namespace).List(ctx,
			metav1.ListOptions{LabelSelector: ownership.WorkerLabel + "=" + target})
		require.NoError(t, err)
		return len(list.Items)
	}
	for _, name := range []string{"cw-plain", "cw-tagged"} {
		srv := httptest.NewServer(g.containers.API(name))
		defer srv.Close()
		_, err := gclient.New(gconn.New("tcp", strings.TrimPrefix(srv.URL, "http://"))).Create(
			garden.ContainerSpec{Handle: name + "-kept", Image: garden.ImageRef{URI: "docker:///busybox"}})
		require.NoError(t, err, name)
		require.Equal(t, 1, records(name), name)
	}
	for _, name := range []string{"cw-plain", "cw-team"} {
		require.NoError(t, os.RemoveAll(filepath.Join(dir, name)))
	}
	for _, name := range []string{"cw-plain", "cw-team"} {
		flyWorker(t, web, name, 30*time.Second, func(_ wire.Worker, found bool) bool { return !found })
	}
	flyWorker(t, web, "cw-stall", time.Second, workerIn("running"))
	eventually(t, 10*time.Second, func() error {
		if n := records("cw-plain"); n != 0 {
			return errorf("%d container records of cw-plain, deleted on the web node", n)
		}
		return nil
	})
	assert.Equal(t, 1, records("cw-tagged"), "a running worker's records stay")

	eventually(t, 10*time.Second, func() error {
		land := metricValue(t, g, `jetway_concourse_commands_total{command="land-worker",result="ok"}`)
		retire := metricValue(t, g, `jetway_concourse_commands_total{command="retire-worker",result="ok"}`)
		if del := metricValue(t, g, `jetway_concourse_commands_total{command="delete-worker",result="ok"}`); del != 2 {
			return errorf("TSA commands: delete-worker %v, want 2", del)
		}
		if land != 1 || retire != 1 {
			return errorf("TSA commands: land-worker %v, retire-worker %v; want one each (a landing the web node made is not told back)", land, retire)
		}
		return nil
	})
}

// staticTargets are targets that do not change (for a Registrar alone).
type staticTargets []targets.Status

func (s staticTargets) Snapshot() []targets.Status { return s }
func (s staticTargets) Changed() <-chan struct{}   { return nil }

// TestConcourseRegistrationFailuresAreNamed: a worker key the TSA does
// not authorize, a TSA whose host key is not the one configured, and a TSA
// nobody answers at each leave the registration failing with a reason
// that names what is wrong, tried again; a good one beside them runs.
func TestConcourseRegistrationFailuresAreNamed(t *testing.T) {
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second})
	good := concourseTSA(t, web)
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	strangerKey, err := ssh.NewSignerFromKey(stranger)
	require.NoError(t, err)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := closed.Addr().String()
	closed.Close()
	running := []targets.Status{{Name: "cwf", State: targets.StateRunning, StartTime: time.Now()}}
	for _, tc := range []struct {
		name string
		tsa  concourse.TSA
		want string
	}{
		{"a worker key the TSA does not authorize", concourse.TSA{Addrs: good.Addrs, HostKeys: good.HostKeys, Key: strangerKey},
			"is the worker key in its --tsa-authorized-keys?"},
		{"another host key", concourse.TSA{Addrs: good.Addrs, HostKeys: []ssh.PublicKey{strangerKey.PublicKey()}, Key: good.Key},
			"the TSA's host key is not the one configured"},
		{"nobody at the address", concourse.TSA{Addrs: []string{nobody}, HostKeys: good.HostKeys, Key: good.Key}, "reach the TSA at " + nobody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := concourse.New(concourse.Options{Web: tc.tsa, Targets: staticTargets(running),
				RetryMin: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- r.Start(ctx) }()
			defer func() { cancel(); require.NoError(t, <-done) }()
			eventually(t, 20*time.Second, func() error {
				reg, ok := r.Registration("cwf")
				if !ok || reg.State != concourse.StateFailing || !strings.Contains(reg.Error, tc.want) {
					return errorf("registration %+v, want failing with %q", reg, tc.want)
				}
				return nil
			})
		})
	}
	assert.Empty(t, web.Workers(t), "nothing registered")
}

// TestReplicasRegisterEachTargetOnce: of two gateways sharing targets,
// one registers them (the placer Lease's holder); when it stops, the other
// registers them within seconds, and the web node keeps them running.
func TestReplicasRegisterEachTargetOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second})
	dir := t.TempDir()
	names := []string{"cwr-a", "cwr-b"}
	for i, name := range names {
		placeTarget(ctx, t, clusters[i], dir, name, "{}\n", "")
	}
	tsa := concourseTSA(t, web)
	a := startGateway(t, dir, gatewayOptions{identity: "replica-a", concourse: tsa})
	b := startGateway(t, dir, gatewayOptions{identity: "replica-b", concourse: tsa})
	for _, name := range names {
		flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	}
	i := oneRegisters(t, []string{a.base, b.base}, names, 10*time.Second)
	holder, other := []*gateway{a, b}[i], []*gateway{a, b}[1-i]

	holder.stop()
	eventually(t, 30*time.Second, func() error {
		if n, err := registeredOn(other.base, names); err != nil || n != len(names) {
			return errorf("%d of %d registered by the replica left (%v)", n, len(names), err)
		}
		return nil
	})
	for _, name := range names {
		flyWorker(t, web, name, 10*time.Second, workerIn("running"))
	}
}

// TestLandedFromConcourseWithAStepRunning: fly land-worker on a target
// with a step still running lands it in jetway: landing while the step
// runs, landed once it ended; it stays landed, and unregistered, across a
// gateway restart, and gateway resume brings it back running in fly.
func TestLandedFromConcourseWithAStepRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second, GCInterval: time.Second})
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, "cwl", "{}\n", "")
	tsa := concourseTSA(t, web)
	g := startGateway(t, dir, gatewayOptions{concourse: tsa})
	flyWorker(t, web, "cwl", 30*time.Second, workerIn("running"))

	// The step runs until the test lets it end (kwok runs it here).
	release := filepath.Join(t.TempDir(), "release")
	g.run(t, shStep("long", "while [ ! -e "+release+" ]; do sleep 0.1; done; echo done"))
	g.waitPhase(t, "long", "running")
	_, err := web.Fly("land-worker", "-w", "cwl")
	require.NoError(t, err)
	g.waitTarget(t, "cwl", 20*time.Second, func(tg api.Target) bool { return tg.State == "landing" })
	assert.Equal(t, "running", string(g.step(t, "long").Phase), "landing waits for the step")
	require.NoError(t, os.WriteFile(release, nil, 0o644))
	g.waitTarget(t, "cwl", 30*time.Second, func(tg api.Target) bool { return tg.State == "landed" })
	assert.Equal(t, "succeeded", string(g.step(t, "long").Phase))
	flyWorker(t, web, "cwl", 10*time.Second, workerIn("landed"))

	addr := strings.TrimPrefix(g.base, "http://")
	g.stop()
	g = startGateway(t, dir, gatewayOptions{concourse: tsa, listen: addr})
	g.waitTarget(t, "cwl", 20*time.Second, func(tg api.Target) bool { return tg.State == "landed" })
	assert.Nil(t, g.targetsByName(t)["cwl"].Concourse, "a landed target is not registered")
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/targets/cwl/resume", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, "cwl", 30*time.Second, workerIn("running"))
}

// TestConcourseSweepDestroysOnlyWhatJetwayMade: each registration sweeps
// with the web node as Concourse's workers do. It reports the containers
// jetway holds for the target (the pods it sealed with a handle); the web
// node marks one it does not know for destruction and names it at the
// sweep, and jetway deletes that pod. A pod planted with the same handle,
// or with another, is never reported and never deleted.
func TestConcourseSweepDestroysOnlyWhatJetwayMade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second})
	dir := t.TempDir()
	const name = "cwg"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{concourse: concourseTSA(t, web), sweep: 500 * time.Millisecond})
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))

	pods := clusters[0].Client.CoreV1().Pods(name)
	container := func(pod, handle string, sealed bool) {
		labels := teamLabels(name, "jetway", "")
		labels[concourse.ContainerLabel] = handle
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: name, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: "example.invalid/step"}}}}
		if sealed {
			p.Annotations = jetwayAnnotations(name, pod, "")
			createJetwayPod(ctx, t, clusters[0], name, p)
			return
		}
		_, err := pods.Create(ctx, p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// The planted pods first: the gateway's watch shows them before its
	// own container, so the destroy naming the handle sees the twin.
	const handle, plantedHandle = "3f1b9c1e-6a52-4d0e-9a51-0c1f1f7e2a10", "8d2a6b7c-1e4f-4b3a-8c9d-2e5f6a7b8c9d"
	container("c-twin", handle, false)
	container("c-planted", plantedHandle, false)
	container("c-ours", handle, true)

	destroyed := `jetway_concourse_destroyed_total{kind="containers",result="destroyed"}`
	notOurs := `jetway_concourse_destroyed_total{kind="containers",result="not-ours"}`
	eventually(t, 30*time.Second, func() error {
		if _, err := pods.Get(ctx, "c-ours", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("c-ours, which the web node does not know, still there (%v)", err)
		}
		return nil
	})
	assert.Equal(t, 0.0, metricValue(t, g, destroyed), "the twin's refusal is counted instead")
	assert.Equal(t, 1.0, metricValue(t, g, notOurs), "the twin carrying the handle was refused")

	// Two more rounds: the planted handle was never reported, so the web
	// node never names it; both planted pods stay.
	swept := `jetway_concourse_sweeps_total{kind="containers",result="ok"}`
	rounds := metricValue(t, g, swept)
	eventually(t, 30*time.Second, func() error {
		if n := metricValue(t, g, swept); n < rounds+2 {
			return errorf("%v sweeps, want %v", n, rounds+2)
		}
		return nil
	})
	assert.Equal(t, 1.0, metricValue(t, g, notOurs), "the planted handle was never named")
	for _, pod := range []string{"c-twin", "c-planted"} {
		_, err := pods.Get(ctx, pod, metav1.GetOptions{})
		assert.NoError(t, err, "%s, planted, is left alone", pod)
	}
	assert.Contains(t, g.logs.String(), "the web node named something to destroy that jetway did not make")
}

// TestConcourseRegistrationOutlivesAKilledReplica: two `gateway run`
// processes share targets as the chart runs them; one registers them (the
// placer Lease's holder). SIGKILLed, it says nothing to the web node: the
// other takes the Lease over and registers the targets within seconds,
// and the web node lists them running; started again, the killed one
// registers nothing while the other does.
func TestConcourseRegistrationOutlivesAKilledReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 5 * time.Second})
	dir := t.TempDir()
	names := []string{"cwk-a", "cwk-b"}
	for i, name := range names {
		placeTarget(ctx, t, clusters[i], dir, name, "{}\n", "")
	}
	rs := replicas(t, dir, "--concourse-tsa", web.TSAAddr, "--concourse-tsa-public-key", web.TSAPublicKey,
		"--concourse-worker-key", web.WorkerKey)
	for _, name := range names {
		flyWorker(t, web, name, time.Minute, workerIn("running"))
	}
	bases := []string{rs[0].base(), rs[1].base()}
	i := oneRegisters(t, bases, names, 30*time.Second)
	holder, other := rs[i], rs[1-i]
	// A build's upload lands in a volume holder through the registering
	// replica; the web node keeps the artifact's volume.
	work := t.TempDir()
	writeFile(t, filepath.Join(work, "in", "payload"), []byte("kept\n"))
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox\ninputs: [{name: in}]\nrun: {path: echo, args: [ran]}\n"))
	execute := func() string {
		fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
		defer fcancel()
		out, err := web.FlyContext(fctx, "execute", "-c", task, "-i", "in="+filepath.Join(work, "in"))
		require.NoError(t, err, out)
		return out
	}
	assert.Contains(t, execute(), "ran\r\n")
	uploads := map[string]string{} // artifact volume -> its worker
	for _, v := range flyVolumes(t, web) {
		if v.Type == "artifact" {
			uploads[v.ID] = v.WorkerName
		}
	}
	require.NotEmpty(t, uploads)

	holder.kill(t)
	eventually(t, 45*time.Second, func() error {
		if n, err := registeredOn(other.base(), names); err != nil || n != len(names) {
			return errorf("%s registers %d of %d (%v)", other.name, n, len(names), err)
		}
		return nil
	})
	for _, name := range names {
		flyWorker(t, web, name, 10*time.Second, workerIn("running"))
	}
	// The volumes outlived the replica that made them: in the holders,
	// which the other replica now serves, making more there.
	for id, worker := range uploads {
		c := clusters[slices.Index(names, worker)]
		root := c.StepRoot(worker, steppod.HolderName("jetway"))
		_, err := os.Stat(filepath.Join(root, "volumes", id))
		assert.NoError(t, err, "volume %s of %s", id, worker)
	}
	assert.Contains(t, execute(), "ran\r\n")

	holder.start(t)
	assert.Equal(t, 1-i, oneRegisters(t, bases, names, 30*time.Second), "the Lease stays with the replica that took it")
	for _, name := range names {
		flyWorker(t, web, name, 10*time.Second, workerIn("running"))
	}
}

// TestAgentsAreConcourseWorkers: an agent joined to a gateway is a worker
// of the gateway's web node, with its platform, tags and team; fly
// land-worker lands the agent itself, and gateway resume brings it back
// running in fly; an agent that left is no longer registered (the web
// node stalls it) and is registered again when it is back.
func TestAgentsAreConcourseWorkers(t *testing.T) {
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second, GCInterval: time.Second})
	ca := meshtest.NewCA(t, "cw-agents-ca")
	member := meshMember(t, ca, ca, "cw-agent-gw", "127.0.0.1:0")
	member.stallAfter = 2 * time.Second
	g := startGateway(t, t.TempDir(), gatewayOptions{identity: "cw-agent-gw", mesh: member,
		tokens: []api.Token{adminToken, mainToken}, concourse: concourseTSA(t, web)})
	ag := joinAgent(t, g, ca, "cw-mac", "--platform", "darwin", "--tag", "ios", "--team", "main")

	w := flyWorker(t, web, "cw-mac", 30*time.Second, workerIn("running"))
	assert.Equal(t, "darwin", w.Platform)
	assert.Equal(t, []string{"ios"}, w.Tags)
	assert.Equal(t, "main", w.Team)

	_, err := web.Fly("land-worker", "-w", "cw-mac")
	require.NoError(t, err)
	waitWorker(t, g, "cw-mac", "landed")
	flyWorker(t, web, "cw-mac", 10*time.Second, workerIn("landed"))
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/targets/cw-mac/resume", adminToken.Token)
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, "cw-mac", 30*time.Second, workerIn("running"))

	ag.kill(t)
	flyWorker(t, web, "cw-mac", 30*time.Second, workerIn("stalled"))
	ag.restart(t)
	flyWorker(t, web, "cw-mac", 30*time.Second, workerIn("running"))
}

// TestConcourseWorkerVersionMismatchIsNamed: a web node registers a
// worker of a version it never places work on without a word. Knowing the
// web node's URL, jetway reads its worker version first: workers of an
// older version, or of another major, are not registered, and the
// registration's error says why; a later minor version registers.
func TestConcourseWorkerVersionMismatchIsNamed(t *testing.T) {
	web := cwn.ForTest(t, cwn.Options{HeartbeatInterval: 2 * time.Second})
	tsa := concourseTSA(t, web)
	running := []targets.Status{{Name: "cwv", State: targets.StateRunning, StartTime: time.Now()}}
	start := func(version string) *concourse.Registrar {
		r := concourse.New(concourse.Options{Web: tsa, WebURL: web.URL, WorkerVersion: version, Targets: staticTargets(running),
			RetryMin: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Start(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		return r
	}
	for _, version := range []string{"2.4", "3.0"} {
		r := start(version)
		want := "worker version mismatch: the web node at " + web.URL + " (Concourse 8.2.5) places work only on workers of version 2.5 " +
			"or a later 2.x; jetway's workers are version " + version
		eventually(t, 20*time.Second, func() error {
			reg, ok := r.Registration("cwv")
			if !ok || reg.State != concourse.StateFailing || !strings.Contains(reg.Error, want) {
				return errorf("registration %+v, want failing with %q", reg, want)
			}
			return nil
		})
	}
	assert.Empty(t, web.Workers(t), "nothing registered")

	start("2.6")
	w := flyWorker(t, web, "cwv", 30*time.Second, workerIn("running"))
	assert.Equal(t, "2.6", w.Version)
}

// registeredOn is how many of the targets names the gateway at base
// registers, running.
func registeredOn(base string, names []string) (int, error) {
	resp, err := http.Get(base + "/api/v1/targets")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var list []api.Target
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return 0, err
	}
	n := 0
	for _, tg := range list {
		if slices.Contains(names, tg.Name) && tg.Concourse != nil && tg.Concourse.State == concourse.StateRunning {
			n++
		}
	}
	return n, nil
}

// oneRegisters waits until one of the gateways at bases registers every
// target of names and the others none, and returns its index.
func oneRegisters(t *testing.T, bases, names []string, within time.Duration) int {
	t.Helper()
	holder := -1
	eventually(t, within, func() error {
		var counts []int
		holders, others := 0, 0
		for i, base := range bases {
			n, err := registeredOn(base, names)
			if err != nil {
				return err
			}
			counts = append(counts, n)
			switch n {
			case len(names):
				holder, holders = i, holders+1
			case 0:
			default:
				others++
			}
		}
		if holders != 1 || others != 0 {
			return errorf("registered by each gateway: %v; want all on one", counts)
		}
		return nil
	})
	return holder
}

// bothWays checks lifecycle both ways on three registered targets: fly
// land-worker lands landed in jetway, and gateway resume registers it
// again; jetway's land of land reaches the web node, and its retire of
// retire removes the worker there.
func bothWays(t *testing.T, web *cwn.WebNode, g *gateway, landed, land, retire string) {
	t.Helper()
	_, err := web.Fly("land-worker", "-w", landed)
	require.NoError(t, err)
	g.waitTarget(t, landed, time.Minute, inState("landed"))
	reg := g.targetsByName(t)[landed].Concourse
	require.NotNil(t, reg)
	assert.Equal(t, concourse.StateLanded, reg.State)
	flyWorker(t, web, landed, 10*time.Second, workerIn("landed"))
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/targets/"+landed+"/resume", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, landed, 30*time.Second, workerIn("running"))

	code, body, _ = call(t, http.MethodPut, g.base+"/api/v1/workers/"+land+"/land", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, land, 30*time.Second, func(w wire.Worker, found bool) bool {
		return found && (w.State == "landing" || w.State == "landed")
	})
	code, body, _ = call(t, http.MethodPut, g.base+"/api/v1/workers/"+retire+"/retire", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, retire, 30*time.Second, func(_ wire.Worker, found bool) bool { return !found })
}

// TestConcourseBuildsOutliveARestart: two `gateway run` replicas
// registered over REST, a build's task running on the registering one's
// worker.
//
//   - SIGTERM (a rolling upgrade): the replica ends the registration,
//     then waits for the process the web node follows through it; the
//     task finishes there, its output shown once.
//   - SIGKILL: the web node's connection breaks; it attaches to the
//     process again by its ID, through the other replica once that
//     registers the worker, and the build finishes.
//
// Either way the build succeeds and the task ran once.
func TestConcourseBuildsOutliveARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "cwdrain"
	web, rs := restReplicas(ctx, t, name, "--shutdown-timeout", "60s")
	bases := []string{rs[0].base(), rs[1].base()}

	// build runs a task (kwok's step kubelet runs it on this machine: it
	// counts its runs in a file and waits for another), calls stop once it
	// runs, then releases it, and returns fly's output and the runs.
	build := func(t *testing.T, stop func()) (string, string) {
		task, runs, release := waitingTask(t, "platform: linux\nrootfs_uri: docker:///busybox\n")
		done := flyAsync(ctx, web, 3*time.Minute, "execute", "-c", task)
		awaitFile(t, runs, 90*time.Second)
		stop()
		writeFile(t, release, nil)
		var r flyResult
		select {
		case r = <-done:
		case <-ctx.Done():
			t.Fatal("fly execute did not end")
		}
		require.NoError(t, r.err, r.out)
		assert.Contains(t, r.out, "finished\r\n")
		assert.Contains(t, r.out, "succeeded")
		b, err := os.ReadFile(runs)
		require.NoError(t, err)
		return r.out, string(b)
	}

	i := oneRegisters(t, bases, []string{name}, 30*time.Second)
	holder := rs[i]
	out, runs := build(t, func() {
		// The task is released once the replica either waits for it or
		// has exited (what a stop without the wait did).
		require.NoError(t, holder.proc.cmd.Process.Signal(syscall.SIGTERM))
		for waiting := false; !waiting; {
			select {
			case line := <-holder.proc.lines:
				waiting = line["msg"] == "waiting for the processes the web node follows through this gateway"
			case err := <-holder.proc.done:
				holder.proc.done <- err
				t.Fatalf("the replica exited while the web node followed its process (%v)", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the replica neither waits for the process nor exits")
			}
		}
	})
	assert.Equal(t, "ran\n", runs, "the task ran once")
	assert.Equal(t, 1, strings.Count(out, "before\r\n"), "its output once: %s", out)
	require.NoError(t, holder.proc.wait(t, 30*time.Second), "a clean stop once the process ended")
	assert.Equal(t, 1, holder.logged("the processes the web node followed ended"))

	holder.start(t)
	i = oneRegisters(t, bases, []string{name}, 60*time.Second)
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	_, runs = build(t, func() { rs[i].kill(t) })
	assert.Equal(t, "ran\n", runs, "the task ran once")
}

// flyResult is what fly printed, and how it ended.
type flyResult struct {
	out string
	err error
}

// flyAsync runs fly with args, for at most within, while the test goes

// flyOK runs fly with args within the time given, which must succeed,
// and returns what it printed.
func flyOK(ctx context.Context, t *testing.T, web *cwn.WebNode, within time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	out, err := web.FlyContext(ctx, args...)
	require.NoError(t, err, out)
	return out
}

// on; its result comes on the channel.
func flyAsync(ctx context.Context, web *cwn.WebNode, within time.Duration, args ...string) <-chan flyResult {
	done := make(chan flyResult, 1)
	go func() {
		fctx, fcancel := context.WithTimeout(ctx, within)
		defer fcancel()
		out, err := web.FlyContext(fctx, args...)
		done <- flyResult{out, err}
	}()
	return done
}

// awaitFile waits until file is there (a task on this machine made it).
func awaitFile(t *testing.T, file string, within time.Duration) {
	t.Helper()
	eventually(t, within, func() error {
		if _, err := os.Stat(file); err != nil {
			return errorf("the task has not made %s yet: %v", file, err)
		}
		return nil
	})
}

// waitingTask writes a task file of config (its platform, its image)
// whose process (on this machine: kwok's or an agent's) appends a line to
// runs, says before, waits until release is there and says finished.
func waitingTask(t *testing.T, config string) (task, runs, release string) {
	t.Helper()
	work := t.TempDir()
	task, runs, release = filepath.Join(work, "task.yml"), filepath.Join(work, "runs"), filepath.Join(work, "release")
	writeFile(t, task, []byte(config+"run: {path: sh, args: [-c, 'echo ran >> "+runs+
		"; echo before; while [ ! -e "+release+" ]; do sleep 0.1; done; echo finished']}\n"))
	return task, runs, release
}

// TestConcourseDrainOutlivesAKilledReplica: a worker offers the base
// resource types a stock v8.2.5 worker bundles. A target is landed while a
// build's task runs on it, and the replica registering it is SIGKILLed
// mid-drain. The other replica registers the worker again, as landing
// (not running: the web node keeps draining it); the web node attaches
// to the task again through it; the build succeeds, the task ran once,
// and the web node then lands the worker, which both replicas show
// landed.
func TestConcourseDrainOutlivesAKilledReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "cwkilldrain"
	web, rs := restReplicas(ctx, t, name)
	// With no concourse-resource-types, the base types a stock v8.2.5
	// worker bundles, as it registers them.
	w := flyWorker(t, web, name, 10*time.Second, workerIn("running"))
	assert.Equal(t, concourse.BundledResourceTypes, w.ResourceTypes)
	bases := []string{rs[0].base(), rs[1].base()}
	i := oneRegisters(t, bases, []string{name}, 30*time.Second)
	holder, other := rs[i], rs[1-i]

	task, runs, release := waitingTask(t, "platform: linux\nrootfs_uri: docker:///busybox\n")
	done := flyAsync(ctx, web, 3*time.Minute, "execute", "-c", task)
	awaitFile(t, runs, 90*time.Second)
	code, body, _ := call(t, http.MethodPut, other.base()+"/api/v1/workers/"+name+"/land", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, name, 30*time.Second, workerIn("landing"))

	holder.kill(t)
	eventually(t, 45*time.Second, func() error {
		if n, err := registeredOn(other.base(), []string{name}); err != nil || n != 1 {
			return errorf("%s does not register %s (%v)", other.name, name, err)
		}
		return nil
	})
	flyWorker(t, web, name, 10*time.Second, workerIn("landing"))
	writeFile(t, release, nil)
	res := <-done
	require.NoError(t, res.err, res.out)
	assert.Contains(t, res.out, "finished\r\n")
	assert.Contains(t, res.out, "succeeded")
	b, err := os.ReadFile(runs)
	require.NoError(t, err)
	assert.Equal(t, "ran\n", string(b), "the task ran once")

	flyWorker(t, web, name, time.Minute, workerIn("landed"))
	holder.start(t)
	for _, base := range bases {
		eventually(t, time.Minute, func() error {
			st, err := targetOn(base, name)
			if err != nil {
				return err
			}
			if st.State != "landed" {
				return errorf("%s: target %s is %s", base, name, st.State)
			}
			return nil
		})
	}
}

// restReplicas starts a web node and two replicas (with flags) sharing
// target name on the first cluster, registering it over the REST API,
// and waits until fly lists it running.
func restReplicas(ctx context.Context, t *testing.T, name string, flags ...string) (*cwn.WebNode, [2]*replica) {
	t.Helper()
	client := cwn.Client{ID: "jetway", Secret: name + "-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	secret := filepath.Join(t.TempDir(), "secret")
	writeFile(t, secret, []byte(client.Secret))
	rs := replicas(t, dir, append([]string{"--concourse-url", web.URL, "--concourse-client-id", client.ID,
		"--concourse-client-secret-file", secret, "--concourse-worker-address", "127.0.0.1",
		"--concourse-insecure", "--concourse-web-node-networks", "127.0.0.1"}, flags...)...)
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	return web, rs
}

// targetOn is target name as the gateway at base lists it.
func targetOn(base, name string) (api.Target, error) {
	resp, err := http.Get(base + "/api/v1/targets/" + name)
	if err != nil {
		return api.Target{}, err
	}
	defer resp.Body.Close()
	var tg api.Target
	if resp.StatusCode != http.StatusOK {
		return tg, errorf("GET %s/api/v1/targets/%s: %s", base, name, resp.Status)
	}
	return tg, json.NewDecoder(resp.Body).Decode(&tg)
}
