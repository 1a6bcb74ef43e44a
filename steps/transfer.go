package steps

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// uploadWait bounds how long a step whose pod is ready waits for its
// uploads before it errors, counted from its preparation as recorded.
const uploadWait = 10 * time.Minute

// Upload streams body, a tar (encoding raw) or a compressed one (gzip,
// zstd), into the step's input named input, which the step declared
// {from: {upload: true}}. Any gateway takes it: it waits for the step's
// pod to be prepared (its record says so), claims the input in the
// record, streams it into the pod and records it in; the step's owner
// starts the step once every upload is in. An input in, or coming in
// through a live gateway, is a conflict.
func (m *Manager) Upload(ctx context.Context, caller Caller, team, handle, input, encoding string, body io.Reader) (wire.InputDigest, error) {
	r, err := m.visible(caller, team, handle)
	if err != nil {
		return wire.InputDigest{}, err
	}
	if !slices.Contains(r.Summary.uploads(), input) {
		return wire.InputDigest{}, fmt.Errorf("%w: step %s has no input %q to upload", wire.ErrNotFound, handle, input)
	}
	if !slices.Contains(streams.Encodings, encoding) {
		return wire.InputDigest{}, &wire.FieldError{Field: "encoding", Msg: fmt.Sprintf("%q is not one of raw, gzip, zstd", encoding)}
	}
	if r, err = m.awaitPrepared(ctx, r, input); err != nil {
		return wire.InputDigest{}, err
	}
	if err := m.claim(ctx, r.Name, handle, input); err != nil {
		return wire.InputDigest{}, err
	}
	digest := steppod.NewDigest(body)
	to := wire.Endpoint{Target: r.Status.Placed.Target, Pod: r.Status.Placed.Pod, Handle: steppod.InputVolume(input)}
	err = m.opts.Streamer.PutVolume(ctx, to, encoding, digest)
	got := digest.Input(input)
	_, uerr := m.opts.Records.Update(context.WithoutCancel(ctx), r.Name, func(cur *Record) error {
		st := &cur.Status
		if st.Uploading[input].By != m.me {
			return errUnchanged
		}
		delete(st.Uploading, input)
		if err == nil {
			if st.Inputs == nil {
				st.Inputs = map[string]wire.InputDigest{}
			}
			st.Inputs[input] = got
		}
		return nil
	})
	if err != nil {
		return wire.InputDigest{}, fmt.Errorf("input %s: %w", input, err)
	}
	if uerr != nil {
		return wire.InputDigest{}, fmt.Errorf("input %s is in the step's pod, but not recorded: %w", input, uerr)
	}
	return got, nil
}

// awaitPrepared waits until the step's pod takes uploads (its spec is in
// it), or the step ends.
func (m *Manager) awaitPrepared(ctx context.Context, r *Record, input string) (*Record, error) {
	for {
		switch {
		case r.Status.End != nil:
			return nil, fmt.Errorf("%w: step %s ended before its input %q came", wire.ErrConflict, r.Summary.Handle, input)
		case !r.Status.Prepared.IsZero():
			return r, nil
		}
		changed := m.opts.Records.Changed()
		var ok bool
		if r, ok = m.opts.Records.Get(r.Name); !ok {
			return nil, wire.ErrNotFound
		}
		if r.Status.End != nil || !r.Status.Prepared.IsZero() {
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

// claim marks input as coming in through this gateway: an input in is a
// conflict; one coming in through another live gateway is unavailable
// for now (that upload may fail); a claim of a gateway gone (it died
// mid-upload) is taken.
func (m *Manager) claim(ctx context.Context, name, handle, input string) error {
	now := m.opts.Now().UTC()
	_, err := m.opts.Records.Update(ctx, name, func(cur *Record) error {
		st := &cur.Status
		if _, in := st.Inputs[input]; in {
			return fmt.Errorf("%w: input %q of step %s is uploaded already", wire.ErrConflict, input, handle)
		}
		if c, ok := st.Uploading[input]; ok && (c.By == m.me || m.opts.Owners.Alive(c.By)) {
			return fmt.Errorf("%w: input %q of step %s is being uploaded (through gateway %s since %s); if that fails, it may come again",
				wire.ErrUnavailable, input, handle, c.By, c.Since.Format(time.RFC3339))
		}
		if st.End != nil {
			return fmt.Errorf("%w: step %s ended before its input %q came", wire.ErrConflict, handle, input)
		}
		if st.Uploading == nil {
			st.Uploading = map[string]Claim{}
		}
		st.Uploading[input] = Claim{By: m.me, Since: now}
		return nil
	})
	return err
}

// awaitUpload waits for an uploaded input to be recorded in, within
// uploadWait of the step's preparation.
func (r *runner) awaitUpload(ctx context.Context, name string) (wire.InputDigest, error) {
	for {
		changed := r.k.opts.Records.Changed()
		rec, ok := r.record()
		if !ok {
			return wire.InputDigest{}, errRecordGone
		}
		if got, ok := rec.Status.Inputs[name]; ok {
			return got, nil
		}
		left := rec.Status.Prepared.Add(uploadWait).Sub(r.k.opts.Now())
		if left <= 0 {
			return wire.InputDigest{}, fmt.Errorf("input %s was not uploaded within %s of the step's pod being ready", name, uploadWait)
		}
		timer := time.NewTimer(left)
		select {
		case <-ctx.Done():
			timer.Stop()
			return wire.InputDigest{}, ctx.Err()
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// Download opens an output of an ended step whose pod is kept, as a tar
// in encoding (raw, gzip or zstd). Any gateway serves it.
func (m *Manager) Download(ctx context.Context, caller Caller, team, handle, output, encoding string) (io.ReadCloser, error) {
	r, err := m.visible(caller, team, handle)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(streams.Encodings, encoding) {
		return nil, &wire.FieldError{Field: "encoding", Msg: fmt.Sprintf("%q is not one of raw, gzip, zstd", encoding)}
	}
	if !slices.ContainsFunc(r.Summary.Outputs, func(o wire.Output) bool { return o.Name == output }) {
		return nil, fmt.Errorf("%w: step %s has no output %q", wire.ErrNotFound, handle, output)
	}
	v := r.View()
	switch {
	case !v.Phase.Final():
		return nil, fmt.Errorf("%w: step %s is %s: its outputs are there once it has ended", wire.ErrConflict, handle, v.Phase)
	case v.Released || len(v.Outputs) == 0:
		return nil, fmt.Errorf("%w: step %s's pod, and with it its outputs, is gone", wire.ErrConflict, handle)
	}
	for _, out := range v.Outputs {
		if out.Name == output {
			return m.opts.Streamer.OpenVolume(ctx, wire.Endpoint{Target: out.Target, Pod: out.Pod, Handle: out.Handle}, encoding)
		}
	}
	return nil, fmt.Errorf("%w: step %s has no output %q", wire.ErrNotFound, handle, output)
}
