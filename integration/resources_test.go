package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/wire"
)

// resourceScripts is the folder of the test resource type's scripts
// (check, in, out), which the step kubelet runs where they lie; the real
// node's busybox image holds them at /opt/resource.
func resourceScripts(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "resource"))
	require.NoError(t, err)
	return dir
}

func resourceStep(handle, typ, source string) wire.Request {
	return wire.Request{Handle: handle, Type: typ, Image: "concourse/git-resource",
		Resource: &wire.Resource{Source: json.RawMessage(source)}}
}

// TestResourceSteps runs check, get and put through the resource scripts
// with their JSON: the answer is the step's result, stderr its log; an
// answer that is not the JSON expected errors the step, quoting it; a
// non-zero exit fails it with the status.
func TestResourceSteps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := targetGateway(ctx, t, clusters[0], "res", "{}\n", gatewayOptions{resourceDir: resourceScripts(t)})

	g.run(t, resourceStep("check", "check", `{"uri":"git://x"}`))
	evs := g.stepEvents(ctx, t, "check", "", 0)
	v := g.step(t, "check")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	assert.JSONEq(t, `[{"ref":"a"},{"ref":"b"}]`, string(v.Result))
	assert.Equal(t, `check got {"source":{"uri":"git://x"},"version":null}`+"\n", outputOf(evs, wire.EventStderr))
	assert.Empty(t, outputOf(evs, wire.EventStdout), "the answer is the result, not the log")

	get := resourceStep("get", "get", `{"uri":"git://x"}`)
	get.Resource.Version, get.Resource.Params = json.RawMessage(`{"ref":"b"}`), json.RawMessage(`{"depth":1}`)
	g.run(t, get)
	g.stepEvents(ctx, t, "get", "", 0)
	v = g.step(t, "get")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	assert.JSONEq(t, `{"version":{"ref":"b"},"metadata":[{"name":"author","value":"me"}]}`, string(v.Result))
	require.Len(t, v.Outputs, 1)
	assert.Equal(t, "resource", v.Outputs[0].Name)
	input, err := os.ReadFile(filepath.Join(clusters[0].StepRoot("res", v.Pod), "build", "resource", "input.json"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"source":{"uri":"git://x"},"version":{"ref":"b"},"params":{"depth":1}}`, string(input))

	put := resourceStep("put", "put", `{"uri":"git://x"}`)
	put.Resource.Params = json.RawMessage(`{"repository":"src"}`)
	put.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Step: "get", Output: "resource"}}}
	g.run(t, put)
	evs = g.stepEvents(ctx, t, "put", "", 0)
	v = g.step(t, "put")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	assert.JSONEq(t, `{"version":{"ref":"c"}}`, string(v.Result))
	assert.Equal(t, `out got {"params":{"repository":"src"},"source":{"uri":"git://x"}} and fetched`+"\n", outputOf(evs, wire.EventStderr))

	g.run(t, resourceStep("broken", "check", `{"uri":"broken"}`))
	evs = g.stepEvents(ctx, t, "broken", "", 0)
	last := evs[len(evs)-1]
	assert.Equal(t, wire.Errored, last.Phase)
	assert.Equal(t, "ResourceAnswerInvalid", last.Reason)
	assert.Equal(t, `check printed "oops, not json\n", not a JSON array of versions`, last.Message)

	g.run(t, resourceStep("unreachable", "check", `{"uri":"fail"}`))
	evs = g.stepEvents(ctx, t, "unreachable", "", 0)
	last = evs[len(evs)-1]
	assert.Equal(t, wire.Failed, last.Phase)
	require.NotNil(t, last.ExitStatus)
	assert.Equal(t, 3, *last.ExitStatus)
	assert.Contains(t, outputOf(evs, wire.EventStderr), "cannot reach the repository")

	code, _, body := g.submitStep(t, "", wire.Request{Handle: "bad", Type: "get", Image: "i"})
	assert.Equal(t, 400, code)
	assert.Contains(t, body, `"field":"resource"`)

	// The same through the Go client, as a CI core would.
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	source := map[string]string{"uri": "git://x"}
	versions, err := c.CheckResource(ctx, client.ResourceStep{Handle: "c-check", Image: "git", Source: source})
	require.NoError(t, err)
	assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions)
	fetched, err := c.GetResource(ctx, client.ResourceStep{Handle: "c-get", Image: "git", Source: source, Version: versions[1]})
	require.NoError(t, err)
	assert.Equal(t, client.Version{"ref": "b"}, fetched.Version)
	assert.Equal(t, []client.MetadataField{{Name: "author", Value: "me"}}, fetched.Metadata)
	assert.Equal(t, "output-resource", fetched.Output.Handle)
	var log strings.Builder
	pushed, err := c.PutResource(ctx, client.ResourceStep{Handle: "c-put", Image: "git", Source: source,
		Inputs:  []wire.Input{{Name: "src", From: wire.InputSource{Step: "c-get", Output: "resource"}}},
		OnEvent: func(e wire.Event) { log.WriteString(e.Data) }})
	require.NoError(t, err)
	assert.Equal(t, client.Version{"ref": "c"}, pushed.Version)
	assert.Contains(t, log.String(), "and fetched")
	_, err = c.CheckResource(ctx, client.ResourceStep{Handle: "c-broken", Image: "git", Source: map[string]string{"uri": "broken"}})
	var stepErr *client.StepError
	require.ErrorAs(t, err, &stepErr)
	assert.Equal(t, "ResourceAnswerInvalid", stepErr.Reason)

	// A step no target fits: a typed error, and the step is not left
	// waiting.
	_, err = c.RunTask(ctx, wire.Request{Handle: "no-fit", Type: "task", Image: "busybox", Tags: []string{"gpu"},
		Run: wire.Run{Path: "true"}}, nil)
	var noTarget *client.NoTargetError
	require.ErrorAs(t, err, &noTarget)
	assert.Equal(t, "no target satisfies tags 'gpu': res: missing tags gpu", noTarget.Message,
		"it names each target's refusal, as gateway place does")
	assert.Equal(t, wire.Aborted, g.step(t, "no-fit").Phase)
}

// TestClientFollowsAcrossAGatewayRestart: the Go client follows a step's
// events while its gateway restarts on the same address; it gets every
// event once, in order, up to the exit status.
func TestClientFollowsAcrossAGatewayRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[1], dir, "cl-restart", "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "cl-restart", 10*time.Second, running)
	c, err := client.New(client.Options{URL: g.base, Retry: 20 * time.Millisecond})
	require.NoError(t, err)

	const lines = 60
	v, created, err := c.SubmitStep(ctx, longStep("followed", lines))
	require.NoError(t, err)
	require.True(t, created)
	var evs []wire.Event
	followed := make(chan error, 1)
	go func() {
		followed <- c.Follow(ctx, v.Team, v.Handle, 0, func(e wire.Event) error {
			evs = append(evs, e)
			return nil
		})
	}()
	g.waitEvents(t, "followed", 8)
	addr := strings.TrimPrefix(g.base, "http://")
	g.stop()
	startGateway(t, dir, gatewayOptions{listen: addr})
	require.NoError(t, <-followed)
	checkLongStep(t, clusters[1], g.step(t, "followed"), evs, lines)
}
