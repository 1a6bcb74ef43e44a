package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// Each step's volumes are served by the volume sidecar's own server
// (package volumes, the baggageclaim API), on a loopback port of the
// agent's machine, over its folder: the agent streams in and out of it
// as the gateway does of a step pod's sidecar, with a token it made for
// that server and keeps in memory, so another user of the machine reaching
// the port gets a 401.

// serveVolumes starts the step's volume server, if it is not running.
func (s *step) serveVolumes() (*volumes.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vol == nil {
		token := rand.Text() + rand.Text()
		vol, err := volumes.Start(s.root, ownership.TokenHash(token))
		if err != nil {
			return nil, fmt.Errorf("serve the step's volumes: %w", err)
		}
		vol.SetLimits(s.extract)
		s.vol, s.volToken = vol, token
	}
	return s.vol, nil
}

// volumeRequest is a request of op on a volume of the step's server, with
// its token.
func (s *step) volumeRequest(ctx context.Context, handle, op string, q url.Values, body io.Reader) (*http.Request, error) {
	s.mu.Lock()
	vol, token := s.vol, s.volToken
	s.mu.Unlock()
	if vol == nil {
		return nil, errNoVolumes
	}
	u := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(vol.Port()), Path: "/volumes/" + handle + "/" + op,
		RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req, nil
}

// putVolume streams a tar (encoded as encoding says) into the volume,
// counting and hashing it as received.
func (s *step) putVolume(ctx context.Context, handle, encoding string, body io.Reader) (wire.InputDigest, error) {
	digest := steppod.NewDigest(body)
	req, err := s.volumeRequest(ctx, handle, "stream-in", nil, digest)
	if err != nil {
		return wire.InputDigest{}, err
	}
	req.Header.Set("Content-Encoding", encodingOrRaw(encoding))
	resp, err := volumeClient.Do(req)
	if err != nil {
		return wire.InputDigest{}, fmt.Errorf("stream into volume %s: %w", handle, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return wire.InputDigest{}, fmt.Errorf("stream into volume %s: %w", handle, volumeError(resp))
	}
	return digest.Input(""), nil
}

// openVolume streams a path of the volume out, as a tar encoded as
// encoding says.
func (s *step) openVolume(ctx context.Context, handle, path, encoding string) (io.ReadCloser, error) {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	req, err := s.volumeRequest(ctx, handle, "stream-out", q, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept-Encoding", encodingOrRaw(encoding))
	resp, err := volumeClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stream out of volume %s: %w", handle, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		err := volumeError(resp)
		if resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("%w: %v", streams.ErrNotFound, err)
		}
		return nil, fmt.Errorf("stream out of volume %s: %w", handle, err)
	}
	return resp.Body, nil
}

// volumeClient talks to the steps' volume servers on loopback: no proxy.
var volumeClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true}}

func encodingOrRaw(enc string) string {
	if enc == "" {
		return volumes.Raw
	}
	return enc
}

func volumeError(resp *http.Response) error {
	var body struct {
		Error string `json:"error"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body)
	if body.Error == "" {
		return errors.New(resp.Status)
	}
	return errors.New(body.Error)
}

// byPod finds the step whose folder is pod, if caller may touch it.
func (a *Agent) byPod(caller streams.Caller, target, pod string) (*step, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if target == a.opts.Name {
		for _, s := range a.steps {
			if s.pod == pod && (caller.Admin || s.key.team == caller.Team) {
				return s, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: pod %s/%s", streams.ErrNotFound, target, pod)
}

// Send serves the source side of a stream out of one of the agent's
// volumes to a gateway: the caller must be allowed the step's team.
func (a *Agent) Send(ctx context.Context, caller streams.Caller, from wire.Endpoint, encoding string, begin func() io.Writer) (int64, error) {
	s, err := a.byPod(caller, from.Target, from.Pod)
	if err != nil {
		return 0, err
	}
	src, err := s.openVolume(ctx, from.Handle, from.Path, encoding)
	if err != nil {
		return 0, &streams.Error{Side: streams.SideSource, Err: err}
	}
	defer src.Close()
	n, err := io.Copy(begin(), src)
	if err != nil {
		return n, &streams.Error{Side: streams.SideSource, Err: fmt.Errorf("after %d bytes: %w", n, err)}
	}
	return n, nil
}

// Stream is not served by an agent: a gateway makes streams, asking the
// agent for its volumes' bytes (Send).
func (a *Agent) Stream(context.Context, streams.Request, *streams.Progress) (wire.StreamResult, error) {
	return wire.StreamResult{}, fmt.Errorf("%w: an agent makes no streams; ask a gateway", streams.ErrInvalid)
}
