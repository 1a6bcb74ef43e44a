package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

func TestParseEndpoint(t *testing.T) {
	e, err := parseEndpoint("from", "prod/get-1/vol-1:out/dir")
	require.NoError(t, err)
	assert.Equal(t, wire.Endpoint{Target: "prod", Pod: "get-1", Handle: "vol-1", Path: "out/dir"}, e)
	e, err = parseEndpoint("to", "prod/task/vol")
	require.NoError(t, err)
	assert.Empty(t, e.Path)
	for _, bad := range []string{"", "a/b", "a//c", "a/b/c/d"} {
		_, err := parseEndpoint("from", bad)
		assert.ErrorContains(t, err, "is not target/pod/handle[:path]", bad)
	}
}

func TestProgressText(t *testing.T) {
	assert.Equal(t, "  1.0 GiB  100.0 MiB/s", progressText(1<<30, 10.24, 0))
	assert.Equal(t, "512.0 MiB   51.2 MiB/s  [============            ]  50%  ETA 10s",
		progressText(512<<20, 10, 1<<30))
}

func TestFollowStream(t *testing.T) {
	var out, errOut bytes.Buffer
	body := strings.NewReader(`{"bytes":1048576,"seconds":0.5}
{"result":{"mode":"relay","bytes":2097152,"sha256":"abc","seconds":1}}
`)
	require.NoError(t, followStream(body, &out, &errOut, 0))
	assert.Equal(t, "streamed 2.0 MiB in 1.0s (2.0 MiB/s), sha256 abc\n", out.String())
	assert.Contains(t, errOut.String(), "1.0 MiB", "progress goes to stderr")

	err := followStream(strings.NewReader(`{"error":"stream-out x: 404 Not Found: volume \"x\" not found","side":"source"}`+"\n"), &out, &errOut, 0)
	assert.EqualError(t, err, `stream failed on the source side: stream-out x: 404 Not Found: volume "x" not found`)

	err = followStream(strings.NewReader(`{"error":"stalled: no data from stream-out a/h for 10s","side":"source","gateway":"gw-b"}`+"\n"), &out, &errOut, 0)
	assert.EqualError(t, err, `stream failed on the source side (mesh member gw-b): stalled: no data from stream-out a/h for 10s`)

	err = followStream(strings.NewReader(`{"bytes":5}`+"\n"), &out, &errOut, 0)
	assert.EqualError(t, err, "stream answer ended without a result", "a cut answer is a failure")

	out.Reset()
	require.NoError(t, followStream(strings.NewReader(`{"result":{"mode":"mesh","bytes":1024,"sha256":"abc","seconds":1}}`+"\n"), &out, &errOut, 0))
	assert.Equal(t, "streamed across the mesh 1.0 KiB in 1.0s (1.0 KiB/s), sha256 abc\n", out.String())

	out.Reset()
	require.NoError(t, followStream(strings.NewReader(`{"result":{"mode":"p2p","seconds":3.14}}`+"\n"), &out, &errOut, 0))
	assert.Equal(t, "pushed directly pod to pod (p2p) in 3.1s\n", out.String())

	out.Reset()
	require.NoError(t, followStream(strings.NewReader(`{"result":{"mode":"p2p","bytes":42,"sha256":"ab12","seconds":1}}`+"\n"), &out, &errOut, 0))
	assert.Equal(t, "pushed directly pod to pod (p2p) in 1.0s, 42 bytes, sha256 ab12\n", out.String())
}
