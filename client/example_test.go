package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/steps"
)

// oneStep stands in for a gateway's steps: a task that prints a line
// and exits 3. (It has no inputs or outputs to transfer.)
type oneStep struct{ api.Steps }

func (oneStep) Submit(steps.Caller, steps.Request) (steps.View, bool, error) {
	return steps.View{Handle: "unit-1", Phase: steps.Pending}, true, nil
}
func (oneStep) Get(steps.Caller, string, string) (steps.View, error) {
	code := 3
	return steps.View{Handle: "unit-1", Phase: steps.Failed, ExitStatus: &code}, nil
}
func (oneStep) Readable(steps.Caller, string, string, int) error { return nil }
func (oneStep) Abort(context.Context, steps.Caller, string, string) (steps.View, error) {
	return steps.View{}, nil
}
func (oneStep) Events(_ context.Context, _ steps.Caller, _, _ string, _ int, send func([]steps.Event) error) error {
	code := 3
	return send([]steps.Event{
		{N: 0, Type: steps.EventStarted},
		{N: 1, Type: steps.EventStdout, Data: "FAIL: TestThing\n"},
		{N: 2, Type: steps.EventExited, Phase: steps.Failed, ExitStatus: &code},
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
	_, err = c.Run(context.Background(), steps.Request{
		Handle: "unit-1", Type: "task", Image: "golang:1.26",
		Run: steps.Run{Path: "go", Args: []string{"test", "./..."}},
	}, func(e steps.Event) {
		if e.Type == steps.EventStdout {
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
