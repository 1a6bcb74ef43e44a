package concourse

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"code.cloudfoundry.org/garden"
	"code.cloudfoundry.org/garden/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/stepagent"
)

// endless is a message that never ends: a stdin message's start, then
// x after x, counting what is read of it.
type endless struct{ read int64 }

func (e *endless) Read(p []byte) (int, error) {
	start := []byte(`{"process_id":"p","source":0,"data":"`)
	n := 0
	if e.read == 0 {
		n = copy(p, start)
	}
	for i := n; i < len(p); i++ {
		p[i] = 'x'
	}
	e.read += int64(len(p))
	return len(p), nil
}

// TestProcessMessagesAreCapped: a message past the cap, one that never
// ends, fails once the cap is read, not when the client stops; what the
// reader took of it is bounded by the cap.
func TestProcessMessagesAreCapped(t *testing.T) {
	src := &endless{}
	handled := 0
	err := readMessages(bufio.NewReaderSize(src, 4096), maxProcessMessage, func(transport.ProcessPayload) error {
		handled++
		return nil
	})
	require.ErrorIs(t, err, errMessageTooLarge)
	assert.Zero(t, handled)
	assert.LessOrEqual(t, src.read, int64(maxProcessMessage+4096), "read no more than the cap and one buffer")
	assert.Equal(t, "a message on a process's connection is past 8388608 bytes", err.Error())
}

// TestProcessMessagesArriveWhole: Garden's client's messages, one JSON
// line each, arrive whole and in order, a stdin of a few MiB (a resource
// script's request, sent at once) too; a last message without its
// newline, too; a message that is not JSON ends the reading.
func TestProcessMessagesArriveWhole(t *testing.T) {
	stdin := strings.Repeat("0123456789abcdef", 4<<20/16) // 4 MiB
	var wire bytes.Buffer
	src := transport.Stdin
	sig := garden.SignalTerminate
	for _, m := range []transport.ProcessPayload{
		{ProcessID: "p", Source: &src, Data: &stdin},
		{ProcessID: "p", Source: &src},
		{ProcessID: "p", Signal: &sig},
	} {
		require.NoError(t, transport.WriteMessage(&wire, m))
	}
	wire.WriteString("\n")
	last, _ := json.Marshal(transport.ProcessPayload{ProcessID: "p", TTY: &garden.TTYSpec{WindowSize: &garden.WindowSize{Columns: 80, Rows: 24}}})
	wire.Write(last)
	var got []transport.ProcessPayload
	err := readMessages(bufio.NewReader(&wire), maxProcessMessage, func(m transport.ProcessPayload) error {
		got = append(got, m)
		return nil
	})
	require.ErrorIs(t, err, io.EOF)
	require.Len(t, got, 4)
	require.NotNil(t, got[0].Data)
	assert.Equal(t, stdin, *got[0].Data, "the whole stdin, in one message")
	assert.Nil(t, got[1].Data)
	assert.Equal(t, garden.SignalTerminate, *got[2].Signal)
	assert.Equal(t, uint16(80), got[3].TTY.WindowSize.Columns, "a last message without its newline")

	err = readMessages(bufio.NewReader(strings.NewReader("{\"signal\":\n")), maxProcessMessage, func(transport.ProcessPayload) error { return nil })
	assert.ErrorContains(t, err, "a message on a process's connection")
	stop := errors.New("stop")
	err = readMessages(bufio.NewReader(strings.NewReader("{}\n{}\n")), maxProcessMessage, func(transport.ProcessPayload) error { return stop })
	assert.ErrorIs(t, err, stop, "a handler's error ends the reading")
}

// A process's failure reaches the web node as final: never in words its
// Garden client takes for a dropped connection (ending in "EOF"), after
// which it would attach again, and jetway copy the volumes out again,
// without end.
func TestProcessErrorsAreFinal(t *testing.T) {
	cut := fmt.Errorf("container c: move volume v out of its pod (/out): source: %w", io.ErrUnexpectedEOF)
	assert.Equal(t, "container c: move volume v out of its pod (/out): source: unexpected EOF (jetway does not try again)", processError(cut))
	assert.False(t, strings.HasSuffix(processError(io.EOF), "EOF"))
	refused := errors.New(`container c: volume v cannot be copied out of its pod (/out): 400 Bad Request: stream-in: tar entry "f": a FIFO`)
	assert.Equal(t, refused.Error(), processError(refused), "other words as they are")
}

// A process that never started ends as an error, not an exit status:
// Garden's ExecutableNotFoundError where its program is missing, in
// words fly's hijacker takes for it (it then tries sh after bash).
func TestSpawnFailuresAreErrors(t *testing.T) {
	missing := stepagent.Status{Reason: stepagent.ReasonSpawnFailed, ExitStatus: 127,
		Message: "bash: executable file not found in $PATH in PATH /usr/bin:/bin"}
	err := spawnError(missing)
	var notFound garden.ExecutableNotFoundError
	require.ErrorAs(t, err, &notFound)
	assert.Contains(t, processError(err), "executable file not found")

	denied := stepagent.Status{Reason: stepagent.ReasonSpawnFailed, ExitStatus: 126, Message: "fork/exec /x: permission denied"}
	err = spawnError(denied)
	assert.False(t, errors.As(err, &notFound), "%v", err)
	assert.EqualError(t, err, denied.Message)
}
