package integration

import (
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// TestConcourseBuildOutlivesATSAGoingAway: given two TSA addresses
// (here two proxies to the web node's TSA, as two web nodes would be),
// the gateway registers through one; when that one goes away (its
// listener closed and its connections cut) while a build's task runs,
// the registration is made again through the other, the web node attaches
// to the task again, and the build succeeds.
func TestConcourseBuildOutlivesATSAGoingAway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "cwtsa"
	web, tsas, _ := twoTSAs(ctx, t, name, 0)

	task := filepath.Join(t.TempDir(), "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox#1.36\nrun: {path: sh, args: [-c, 'echo started; sleep 8; echo finished']}\n"))
	done := flyAsync(ctx, web, 3*time.Minute, "execute", "-c", task)
	build := awaitStartedBuild(t, web)
	awaitBuildSays(ctx, t, web, build, "started")
	// The registration's connection is through one of them: it goes away.
	var gone, other *cutProxy
	eventually(t, 10*time.Second, func() error {
		for i, p := range tsas {
			if p.Open() > 0 {
				gone, other = p, tsas[1-i]
				return nil
			}
		}
		return errorf("no connection through either TSA address")
	})
	gone.Close()

	res := <-done
	require.NoError(t, res.err, res.out)
	assert.Regexp(t, regexp.MustCompile(`finished\s+succeeded`), res.out)
	assert.Positive(t, other.Open(), "registered again through the other address")
	flyWorker(t, web, name, 30*time.Second, func(w wire.Worker, found bool) bool { return found && w.State == "running" })
}

// TestConcourseRebalanceDrainsTheRegistrationBefore: with two TSA
// addresses and a rebalance interval, the registration is made again
// through the other address while a build's task runs, as a stock
// worker's --rebalance-interval does, each time to the address it was
// not on; the one before drains: it stays open while the web node's
// connection to the task's process rides it (so that two rebalances
// later its address carries two registrations, which without draining
// it never does), and the build gets its whole output and succeeds; once
// drained, it is closed. The worker stays running throughout.
func TestConcourseRebalanceDrainsTheRegistrationBefore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const name = "cwrebalance"
	web, tsas, g := twoTSAs(ctx, t, name, 5*time.Second)

	task := filepath.Join(t.TempDir(), "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///busybox#1.36\n"+
		"run: {path: sh, args: [-c, 'echo started; for i in $(seq 1 24); do sleep 1; echo tick $i; done; echo finished']}\n"))
	done := flyAsync(ctx, web, 3*time.Minute, "execute", "-c", task)
	build := awaitStartedBuild(t, web)
	awaitBuildSays(ctx, t, web, build, "started")
	eventually(t, 20*time.Second, func() error {
		if a, b := tsas[0].Open(), tsas[1].Open(); a < 2 && b < 2 {
			return errorf("connections through the two addresses: %d and %d", a, b)
		}
		return nil
	})

	res := <-done
	require.NoError(t, res.err, res.out)
	assert.Contains(t, res.out, "tick 24")
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_concourse_rebalances_total{result="ok"}`), 2.0)
	assert.Regexp(t, regexp.MustCompile(`finished\s+succeeded`), res.out)
	// Drained, the registrations before are closed: one connection left
	// between rebalances.
	eventually(t, 30*time.Second, func() error {
		if open := tsas[0].Open() + tsas[1].Open(); open != 1 {
			return errorf("%d connections open through the TSA addresses", open)
		}
		return nil
	})
	assert.Zero(t, metricValue(t, g, `jetway_concourse_rebalances_total{result="error"}`))
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))
}

// twoTSAs starts a web node, two proxies to its TSA (as two web nodes'
// TSAs would be) and a gateway registering target name on the first
// cluster through them, rebalancing every rebalance (0: never), and
// waits until fly lists it running.
func twoTSAs(ctx context.Context, t *testing.T, name string, rebalance time.Duration) (*cwn.WebNode, []*cutProxy, *gateway) {
	t.Helper()
	web := cwn.ForTest(t, cwn.Options{})
	tsas := []*cutProxy{startCutProxy(t, web.TSAAddr), startCutProxy(t, web.TSAAddr)}
	tsa := concourseTSA(t, web)
	tsa.Addrs = []string{tsas[0].ln.Addr().String(), tsas[1].ln.Addr().String()}
	tsa.Rebalance, tsa.Drain = rebalance, time.Minute
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{concourse: tsa, state: newState(t)})
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))
	return web, tsas, g
}
