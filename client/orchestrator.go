package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jetway-ci/jetway/wire"
)

// Orchestrator is what a CI core needs of a Kubernetes runtime: run
// tasks and resources' check, get and put, and manage the workers. The
// Client implements it over the HTTP API.
type Orchestrator interface {
	RunTask(ctx context.Context, req wire.Request, onEvent func(wire.Event)) (wire.View, error)
	CheckResource(ctx context.Context, r ResourceStep) ([]Version, error)
	GetResource(ctx context.Context, r ResourceStep) (Fetched, error)
	PutResource(ctx context.Context, r ResourceStep) (Fetched, error)
	Workers(ctx context.Context) ([]wire.Worker, error)
	Land(ctx context.Context, worker string) error
	Retire(ctx context.Context, worker string) error
	Prune(ctx context.Context, worker string) error
	Stream(ctx context.Context, req wire.StreamRequest) (wire.StreamResult, error)
}

var _ Orchestrator = (*Client)(nil)

// Version is a resource version, as Concourse has them.
type Version map[string]string

// MetadataField is one field of a fetched or put version's metadata.
type MetadataField struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// ResourceStep is one check, get or put of a resource.
type ResourceStep struct {
	// Handle names the step (unique within the team); Team, Tags and
	// Platform place it, Image holds the resource's scripts.
	Handle, Team, Image, Platform string
	Tags                          []string
	// Source, Version and Params become the script's JSON; Version is for
	// check (the last known, or nil) and get, Params for get and put.
	Source  any
	Version Version
	Params  any
	// Inputs are a put's artifacts, under the build dir by name.
	Inputs []wire.Input
	// ReuseKey, for a check, runs it in a warm sandbox pod kept for the
	// checks of the same team, image and key: say, the resource's name
	// in its pipeline. Empty: a pod of its own.
	ReuseKey string
	// OnEvent, if set, gets the step's events (its stderr is the log).
	OnEvent func(wire.Event)
}

// Fetched is what a get or a put answers: the version and its metadata,
// the step, and for a get the volume holding the version's files.
type Fetched struct {
	Version  Version         `json:"version"`
	Metadata []MetadataField `json:"metadata"`
	Output   wire.Volume     `json:"-"`
	Step     wire.View       `json:"-"`
}

// RunTask runs a task step to its end: Run.
func (c *Client) RunTask(ctx context.Context, req wire.Request, onEvent func(wire.Event)) (wire.View, error) {
	return c.Run(ctx, req, onEvent)
}

// CheckResource runs the resource's check and returns the versions it found.
func (c *Client) CheckResource(ctx context.Context, r ResourceStep) ([]Version, error) {
	v, err := c.resource(ctx, "check", r)
	if err != nil {
		return nil, err
	}
	var versions []Version
	if err := json.Unmarshal(v.Result, &versions); err != nil {
		return nil, fmt.Errorf("jetway: check %s: result: %w", r.Handle, err)
	}
	return versions, nil
}

// GetResource fetches a version into the step's output volume.
func (c *Client) GetResource(ctx context.Context, r ResourceStep) (Fetched, error) {
	return c.fetch(ctx, "get", r)
}

// PutResource pushes the inputs to the resource.
func (c *Client) PutResource(ctx context.Context, r ResourceStep) (Fetched, error) {
	return c.fetch(ctx, "put", r)
}

func (c *Client) fetch(ctx context.Context, typ string, r ResourceStep) (Fetched, error) {
	v, err := c.resource(ctx, typ, r)
	if err != nil {
		return Fetched{Step: v}, err
	}
	f := Fetched{Step: v}
	if err := json.Unmarshal(v.Result, &f); err != nil {
		return f, fmt.Errorf("jetway: %s %s: result: %w", typ, r.Handle, err)
	}
	if len(v.Outputs) > 0 {
		f.Output = v.Outputs[0]
	}
	return f, nil
}

// resource runs one resource step to its end.
func (c *Client) resource(ctx context.Context, typ string, r ResourceStep) (wire.View, error) {
	res := &wire.Resource{}
	var err error
	if res.Source, err = json.Marshal(r.Source); err != nil {
		return wire.View{}, fmt.Errorf("jetway: %s %s: source: %w", typ, r.Handle, err)
	}
	if r.Version != nil {
		res.Version, _ = json.Marshal(r.Version)
	}
	if r.Params != nil {
		if res.Params, err = json.Marshal(r.Params); err != nil {
			return wire.View{}, fmt.Errorf("jetway: %s %s: params: %w", typ, r.Handle, err)
		}
	}
	req := wire.Request{Handle: r.Handle, Type: typ, Team: r.Team, Tags: r.Tags, Platform: r.Platform,
		Image: r.Image, Inputs: r.Inputs, Resource: res, ReuseKey: r.ReuseKey}
	return c.Run(ctx, req, r.OnEvent)
}
