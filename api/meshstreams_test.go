package api

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/streams"
)

// meshStreams is gateway a (owning fleet[:2]) and gateway b (owning
// fleetB), each with its fake streamer, joined by a fake mesh; a also
// knows the routes more (of other members).
func meshStreams(t *testing.T, more ...mesh.Remote) (a http.Handler, sa, sb *fakeStreamer) {
	t.Helper()
	sa, sb = &fakeStreamer{}, &fakeStreamer{sends: "the volume"}
	meshA := &fakeMesh{name: "a", remotes: append(announcedBy("b", true, fleetB...), more...), members: map[string]http.Handler{}}
	meshB := &fakeMesh{name: "b", remotes: announcedBy("a", true, fleet[:2]...), members: map[string]http.Handler{}}
	b := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB, Streams: sb, Tokens: tokens, Mesh: meshB}).Handler()
	a = New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleet[:2], Streams: sa, Tokens: tokens, Mesh: meshA}).Handler()
	meshA.members["b"], meshB.members["a"] = b, a
	return a, sa, sb
}

func TestAStreamFromAnotherGatewaysTargetComesOverTheMesh(t *testing.T) {
	a, sa, sb := meshStreams(t)
	w := postStream(t, a, "main-token-0123456789", "", streamBody("b-main", "global", "zstd"))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.JSONEq(t, `{"mode":"mesh","bytes":10,"sha256":"the volume","seconds":0}`, w.Body.String())
	require.Len(t, sa.requests(), 1)
	assert.Equal(t, "b", sa.requests()[0].Source.Gateway)
	assert.Equal(t, []streams.Caller{{Team: "main"}}, sb.sent, "b checks the caller's team")

	t.Run("a failure after the start names the side and the gateway", func(t *testing.T) {
		sb.sendErr = &streams.Error{Side: streams.SideSource, Err: errors.New("stalled: no data from stream-out a/h for 10s")}
		w := postStream(t, a, "main-token-0123456789", "", streamBody("b-main", "global", "raw"))
		assert.Equal(t, http.StatusBadGateway, w.Code)
		assert.JSONEq(t, `{"error":"stalled: no data from stream-out a/h for 10s","side":"source","gateway":"b"}`, w.Body.String())
		sb.sendErr = nil
	})
	t.Run("a pod b does not find", func(t *testing.T) {
		body := strings.Replace(streamBody("b-main", "global", "raw"), `"pod": "a"`, `"pod": "missing"`, 1)
		w := postStream(t, a, "main-token-0123456789", "", body)
		assert.Equal(t, http.StatusNotFound, w.Code, w.Body.String())
		assert.Contains(t, w.Body.String(), `pod \"missing\" not found on target \"b-main\"`)
	})
	t.Run("another team's target is unknown, and b is not asked", func(t *testing.T) {
		sent := len(sb.sent)
		w := postStream(t, a, "main-token-0123456789", "", streamBody("b-other", "global", "raw"))
		assert.Equal(t, http.StatusNotFound, w.Code)
		assert.Equal(t, `{"error":"unknown target b-other"}`+"\n", w.Body.String())
		assert.Len(t, sb.sent, sent)
	})
}

func TestAStreamIntoAnotherGatewaysTargetRunsThere(t *testing.T) {
	a, sa, sb := meshStreams(t)
	w := postStream(t, a, "main-token-0123456789", "", streamBody("global", "b-main", "raw"))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Empty(t, sa.requests(), "a only forwards it")
	require.Len(t, sb.requests(), 1, "b, the destination's owner, runs it")
	got := sb.requests()[0]
	assert.Equal(t, streams.Caller{Team: "main"}, got.Caller)
	assert.Equal(t, "a", got.Source.Gateway, "and asks a for the source")
	assert.Equal(t, []streams.Caller{{Team: "main"}}, sa.sent)
}

// The stream-out of the mesh is for peers only: on the API's listener it
// does not exist.
func TestStreamOutIsOnlyOverTheMesh(t *testing.T) {
	_, _, sb := meshStreams(t)
	h := New(Options{Gatherer: prometheus.NewRegistry(), Targets: fleetB, Streams: sb, Tokens: tokens, Mesh: &fakeMesh{name: "b"}}).Handler()
	w := serve(h, http.MethodPut, meshStreamOutPath, "admin-token-0123456789", `{"from": {"target": "b-main", "pod": "a", "handle": "h"}}`)
	assert.Equal(t, http.StatusNotFound, w.Code)
	assert.Empty(t, sb.sent)
}

// A source's body counts as whole only with the sender's word for it.
func TestAMeshBodyEndsOnlyWithTheSendersWord(t *testing.T) {
	read := func(trailer http.Header) error {
		resp := &http.Response{Body: io.NopCloser(strings.NewReader("12345")), Trailer: trailer}
		_, err := io.ReadAll(&meshBody{resp: resp})
		return err
	}
	assert.NoError(t, read(http.Header{trailerSent: {"5"}}))
	assert.EqualError(t, read(nil), "over the mesh: the stream ended after 5 bytes without the sender's word that it sent them all")
	assert.Error(t, read(http.Header{trailerSent: {"6"}}), "a count that is not what arrived")
	assert.EqualError(t, read(http.Header{trailerError: {"stream-out a/h: connection reset"}}), "stream-out a/h: connection reset")
}
