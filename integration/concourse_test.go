package integration

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
)

// concourseTSA is a TSA client of web with its keys, as gateway run's
// concourse-* settings make it.
func concourseTSA(t *testing.T, web *cwn.WebNode) *concourse.TSA {
	t.Helper()
	hostKeys, err := concourse.LoadHostKeys(web.TSAPublicKey)
	require.NoError(t, err)
	key, err := concourse.LoadWorkerKey(web.WorkerKey)
	require.NoError(t, err)
	return &concourse.TSA{Addr: web.TSAAddr, HostKeys: hostKeys, Key: key}
}

// flyWorker waits until fly lists worker name satisfying ok, and returns
// it.
func flyWorker(t *testing.T, web *cwn.WebNode, name string, within time.Duration, ok func(cwn.Worker, bool) bool) cwn.Worker {
	t.Helper()
	var last cwn.Worker
	eventually(t, within, func() error {
		workers := web.Workers(t)
		i := slices.IndexFunc(workers, func(w cwn.Worker) bool { return w.Name == name })
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

func workerIn(state string) func(cwn.Worker, bool) bool {
	return func(w cwn.Worker, found bool) bool { return found && w.State == state }
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
	g := startGateway(t, dir, gatewayOptions{concourse: concourseTSA(t, web)})

	for name, want := range map[string]struct {
		team string
		tags []string
	}{"cw-plain": {}, "cw-team": {team: "main"}, "cw-tagged": {tags: []string{"gpu", "big"}}} {
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

	// Landed from the web node: the target lands in jetway too, and
	// stays unregistered while landed.
	_, err = web.Fly("land-worker", "-w", "cw-plain")
	require.NoError(t, err)
	g.waitTarget(t, "cw-plain", time.Minute, func(tg api.Target) bool { return tg.State == "landed" })
	tg := g.targetsByName(t)["cw-plain"]
	require.NotNil(t, tg.Concourse)
	assert.Equal(t, concourse.StateLanded, tg.Concourse.State)
	flyWorker(t, web, "cw-plain", 10*time.Second, workerIn("landed"))

	// Resumed in jetway: registered, running, again.
	code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/targets/cw-plain/resume", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, "cw-plain", 30*time.Second, workerIn("running"))

	// jetway's land reaches the web node; jetway's retire removes the
	// worker there.
	code, body, _ = call(t, http.MethodPut, g.base+"/api/v1/workers/cw-team/land", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, "cw-team", 30*time.Second, func(w cwn.Worker, found bool) bool {
		return found && (w.State == "landing" || w.State == "landed")
	})
	code, body, _ = call(t, http.MethodPut, g.base+"/api/v1/workers/cw-tagged/retire", "")
	require.Equal(t, http.StatusOK, code, body)
	flyWorker(t, web, "cw-tagged", 30*time.Second, func(_ cwn.Worker, found bool) bool { return !found })
	eventually(t, 10*time.Second, func() error {
		land := metricValue(t, g, `jetway_concourse_commands_total{command="land-worker",result="ok"}`)
		retire := metricValue(t, g, `jetway_concourse_commands_total{command="retire-worker",result="ok"}`)
		if land != 1 || retire != 1 {
			return errorf("TSA commands: land-worker %v, retire-worker %v; want one each (a landing the web node made is not told back)", land, retire)
		}
		return nil
	})
}
