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
	web := cwn.ForTest(t, cwn.Options{})
	tsas := []*cutProxy{startCutProxy(t, web.TSAAddr), startCutProxy(t, web.TSAAddr)}
	tsa := concourseTSA(t, web)
	tsa.Addrs = []string{tsas[0].ln.Addr().String(), tsas[1].ln.Addr().String()}
	dir := t.TempDir()
	const name = "cwtsa"
	placeTarget(ctx, t, clusters[0], dir, name, "{}\n", "")
	startGateway(t, dir, gatewayOptions{concourse: tsa, state: newState(t)})
	flyWorker(t, web, name, 30*time.Second, workerIn("running"))

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
