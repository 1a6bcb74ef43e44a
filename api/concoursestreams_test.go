package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

// A web node's p2p stream into a target another gateway owns is asked of
// that gateway, as the web node's caller, and what it answers is the
// stream's outcome: its result, or an error naming the side and the
// mesh member that failed. An owner the mesh cannot reach fails the
// destination's side at once, naming it.
func TestConcourseStreamsAskTheDestinationsOwner(t *testing.T) {
	req := streams.Request{StreamRequest: wire.StreamRequest{
		From:     wire.Endpoint{Target: "a-local", Pod: "holder", Handle: "src", Path: "."},
		To:       wire.Endpoint{Target: "b-main", Pod: "holder", Handle: "dst", Path: "."},
		Encoding: "zstd",
	}, Caller: streams.Caller{Admin: true}}
	var asked wire.StreamRequest
	var caller meshCaller
	answer := func(code int, body string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			require.Equal(t, "POST /api/v1/streams", r.Method+" "+r.URL.Path)
			require.NoError(t, json.NewDecoder(r.Body).Decode(&asked))
			require.NoError(t, json.Unmarshal([]byte(r.Header.Get(CallerHeader)), &caller))
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		})
	}
	run := func(reachable bool, h http.Handler) (wire.StreamResult, error) {
		m := &fakeMesh{name: "a", remotes: announcedBy("b", reachable, fleetB...), members: map[string]http.Handler{"b": h}}
		return ConcourseStreams(nil, fakeTargets{}, m)(context.Background(), req)
	}

	res, err := run(true, answer(http.StatusOK, `{"mode":"mesh","bytes":42,"sha256":"abc"}`))
	require.NoError(t, err)
	assert.Equal(t, wire.StreamResult{Mode: "mesh", Bytes: 42, SHA256: "abc"}, res)
	assert.Equal(t, req.StreamRequest, asked, "the stream as the web node's worker asked it")
	assert.Equal(t, meshCaller{Name: "concourse-web-node", Admin: true}, caller)

	_, err = run(true, answer(http.StatusBadGateway, `{"error":"stalled: no data from stream-out for 10s","side":"source","gateway":"a"}`))
	var se *streams.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, streams.SideSource, se.Side)
	assert.Equal(t, "source (mesh member a): stalled: no data from stream-out for 10s", err.Error())

	_, err = run(true, answer(http.StatusNotFound, `{"error":"unknown target b-main"}`))
	assert.ErrorIs(t, err, streams.ErrNotFound)
	assert.ErrorContains(t, err, "gateway b: unknown target b-main")

	res, err = run(false, answer(http.StatusOK, `{}`))
	assert.Equal(t, streams.ModeMesh, res.Mode, "a failure names the path it took")
	require.ErrorAs(t, err, &se)
	assert.Equal(t, streams.SideDestination, se.Side)
	assert.Equal(t, "b", se.Gateway)

	// A member that does not answer at all.
	_, err = run(true, nil)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, streams.SideDestination, se.Side)
	assert.True(t, errors.Is(err, se.Err))
	assert.ErrorContains(t, err, "over the mesh")
}
