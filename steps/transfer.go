package steps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"slices"
	"time"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/streams"
)

// upload is one input the caller uploads.
type upload struct {
	done chan struct{} // closed once it is in the pod
	busy bool          // an upload is under way or done; under the step's lock
	got  stepagent.Input
}

// uploadWait bounds how long a step whose pod is ready waits for its
// uploads before it errors.
const uploadWait = 10 * time.Minute

// Upload streams body, a tar (encoding raw) or a compressed one (gzip,
// zstd), into the step's input named input, which the step declared
// {from: {upload: true}}. It waits for the step's pod to be ready for it.
// The step starts once every upload is in.
func (m *Manager) Upload(ctx context.Context, caller Caller, team, handle, input, encoding string, body io.Reader) (stepagent.Input, error) {
	s, err := m.visible(caller, team, handle)
	if err != nil {
		return stepagent.Input{}, err
	}
	u := s.uploads[input]
	if u == nil {
		return stepagent.Input{}, fmt.Errorf("%w: step %s has no input %q to upload", ErrNotFound, handle, input)
	}
	if !slices.Contains(streams.Encodings, encoding) {
		return stepagent.Input{}, &FieldError{Field: "encoding", Msg: fmt.Sprintf("%q is not one of raw, gzip, zstd", encoding)}
	}
	s.mu.Lock()
	busy := u.busy
	u.busy = true
	s.mu.Unlock()
	if busy {
		return stepagent.Input{}, fmt.Errorf("%w: input %q of step %s is uploaded already (or being uploaded)", ErrConflict, input, handle)
	}
	got, err := m.upload(ctx, s, input, encoding, body)
	if err != nil {
		s.mu.Lock()
		u.busy = false // another try may come
		s.mu.Unlock()
		return got, err
	}
	u.got = got
	close(u.done)
	return got, nil
}

func (m *Manager) upload(ctx context.Context, s *step, input, encoding string, body io.Reader) (stepagent.Input, error) {
	select {
	case <-s.ready:
	case <-s.done:
		return stepagent.Input{}, fmt.Errorf("%w: step %s ended before its input %q came", ErrConflict, s.key.handle, input)
	case <-ctx.Done():
		return stepagent.Input{}, ctx.Err()
	}
	v := s.snapshot()
	digest := NewDigest(body)
	to := streams.Endpoint{Target: v.Target, Pod: v.Pod, Handle: InputVolume(input)}
	if err := m.opts.Streamer.PutVolume(ctx, to, encoding, digest); err != nil {
		return stepagent.Input{}, fmt.Errorf("input %s: %w", input, err)
	}
	return digest.Input(input), nil
}

// Digest counts and hashes (SHA-256) the bytes read through it: what a
// step's input event reports of them, on a cluster and on an agent.
type Digest struct {
	r io.Reader
	h hash.Hash
	n int64
}

// NewDigest reads r through a Digest.
func NewDigest(r io.Reader) *Digest { return &Digest{r: r, h: sha256.New()} }

func (d *Digest) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.n += int64(n)
	d.h.Write(p[:n])
	return n, err
}

// Input is input name's bytes and SHA-256, as read so far.
func (d *Digest) Input(name string) stepagent.Input {
	return stepagent.Input{Name: name, Bytes: d.n, SHA256: hex.EncodeToString(d.h.Sum(nil))}
}

// readyForUploads lets the uploads in: the pod is prepared.
func (s *step) readyForUploads() {
	if s.ready == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.ready:
	default:
		close(s.ready)
	}
}

// awaitUpload waits for an uploaded input to be in the pod.
func (r *runner) awaitUpload(ctx context.Context, name string) (stepagent.Input, error) {
	u := r.s.uploads[name]
	t := time.NewTimer(uploadWait)
	defer t.Stop()
	select {
	case <-u.done:
		return u.got, nil
	case <-r.s.abort:
		return stepagent.Input{}, errAborted
	case <-t.C:
		return stepagent.Input{}, fmt.Errorf("input %s was not uploaded within %s of the step's pod being ready", name, uploadWait)
	case <-ctx.Done():
		return stepagent.Input{}, ctx.Err()
	}
}

// Download opens an output of an ended step whose pod is kept, as a tar
// in encoding (raw, gzip or zstd).
func (m *Manager) Download(ctx context.Context, caller Caller, team, handle, output, encoding string) (io.ReadCloser, error) {
	s, err := m.visible(caller, team, handle)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(streams.Encodings, encoding) {
		return nil, &FieldError{Field: "encoding", Msg: fmt.Sprintf("%q is not one of raw, gzip, zstd", encoding)}
	}
	if !slices.ContainsFunc(s.req.Outputs, func(o Output) bool { return o.Name == output }) {
		return nil, fmt.Errorf("%w: step %s has no output %q", ErrNotFound, handle, output)
	}
	v := s.snapshot()
	switch {
	case !v.Phase.Final():
		return nil, fmt.Errorf("%w: step %s is %s: its outputs are there once it has ended", ErrConflict, handle, v.Phase)
	case v.Released || len(v.Outputs) == 0:
		return nil, fmt.Errorf("%w: step %s's pod, and with it its outputs, is gone", ErrConflict, handle)
	}
	for _, out := range v.Outputs {
		if out.Name == output {
			return m.opts.Streamer.OpenVolume(ctx, streams.Endpoint{Target: out.Target, Pod: out.Pod, Handle: out.Handle}, encoding)
		}
	}
	return nil, fmt.Errorf("%w: step %s has no output %q", ErrNotFound, handle, output)
}
