package streams

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

// Send checks the caller may touch the source pod before it begins.
func TestSendChecksTheCallerFirst(t *testing.T) {
	opts := testOptions(volumeServers{"stream-out": func(*http.Request) (*http.Response, error) {
		t.Error("a stream-out for a caller who may not touch the pod")
		return nil, errors.New("no")
	}})
	opts.Target = pods{"a/src": stepPod("a", "src", "main")}.target
	s := New(opts)
	defer s.Close()
	began := false
	_, err := s.Send(context.Background(), Caller{Team: "other"}, crossTarget.From, "raw", func() io.Writer { began = true; return io.Discard })
	require.ErrorIs(t, err, ErrNotFound)
	assert.EqualError(t, err, `source: pod "src" not found on target "a"`, "as for a pod that does not exist")
	assert.False(t, began)

	_, err = s.Send(context.Background(), Caller{Team: "main"}, wire.Endpoint{Target: "a"}, "raw", func() io.Writer { return io.Discard })
	require.ErrorIs(t, err, ErrInvalid)
}

func TestSendCopiesTheSource(t *testing.T) {
	data := strings.Repeat("volume", 100_000)
	s := New(testOptions(volumeServers{"stream-out": func(req *http.Request) (*http.Response, error) {
		assert.Equal(t, "zstd", req.Header.Get("Accept-Encoding"))
		return answer(http.StatusOK, io.NopCloser(strings.NewReader(data))), nil
	}}))
	defer s.Close()
	var out bytes.Buffer
	n, err := s.Send(context.Background(), Caller{Admin: true}, crossTarget.From, "zstd", func() io.Writer { return &out })
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	assert.Equal(t, data, out.String())
	assert.Equal(t, 1.0, count(t, s.opts.Metrics.streams.WithLabelValues(modeMeshSend, resultOK)))
}

// A source that stops sending while its port-forward stays open is
// reported within the stall timeout and its tick, naming the gateway.
func TestSendReportsAStalledSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := testOptions(volumeServers{"stream-out": func(req *http.Request) (*http.Response, error) {
			return answer(http.StatusOK, io.NopCloser(io.MultiReader(strings.NewReader("some"), slowBody{req.Context()}))), nil
		}})
		opts.Gateway = "gw-b"
		s := New(opts)
		defer s.Close()
		start := time.Now()
		var out bytes.Buffer
		n, err := s.Send(context.Background(), Caller{Admin: true}, crossTarget.From, "raw", func() io.Writer { return &out })
		assert.Equal(t, DefaultStallTimeout+DefaultStallTimeout/watchdogTicks, time.Since(start))
		assert.LessOrEqual(t, time.Since(start), 12*time.Second, "the issue's bound, with room")
		assert.Equal(t, int64(4), n)
		assert.EqualError(t, err, "source (mesh member gw-b): stalled: no data from stream-out src/h for 10s")
	})
}

// A peer that stops taking bytes ends the send as the destination's
// failure.
func TestSendEndsWhenThePeerStopsReading(t *testing.T) {
	s := New(testOptions(volumeServers{"stream-out": func(*http.Request) (*http.Response, error) {
		return answer(http.StatusOK, io.NopCloser(strings.NewReader(strings.Repeat("x", 1<<20)))), nil
	}}))
	defer s.Close()
	pr, pw := io.Pipe()
	pr.CloseWithError(errors.New("peer gone"))
	_, err := s.Send(context.Background(), Caller{Admin: true}, crossTarget.From, "raw", func() io.Writer { return pw })
	var serr *Error
	require.ErrorAs(t, err, &serr)
	assert.Equal(t, SideDestination, serr.Side)
}

// A stream whose source comes over the mesh skips the source's pod (its
// owner checks it), relays what the owner sends, and names the owner when
// the source fails.
func TestAStreamFromTheMesh(t *testing.T) {
	var uploaded bytes.Buffer
	opts := testOptions(volumeServers{"stream-in": func(req *http.Request) (*http.Response, error) {
		_, err := io.Copy(&uploaded, req.Body)
		if err != nil {
			return answer(http.StatusBadRequest, io.NopCloser(strings.NewReader(`{"error": "cut"}`))), nil
		}
		return answer(http.StatusNoContent, http.NoBody), nil
	}})
	opts.Target = pods{"b/dst": stepPod("b", "dst", "")}.target // a is another gateway's
	opts.Gateway = "gw-b"
	s := New(opts)
	defer s.Close()
	req := crossTarget
	req.Source = &Remote{Gateway: "gw-a", Open: func(_ context.Context, from wire.Endpoint, encoding string) (io.ReadCloser, error) {
		assert.Equal(t, crossTarget.From, from)
		return io.NopCloser(strings.NewReader("over the mesh")), nil
	}}
	res, err := s.Stream(context.Background(), req, nil)
	require.NoError(t, err)
	assert.Equal(t, ModeMesh, res.Mode)
	assert.Equal(t, int64(13), res.Bytes)
	assert.Equal(t, "over the mesh", uploaded.String())

	req.Source.Open = func(context.Context, wire.Endpoint, string) (io.ReadCloser, error) {
		return io.NopCloser(io.MultiReader(strings.NewReader("part"), iotest.ErrReader(errors.New("over the mesh: unexpected EOF")))), nil
	}
	_, err = s.Stream(context.Background(), req, nil)
	assert.EqualError(t, err, "source (mesh member gw-a): over the mesh: unexpected EOF")

	req.To.Handle = "gone"
	opts.Target = pods{}.target
	_, err = New(opts).Stream(context.Background(), req, nil)
	assert.EqualError(t, err, `destination (mesh member gw-b): pod "dst" not found on target "b"`)
}
