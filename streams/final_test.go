package streams

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// A stream-out whose volume server failed after its answer began (a
// folder it may not read) ends with its failure in a trailer: the stream
// fails with that final answer, naming the entry, and the destination's
// upload is cut rather than ended, so the part before never lands as a
// whole volume.
func TestAStreamOutFailingAfterItBeganIsAFinalAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		uploaded := make(chan error, 1)
		s := New(testOptions(volumeServers{
			"stream-out": func(req *http.Request) (*http.Response, error) {
				assert.NotEmpty(t, req.Header.Get(volumes.AcceptErrorTrailer), "the streamer reads the error trailer")
				resp := answer(http.StatusOK, io.NopCloser(strings.NewReader("the entries before")))
				resp.Trailer = http.Header{volumes.ErrorTrailer: {`422 volume h: tar entry "d700": openat: permission denied`}}
				return resp, nil
			},
			"stream-in": func(req *http.Request) (*http.Response, error) {
				_, err := io.ReadAll(req.Body)
				uploaded <- err
				if err != nil {
					return answer(http.StatusBadRequest, io.NopCloser(strings.NewReader(`{"error": "cut"}`))), nil
				}
				return answer(http.StatusNoContent, http.NoBody), nil
			},
		}))
		defer s.Close()
		_, err := s.Stream(context.Background(), crossTarget, nil)
		assert.EqualError(t, err, `source: stream-out src/h: 422 Unprocessable Entity: volume h: tar entry "d700": openat: permission denied`)
		remote, ok := errors.AsType[*RemoteError](err)
		require.True(t, ok, "%v", err)
		assert.True(t, remote.Final())
		assert.Error(t, <-uploaded, "the upload is cut, not ended")
	})
}

// sameTarget is a stream between two pods of target a, which jetway
// first asks the source to push directly.
var sameTarget = Request{StreamRequest: wire.StreamRequest{From: wire.Endpoint{Target: "a", Pod: "src", Handle: "h", Path: "out"},
	To: wire.Endpoint{Target: "a", Pod: "dst", Handle: "v", Path: "."}}, Caller: Caller{Admin: true}}

// A direct push refused for what the volume or the archive holds is not
// relayed after: the relay meets the same, and the copy is tried once.
// A push that fails for another reason (the pods cannot reach each
// other) still is.
func TestARefusedPushIsNotRelayed(t *testing.T) {
	for name, tc := range map[string]struct {
		code    int
		body    string
		relayed bool
		err     string
	}{
		"refused": {http.StatusBadRequest, `{"error":"the destination refused the push: stream-in: tar entry \"f\": a FIFO, and this folder takes no devices or FIFOs"}`, false,
			`source: stream-p2p-out src/h: Bad Request: the destination refused the push: stream-in: tar entry "f": a FIFO, and this folder takes no devices or FIFOs`},
		"unreadable": {volumes.StatusUnreadable, `{"error":"volume h: tar entry \"d700\": openat: permission denied"}`, false,
			`source: stream-p2p-out src/h: Unprocessable Entity: volume h: tar entry "d700": openat: permission denied`},
		"unreachable": {http.StatusBadGateway, `{"error":"stream to http://10.0.0.1:7788/...: connection refused"}`, true, ""},
	} {
		t.Run(name, func(t *testing.T) {
			var relays atomic.Int32
			opts := testOptions(volumeServers{
				"tickets": func(*http.Request) (*http.Response, error) { return answer(http.StatusNoContent, http.NoBody), nil },
				"stream-p2p-out": func(*http.Request) (*http.Response, error) {
					return answer(tc.code, io.NopCloser(strings.NewReader(tc.body))), nil
				},
				"stream-out": func(*http.Request) (*http.Response, error) {
					relays.Add(1)
					return answer(http.StatusOK, io.NopCloser(strings.NewReader("tar"))), nil
				},
				"stream-in": func(req *http.Request) (*http.Response, error) {
					_, _ = io.ReadAll(req.Body)
					return answer(http.StatusNoContent, http.NoBody), nil
				},
			})
			opts.Target = pods{"a/src": stepPod("a", "src", ""), "a/dst": stepPod("a", "dst", "")}.target
			s := New(opts)
			defer s.Close()
			res, err := s.Stream(context.Background(), sameTarget, nil)
			if !tc.relayed {
				assert.EqualError(t, err, tc.err)
				remote, ok := errors.AsType[*RemoteError](err)
				require.True(t, ok, "%v", err)
				assert.True(t, remote.Final())
				assert.Zero(t, relays.Load(), "not relayed")
				assert.Equal(t, 1.0, count(t, s.opts.Metrics.streams.WithLabelValues(ModeP2P, resultSource)))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, ModeRelay, res.Mode)
			assert.Equal(t, int32(1), relays.Load())
		})
	}
}
