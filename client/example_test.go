package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// oneStep stands in for a gateway's steps: a task that prints a line
// and exits 3. (It has no inputs or outputs to transfer.)
type oneStep struct{ api.Steps }

func (oneStep) Submit(streams.Caller, wire.Request) (wire.View, bool, error) {
	return wire.View{Handle: "unit-1", Phase: wire.Pending}, true, nil
}
func (oneStep) Get(streams.Caller, string, string) (wire.View, error) {
	code := 3
	return wire.View{Handle: "unit-1", Phase: wire.Failed, ExitStatus: &code}, nil
}
func (oneStep) Readable(streams.Caller, string, string, int) error { return nil }
func (oneStep) Abort(context.Context, streams.Caller, string, string) (wire.View, error) {
	return wire.View{}, nil
}
func (oneStep) Events(_ context.Context, _ streams.Caller, _, _ string, _ int, send func([]wire.Event) error) error {
	code := 3
	return send([]wire.Event{
		{N: 0, Type: wire.EventStarted},
		{N: 1, Type: wire.EventStdout, Data: "FAIL: TestThing\n"},
		{N: 2, Type: wire.EventExited, Phase: wire.Failed, ExitStatus: &code},
	})
}

// Run a task and print its output as it comes; a step that did not
// succeed is a *client.StepError.
func ExampleClient_Run() {
	gateway := httptest.NewServer(api.New(api.Options{Gatherer: prometheus.NewRegistry(), Steps: oneStep{}, NoAuth: true}).Handler())
	defer gateway.Close()

	c, err := client.New(client.Options{URL: gateway.URL, Token: "a token of the gateway's tokens file"})
	if err != nil {
		panic(err)
	}
	_, err = c.Run(context.Background(), wire.Request{
		Handle: "unit-1", Type: "task", Image: "golang:1.26",
		Run: wire.Run{Path: "go", Args: []string{"test", "./..."}},
	}, func(e wire.Event) {
		if e.Type == wire.EventStdout {
			fmt.Print(e.Data)
		}
	})
	var failed *client.StepError
	if errors.As(err, &failed) {
		fmt.Println("exit status", *failed.ExitStatus)
	}
	// Output:
	// FAIL: TestThing
	// exit status 3
}
