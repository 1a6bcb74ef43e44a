package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// TestMeshSteps: in a star, everything is asked of spoke b, with the main
// team's token, about steps that run on the other gateways' targets: a
// step placed by its tags on spoke a's target (events followed, the
// output's content checked), a step on the hub's target whose input is
// that step's output (streamed from a's pod to the hub's over the mesh),
// `gateway execute` against b for a task that must run on a (uploads,
// live output, a downloaded output), and an abort.
func TestMeshSteps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := startStar(ctx, t, [3]string{"steps-hub", "steps-a", "steps-b"},
		[3]string{"tags: [hub]\n", "team: main\ntags: [a]\n", "tags: [b]\n"}, 0)
	hub, a, b := st.gateways[0], st.gateways[1], st.gateways[2]
	asMain := *b
	asMain.token = mainToken.Token
	mainCaller := streams.Caller{Team: "main"}

	// Placed by its tags on spoke a's target: b forwards it (through the
	// hub, the only gateway b reaches) to a, which runs it.
	produce := shStep("mesh-produce", `head -c 1048576 /dev/urandom > out/blob && sha256sum out/blob | cut -d' ' -f1`)
	produce.Tags = []string{"a"}
	produce.Outputs = []wire.Output{{Name: "out"}}
	code, v, body := asMain.submitStep(t, mainToken.Token, produce)
	require.Equal(t, http.StatusAccepted, code, body)
	assert.Equal(t, "mesh-produce", v.Handle)
	_, err := a.steps.Get(mainCaller, "", "mesh-produce")
	require.NoError(t, err, "a runs it")
	_, err = b.steps.Get(mainCaller, "", "mesh-produce")
	require.ErrorIs(t, err, wire.ErrNotFound, "b does not")
	evs := asMain.stepEvents(ctx, t, "mesh-produce", "", 0)
	require.Equal(t, []string{"placed", "scheduled", "started", "exited"}, types(evs), "%+v", evs)
	sum := outputOf(evs, wire.EventStdout)
	require.Regexp(t, `^[0-9a-f]{64}\n$`, sum)
	v = asMain.step(t, "mesh-produce")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	assert.Equal(t, "steps-a", v.Target)

	// Its output feeds a step on the hub's target: b finds the step on a,
	// the hub streams the volume from a's pod over the mesh.
	consume := shStep("mesh-consume", `sha256sum in/blob | cut -d' ' -f1`)
	consume.Tags = []string{"hub"}
	consume.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "mesh-produce", Output: "out"}}}
	asMain.run(t, consume)
	_, err = hub.steps.Get(mainCaller, "", "mesh-consume")
	require.NoError(t, err, "the hub runs it")
	evs = asMain.stepEvents(ctx, t, "mesh-consume", "", 0)
	require.Equal(t, []string{"placed", "scheduled", "input", "started", "exited"}, types(evs), "%+v", evs)
	assert.Equal(t, sum, outputOf(evs, wire.EventStdout), "the same bytes on the hub's cluster")
	assert.Equal(t, "steps-hub", asMain.step(t, "mesh-consume").Target)
	assert.Equal(t, 1.0, metricValue(t, hub, `jetway_streams_total{mode="mesh",result="ok"}`))

	// An output no step has, or a step no gateway runs: refused where asked.
	bad := shStep("mesh-bad", "true")
	bad.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Step: "mesh-produce", Output: "nope"}}}
	code, _, body = asMain.submitStep(t, mainToken.Token, bad)
	assert.Equal(t, http.StatusUnprocessableEntity, code, body)
	assert.Contains(t, body, `step \"mesh-produce\" has no output \"nope\"`)
	bad.Inputs[0].From = wire.InputSource{Step: "nowhere", Output: "out"}
	code, _, body = asMain.submitStep(t, mainToken.Token, bad)
	assert.Equal(t, http.StatusUnprocessableEntity, code, body)
	assert.Contains(t, body, `step \"nowhere\" not found`)

	// gateway execute against b, for a task only a's target may run.
	work := executeWork(t)
	code, stdout, stderr := asMain.execute(ctx, t, work, []string{"JETWAY_TOKEN=" + mainToken.Token, "OVERRIDDEN=x"},
		"--tag", "a", "-c", "task.yml", "-i", "src=src", "-i", "lib=lib", "-o", "out=got", "-v", "tag=1.37", "-v", "code=0")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Equal(t, "hello\n1.2\nhi x\n", stdout)
	both, err := os.ReadFile(filepath.Join(work, "got", "sub", "both"))
	require.NoError(t, err)
	assert.Equal(t, "hello\n1.2\n", string(both))
	handle := regexp.MustCompile(`executing step (\S+)`).FindStringSubmatch(stderr)
	require.Len(t, handle, 2, stderr)
	v, err = a.steps.Get(mainCaller, "", handle[1])
	require.NoError(t, err, "a ran it")
	assert.Equal(t, wire.Succeeded, v.Phase)
	assert.True(t, v.Released, "execute released its pod, through b")

	// Aborted through b while it runs on a.
	asMain.run(t, withTags(longStep("mesh-long", 1000), "a"))
	asMain.waitEvents(t, "mesh-long", 4) // placed, scheduled, started, a line
	code, body, _ = call(t, http.MethodDelete, b.base+"/api/v1/steps/mesh-long", mainToken.Token)
	require.Contains(t, []int{http.StatusOK, http.StatusAccepted}, code, body)
	eventually(t, 20*time.Second, func() error {
		if v, _ := a.steps.Get(mainCaller, "", "mesh-long"); v.Phase != wire.Aborted {
			return errorf("phase %s on a", v.Phase)
		}
		return nil
	})
}

func withTags(req wire.Request, tags ...string) wire.Request {
	req.Tags = tags
	return req
}
