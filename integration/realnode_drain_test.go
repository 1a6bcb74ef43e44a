package integration

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/concourse"
	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// TestRealNodeConcourseDrains: landing and retiring a worker drains it,
// as a stock worker's do, through a real web node and fly on the real
// node, with a build's task running and a check's container present.
//   - `gateway land` and `fly land-worker`: the worker is landing while
//     the task runs on; the build succeeds; the web node then lands the
//     worker, and the target lands in jetway although the check's
//     container, which the web node keeps, is still there. The landed
//     worker's sweeps go on: once the web node releases that container
//     (its pipeline destroyed), its pod is deleted.
//   - `gateway retire`: the task runs on, the build succeeds, and the web
//     node then deletes the worker.
func TestRealNodeConcourseDrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const name = "rn-drain"
	web, g := testTypeWorkerOnNode(ctx, t, name, cwn.Options{GCInterval: time.Second}, gatewayOptions{sweep: 2 * time.Second},
		wire.ResourceType{Type: "test", Version: "1.0"})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	pods := startRealNode(t).Client.CoreV1().Pods(name)
	fly := mustFly(ctx, t, web)
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	writeFile(t, pipeline, []byte("resources:\n- {name: r, type: test, source: {uri: git://repo}}\njobs:\n- name: j\n  plan: [{get: r}]\n"))
	fly("set-pipeline", "-n", "-p", "drain", "-c", pipeline)
	fly("unpause-pipeline", "-p", "drain")
	task := filepath.Join(t.TempDir(), "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\n"+
		"run: {path: sh, args: [-c, 'echo started; sleep 15; echo finished']}\n"))

	// checkContainer is the check's container's pod, once a check ran.
	checkContainer := func() corev1.Pod {
		t.Helper()
		fly("check-resource", "-r", "drain/r")
		var check corev1.Pod
		eventually(t, 30*time.Second, func() error {
			var handles []string
			for _, c := range flyContainers(t, web) {
				if c.WorkerName == name && c.Type == "check" {
					handles = append(handles, c.ID)
				}
			}
			list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: concourse.ContainerLabel})
			if err != nil {
				return err
			}
			for _, p := range list.Items {
				if slices.Contains(handles, p.Labels[concourse.ContainerLabel]) && p.DeletionTimestamp == nil {
					check = p
					return nil
				}
			}
			return errorf("no check container's pod (checks %v)", handles)
		})
		return check
	}
	// drains runs the task, and once it started lands or retires the
	// worker (act), then waits for the build: it succeeds.
	drains := func(what string, act func()) {
		t.Helper()
		done := flyAsync(ctx, web, 4*time.Minute, "execute", "-c", task)
		build := awaitStartedBuild(t, web)
		awaitBuildSays(ctx, t, web, build, "started")
		act()
		flyWorker(t, web, name, 30*time.Second, func(w wire.Worker, found bool) bool {
			return found && (w.State == "landing" || w.State == "retiring")
		})
		res := <-done
		require.NoError(t, res.err, "%s: the build runs on while the worker drains: %s", what, res.out)
		assert.Regexp(t, regexp.MustCompile(`finished\s+succeeded`), res.out, what)
	}
	landed := func(what string, check corev1.Pod) {
		t.Helper()
		flyWorker(t, web, name, time.Minute, workerIn("landed"))
		g.waitTarget(t, name, time.Minute, inState("landed"))
		_, err := pods.Get(ctx, check.Name, metav1.GetOptions{})
		assert.NoError(t, err, "%s: the check's container, which the web node keeps, is still there and held no landing", what)
	}
	resume := func() {
		t.Helper()
		code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/targets/"+name+"/resume", "")
		require.Equal(t, http.StatusOK, code, body)
		flyWorker(t, web, name, time.Minute, workerIn("running"))
	}

	check := checkContainer()
	drains("gateway land", func() {
		code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/"+name+"/land", "")
		require.Equal(t, http.StatusOK, code, body)
	})
	landed("gateway land", check)
	resume()

	check = checkContainer()
	drains("fly land-worker", func() { fly("land-worker", "-w", name) })
	landed("fly land-worker", check)
	// The landed worker's sweeps go on: once the web node releases the
	// check's container (its pipeline gone), it is destroyed.
	fly("destroy-pipeline", "-n", "-p", "drain")
	eventually(t, time.Minute, func() error {
		if _, err := pods.Get(ctx, check.Name, metav1.GetOptions{}); err == nil {
			return errorf("the check's container's pod %s is still there", check.Name)
		}
		return nil
	})
	resume()

	drains("gateway retire", func() {
		code, body, _ := call(t, http.MethodPut, g.base+"/api/v1/workers/"+name+"/retire", "")
		require.Equal(t, http.StatusOK, code, body)
	})
	flyWorker(t, web, name, time.Minute, func(_ wire.Worker, found bool) bool { return !found })
}
