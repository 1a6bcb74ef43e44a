package concourse

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// The calls of Agents that localworker_test.go (package concourse_test,
// which imports agent for the other side) drives.

func (a *Agents) Volumes(ctx context.Context, agent, method, path string, q url.Values, h http.Header, body io.Reader) (*http.Response, error) {
	return a.volumes(ctx, agent, method, path, q, h, body)
}

func (a *Agents) MakeContainer(ctx context.Context, agent, handle string, mounts []wire.LocalMount) error {
	return a.makeContainer(ctx, agent, handle, mounts)
}

func (a *Agents) DestroyContainer(ctx context.Context, agent, handle string) error {
	return a.destroyContainer(ctx, agent, handle)
}

func (a *Agents) Containers(ctx context.Context, agent string) ([]string, error) {
	return a.containers(ctx, agent)
}

func (a *Agents) Exec(agent, handle string) steppod.ExecStream { return a.exec(agent, handle) }
