package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	utilexec "k8s.io/client-go/util/exec"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// Agents reach the workers of the agents joined to this gateway (whose
// registrar registers them), over the mesh: each serves its volumes and
// containers as an agent.LocalWorker, to the protocol in wire
// (wire.LocalWorkerPath). A web node's calls for an agent's worker
// go to the agent; nothing of it lives in a cluster but its containers'
// records.
type Agents struct {
	// Joined lists the agents joined to this gateway now
	// (api.MeshAgents).
	Joined func() []targets.Status
	// Client carries the calls: the mesh's, whose host is the agent's
	// name (mesh.Mesh.BulkClient: volume streams are large).
	Client *http.Client
}

// Has reports whether target is an agent joined to this gateway now.
func (a *Agents) Has(target string) bool {
	if a == nil || a.Joined == nil {
		return false
	}
	return slices.ContainsFunc(a.Joined(), func(st targets.Status) bool { return st.Name == target })
}

// send sends one call to agent's LocalWorker: p below wire.LocalWorkerPath.
func (a *Agents) send(ctx context.Context, agent, method, p string, q url.Values, h http.Header, body io.Reader) (*http.Response, error) {
	u := url.URL{Scheme: "http", Host: agent, Path: wire.LocalWorkerPath + p, RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := a.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent %s, over the mesh: %w", agent, err)
	}
	return resp, nil
}

// volumes sends one request to agent's volume server (a VolumeServer
// without a pod): path is the volume API's.
func (a *Agents) volumes(ctx context.Context, agent, method, path string, q url.Values, h http.Header, body io.Reader) (*http.Response, error) {
	return a.send(ctx, agent, method, path[1:], q, h, body)
}

// call sends a call whose answer is small, and reads it: an error if the
// status is not want.
func (a *Agents) call(ctx context.Context, agent, method, p string, body []byte, want int) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	resp, err := a.send(ctx, agent, method, p, nil, http.Header{"Content-Type": {"application/json"}}, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", agent, err)
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("agent %s: %s", agent, answerError(resp.StatusCode, b))
	}
	return b, nil
}

// makeContainer makes agent's container handle with mounts.
func (a *Agents) makeContainer(ctx context.Context, agent, handle string, mounts []wire.LocalMount) error {
	body, err := json.Marshal(wire.LocalContainer{Mounts: mounts})
	if err != nil {
		return err
	}
	_, err = a.call(ctx, agent, http.MethodPut, "containers/"+url.PathEscape(handle), body, http.StatusNoContent)
	return err
}

// destroyContainer removes agent's container handle, ending what runs in
// it; one already gone is no error.
func (a *Agents) destroyContainer(ctx context.Context, agent, handle string) error {
	_, err := a.call(ctx, agent, http.MethodDelete, "containers/"+url.PathEscape(handle), nil, http.StatusNoContent)
	return err
}

// containers lists agent's containers.
func (a *Agents) containers(ctx context.Context, agent string) ([]string, error) {
	b, err := a.call(ctx, agent, http.MethodGet, "containers", nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var handles []string
	if err := json.Unmarshal(b, &handles); err != nil {
		return nil, fmt.Errorf("agent %s: its containers: %w", agent, err)
	}
	return handles, nil
}

// exec runs step agent commands in agent's container handle: a
// steppod.ExecStream whose target and pod are not used. A command that
// exits non-zero is a utilexec.CodeExitError, as a pod's exec.
func (a *Agents) exec(agent, handle string) steppod.ExecStream {
	return func(ctx context.Context, _ *targets.Target, _ string, cmd []string, stdin io.Reader, stdout io.Writer) error {
		if len(cmd) < 2 || cmd[0] != stepagent.BinPath {
			return fmt.Errorf("agent %s runs the step agent's commands only, not %q", agent, cmd)
		}
		if stdin == nil {
			stdin = http.NoBody
		}
		resp, err := a.send(ctx, agent, http.MethodPost, "containers/"+url.PathEscape(handle)+"/exec",
			url.Values{wire.LocalExecArg: cmd[1:]}, http.Header{"Content-Type": {"application/octet-stream"}}, stdin)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			return fmt.Errorf("agent %s: %s", agent, answerError(resp.StatusCode, b))
		}
		if _, err := io.Copy(stdout, resp.Body); err != nil {
			return fmt.Errorf("agent %s, over the mesh: %w", agent, err)
		}
		code, err := strconv.Atoi(resp.Trailer.Get(wire.TrailerExitCode))
		stderr := resp.Trailer.Get(wire.TrailerExecStderr)
		switch {
		case err != nil:
			return fmt.Errorf("agent %s: the exec ended without its exit code", agent)
		case code < 0:
			return fmt.Errorf("agent %s: %s", agent, stderr)
		case code > 0:
			return utilexec.CodeExitError{Err: fmt.Errorf("agent said %q: exit status %d", stderr, code), Code: code}
		}
		return nil
	}
}

// errNotJoined: an agent's worker whose agent has no session with this
// gateway now.
var errNotJoined = errors.New("not joined to this gateway now")
