package mesh

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
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
	gwB, agentB := peerCert{name: "gw-b", kind: KindGateway}, peerCert{name: "gw-b", kind: KindAgent}
	for name, tt := range map[string]struct {
		theirs hello
		cert   peerCert // the peer's certificate
		ours   string   // our kind; gateway if empty
		err    string
		kind   bool // the error is ErrWrongKind
	}{
		"agreed":         {theirs: hello{Version: Version, Name: "gw-b", Kind: KindGateway}, cert: gwB},
		"an agent":       {theirs: hello{Version: Version, Name: "gw-b", Kind: KindAgent}, cert: agentB},
		"to an agent":    {theirs: hello{Version: Version, Name: "gw-b", Kind: KindGateway}, cert: gwB, ours: KindAgent},
		"newer version":  {theirs: hello{Version: Version + 1, Name: "gw-b", Kind: KindGateway}, cert: gwB, err: `peer "gw-b" speaks mesh version 2, this gateway 1`},
		"another name":   {theirs: hello{Version: Version, Name: "gw-c", Kind: KindGateway}, cert: gwB, err: `peer calls itself "gw-c", its certificate "gw-b"`},
		"unknown kind":   {theirs: hello{Version: Version, Name: "gw-b", Kind: "robot"}, cert: gwB, err: `unknown kind "robot"`},
		"agent as gw":    {theirs: hello{Version: Version, Name: "gw-b", Kind: KindGateway}, cert: agentB, err: `peer "gw-b" calls itself a gateway, its certificate is an agent's`, kind: true},
		"gw as agent":    {theirs: hello{Version: Version, Name: "gw-b", Kind: KindAgent}, cert: gwB, err: `peer "gw-b" calls itself an agent, its certificate is a gateway's`, kind: true},
		"agent to agent": {theirs: hello{Version: Version, Name: "gw-b", Kind: KindAgent}, cert: agentB, ours: KindAgent, err: `peer "gw-b" is an agent, as this member is; agents hold no session with each other`, kind: true},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			ours := hello{Version: Version, Name: "gw-a", Kind: cmp.Or(tt.ours, KindGateway)}
			done := make(chan error, 1)
			go func() {
				_, err := greet(b, tt.theirs, peerCert{name: "gw-a", kind: ours.Kind})
				done <- err
			}()
			got, err := greet(a, ours, tt.cert)
			<-done // the peer's own view: not under test
			if tt.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.theirs, got)
				return
			}
			assert.ErrorContains(t, err, tt.err)
			assert.Equal(t, tt.theirs.Version != Version, errors.Is(err, ErrVersion))
			assert.Equal(t, tt.kind, errors.Is(err, ErrWrongKind))
		})
	}
}
