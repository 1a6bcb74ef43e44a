package mesh

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMessagesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeMessage(&buf, hello{Version: 1, Name: "gw-a", Kind: KindGateway}))
	var got hello
	require.NoError(t, readMessage(&buf, &got))
	assert.Equal(t, hello{Version: 1, Name: "gw-a", Kind: KindGateway}, got)
	assert.ErrorIs(t, readMessage(&buf, &got), io.EOF, "between frames: the end")
}

func TestMalformedFramesAreNamed(t *testing.T) {
	long := make([]byte, 4)
	binary.BigEndian.PutUint32(long, MaxMessage+1)
	short := append(binary.BigEndian.AppendUint32(nil, 10), "{}"...)
	notJSON := append(binary.BigEndian.AppendUint32(nil, 3), "{{{"...)
	for name, frame := range map[string][]byte{"exceeds": long, "cut short": short, "invalid character": notJSON} {
		var v hello
		err := readMessage(bytes.NewReader(frame), &v)
		assert.ErrorIs(t, err, ErrMalformed, name)
		assert.ErrorContains(t, err, name)
	}
	assert.ErrorContains(t, writeMessage(io.Discard, strings.Repeat("x", MaxMessage)), "exceeds")
}

func TestGreetChecksVersionNameAndKind(t *testing.T) {
	for name, tt := range map[string]struct {
		theirs   hello
		certName string
		err      string
	}{
		"agreed":        {hello{Version: Version, Name: "gw-b", Kind: KindGateway}, "gw-b", ""},
		"newer version": {hello{Version: Version + 1, Name: "gw-b", Kind: KindGateway}, "gw-b", `peer "gw-b" speaks mesh version 2, this gateway 1`},
		"another name":  {hello{Version: Version, Name: "gw-c", Kind: KindGateway}, "gw-b", `peer calls itself "gw-c", its certificate "gw-b"`},
		"unknown kind":  {hello{Version: Version, Name: "gw-b", Kind: "robot"}, "gw-b", `unknown kind "robot"`},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := make(chan error, 1)
			go func() {
				_, err := greet(b, tt.theirs, "gw-a")
				done <- err
			}()
			got, err := greet(a, hello{Version: Version, Name: "gw-a", Kind: KindGateway}, tt.certName)
			require.NoError(t, <-done)
			if tt.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.theirs, got)
				return
			}
			assert.ErrorContains(t, err, tt.err)
			if tt.theirs.Version != Version {
				assert.ErrorIs(t, err, ErrVersion)
			}
		})
	}
}
