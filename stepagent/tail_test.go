package stepagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logStart is when the test logs begin.
var logStart = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// framesOf makes a frame of each kind, a millisecond apart.
func framesOf(kinds ...byte) []Frame {
	var fs []Frame
	for i, kind := range kinds {
		fs = append(fs, Frame{Kind: kind, Time: logStart.Add(time.Duration(i) * time.Millisecond), Payload: fmt.Appendf(nil, "frame %d", i)})
	}
	return fs
}

// endedStep prepares a step in a new root whose log holds fs, then a
// status frame, and status.json, as a supervisor leaves them. It returns
// the root and the log's frames, the status frame last.
func endedStep(t *testing.T, fs ...Frame) (string, []Frame) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, Prepare(root, []byte(`{"handle":"h","path":"true"}`)))
	log, err := os.Create(Path(root, LogFile))
	require.NoError(t, err)
	defer log.Close()
	st := Status{Reason: ReasonExited, StartedAt: logStart, FinishedAt: logStart.Add(time.Hour)}
	b, _ := json.Marshal(st)
	fs = append(slices.Clip(fs), Frame{Kind: KindStatus, Time: st.FinishedAt, Payload: b})
	w := bufio.NewWriter(log)
	for _, f := range fs {
		require.NoError(t, WriteFrameAt(w, f.Kind, f.Time, f.Payload))
	}
	require.NoError(t, w.Flush())
	require.NoError(t, writeStatus(root, st))
	return root, fs
}

// offsetOf is the offset of log[i] (the log's end for len(log)).
func offsetOf(log []Frame, i int) int64 {
	var off int64
	for _, f := range log[:i] {
		off += f.Size()
	}
	return off
}

// tailed runs TailFrom to its end and returns what it wrote.
func tailed(t *testing.T, root string, o TailOptions) []Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, TailFrom(ctx, root, o, &out))
	return readFrames(t, &out)
}

func readFrames(t *testing.T, r io.Reader) []Frame {
	t.Helper()
	var fs []Frame
	for {
		f, err := ReadFrame(r)
		if errors.Is(err, io.EOF) {
			return fs
		}
		require.NoError(t, err)
		fs = append(fs, f)
	}
}

// positionOf reads a KindPosition frame.
func positionOf(t *testing.T, f Frame) Position {
	t.Helper()
	require.Equal(t, KindPosition, f.Kind)
	assert.True(t, f.Time.IsZero(), "a position carries no time")
	var p Position
	require.NoError(t, json.Unmarshal(f.Payload, &p))
	return p
}

func TestTailFromSkipsToTheNthEvent(t *testing.T) {
	// Events: the inputs 0 and 1, the start 2, stdout 3, stderr 4, stdout 5.
	root, log := endedStep(t, framesOf(KindInput, KindInput, KindStarted, KindStdout, KindAnswer,
		KindStderr, KindAnswer, KindAnswer, KindStdout)...)
	end := len(log)
	for _, tt := range []struct {
		name string
		// from is the log's frame the tail starts at, fromEvents the
		// events before it.
		from, fromEvents, skip int
		// at is the log's frame the output starts with, events the
		// events before it.
		at, events int
	}{
		{"the start", 0, 0, 0, 0, 0},
		{"one event", 0, 0, 1, 1, 1},
		{"to the first output", 0, 0, 3, 3, 3},
		{"answers after the last skipped event are sent", 0, 0, 4, 4, 4},
		{"answers before it are skipped", 0, 0, 5, 6, 5},
		{"every event: the status frame is sent", 0, 0, 6, 9, 6},
		{"more than there are: the end", 0, 0, 7, end, 6},
		{"all: the end", 0, 0, -1, end, 6},
		{"from a position", 4, 4, 0, 4, 4},
		{"from a position, skipping", 4, 4, 1, 6, 5},
		{"from a position, all", 4, 4, -1, end, 6},
		{"from the end", end, 6, 0, end, 6},
		{"from the end, skipping", end, 6, 2, end, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := tailed(t, root, TailOptions{Offset: offsetOf(log, tt.from), Events: tt.fromEvents, Skip: tt.skip})
			require.GreaterOrEqual(t, len(fs), 2)
			assert.Equal(t, Position{Offset: offsetOf(log, tt.at), Events: tt.events}, positionOf(t, fs[0]))
			assert.Equal(t, log[tt.at:], fs[1:len(fs)-1], "the log from there, whole")
			trailer := fs[len(fs)-1]
			assert.Equal(t, KindStatus, trailer.Kind)
			var st Status
			require.NoError(t, json.Unmarshal(trailer.Payload, &st))
			assert.Equal(t, offsetOf(log, end), st.LogSize)
			assert.Equal(t, st.FinishedAt, trailer.Time, "the trailer is stamped with the step's end")
		})
	}
}

func TestTailFromRefusesAPositionNotInTheLog(t *testing.T) {
	root, log := endedStep(t, framesOf(KindStarted, KindStdout)...)
	size := offsetOf(log, len(log))
	for _, tt := range []struct {
		name string
		o    TailOptions
		want string
	}{
		{"past the end", TailOptions{Offset: size + HeaderSize}, fmt.Sprintf("offset %d is past the log's end, %d", size+HeaderSize, size)},
		{"past the end, skipping", TailOptions{Offset: size + 1, Skip: 1}, "past the log's end"},
		{"negative", TailOptions{Offset: -1, Events: -2}, "offset -1 is negative\nevents -2 is negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := TailFrom(context.Background(), root, tt.o, &out)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Zero(t, out.Len(), "no position for a place not in the log")
		})
	}
	err := TailFrom(context.Background(), t.TempDir(), TailOptions{Skip: -1}, io.Discard)
	assert.ErrorIs(t, err, ErrNotPrepared)
}

// A tail asked to skip more events than a running step has logged waits
// for them, then starts right after the last one.
func TestTailFromSkipsAheadOfARunningStep(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, Prepare(root, []byte(`{"handle":"h","path":"sh","args":["-c",
		"echo one; until [ -e ../go ]; do sleep 0.01; done; echo two; until [ -e ../go2 ]; do sleep 0.01; done; echo three"]}`)))
	release := func(name string) { require.NoError(t, os.WriteFile(Path(root, name), nil, 0o644)) }
	var supervisor sync.WaitGroup
	supervisor.Go(func() { assert.NoError(t, Supervise(root)) })
	t.Cleanup(func() { release("go"); release("go2"); supervisor.Wait() })
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(Path(root, LogFile))
		return bytes.Contains(b, []byte("one\n"))
	}, 10*time.Second, 5*time.Millisecond)

	pr, pw := io.Pipe()
	tailErr := make(chan error, 1)
	go func() {
		err := TailFrom(context.Background(), root, TailOptions{Skip: 3}, pw) // the start, one, two
		pw.CloseWithError(err)
		tailErr <- err
	}()
	defer pr.Close()
	release("go")
	r := bufio.NewReader(pr)
	f, err := ReadFrame(r)
	require.NoError(t, err)
	pos := positionOf(t, f)
	assert.Equal(t, 3, pos.Events)
	head, err := os.ReadFile(Path(root, LogFile))
	require.NoError(t, err)
	require.GreaterOrEqual(t, int64(len(head)), pos.Offset)
	skipped := readFrames(t, bytes.NewReader(head[:pos.Offset]))
	require.Len(t, skipped, 3, "the position is right after the third event")
	assert.Equal(t, []byte("two\n"), skipped[2].Payload)
	assert.NoFileExists(t, Path(root, StatusFile), "the position comes while the step runs")

	release("go2")
	rest := readFrames(t, r)
	require.NoError(t, <-tailErr)
	require.Len(t, rest, 3)
	assert.Equal(t, Frame{Kind: KindStdout, Time: rest[0].Time, Payload: []byte("three\n")}, rest[0])
	assert.Equal(t, KindStatus, rest[1].Kind)
	assert.Equal(t, KindStatus, rest[2].Kind)
}

// Skipping reads a log of any size in bounded memory.
func TestTailFromSkipsALargeLogInLittleMemory(t *testing.T) {
	const frames = 2048 // of MaxPayload: a 64 MiB log
	output := make([]Frame, frames)
	chunk := bytes.Repeat([]byte("x"), MaxPayload)
	for i := range output {
		output[i] = Frame{Kind: KindStdout, Time: logStart, Payload: chunk}
	}
	root, _ := endedStep(t, output...)

	var before, during, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	out := &firstWrite{do: func() { runtime.ReadMemStats(&during) }}
	require.NoError(t, TailFrom(context.Background(), root, TailOptions{Skip: frames - 2}, out))
	runtime.ReadMemStats(&after)

	t.Logf("skipping 64 MiB: heap in use %+d bytes, allocated %d bytes",
		int64(during.HeapInuse)-int64(before.HeapInuse), after.TotalAlloc-before.TotalAlloc)
	const slack = 16 << 20
	assert.Less(t, int64(during.HeapInuse)-int64(before.HeapInuse), int64(slack), "heap in use once skipped")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(slack), "allocated by the whole tail")
	fs := readFrames(t, &out.buf)
	require.Len(t, fs, 5, "the position, two outputs, the status frame, the trailer")
	frameSize := int64(HeaderSize + MaxPayload)
	assert.Equal(t, Position{Offset: (frames - 2) * frameSize, Events: frames - 2}, positionOf(t, fs[0]))
}

// firstWrite runs do at its first write, and keeps what is written.
type firstWrite struct {
	do  func()
	buf bytes.Buffer
}

func (w *firstWrite) Write(p []byte) (int, error) {
	if w.buf.Len() == 0 {
		w.do()
	}
	return w.buf.Write(p)
}

func TestFramesRoundTripWithTheirTime(t *testing.T) {
	at := time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.UTC)
	for _, tt := range []struct {
		name string
		f    Frame
	}{
		{"output", Frame{Kind: KindStdout, Time: at, Payload: []byte("hello\n")}},
		{"empty", Frame{Kind: KindStderr, Time: at, Payload: []byte{}}},
		{"whole", Frame{Kind: KindAnswer, Time: at, Payload: bytes.Repeat([]byte("a"), MaxPayload)}},
		{"no time", Frame{Kind: KindPosition, Payload: []byte(`{"offset":0,"events":0}`)}},
		{"another zone", Frame{Kind: KindInput, Time: at.In(time.FixedZone("x", 3600)), Payload: []byte("{}")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, WriteFrameAt(&buf, tt.f.Kind, tt.f.Time, tt.f.Payload))
			assert.Equal(t, tt.f.Size(), int64(buf.Len()))
			got, err := ReadFrame(&buf)
			require.NoError(t, err)
			assert.Equal(t, tt.f.Kind, got.Kind)
			assert.Equal(t, tt.f.Payload, got.Payload)
			assert.True(t, tt.f.Time.Equal(got.Time), "%v, want %v", got.Time, tt.f.Time)
			assert.Equal(t, time.UTC, got.Time.Location())
		})
	}

	var buf bytes.Buffer
	require.NoError(t, WriteFrameAt(&buf, KindStdout, at, []byte("hi")))
	assert.Equal(t, []byte{KindStdout, 0, 0, 0, 2, 0x18, 0x44, 0xe9, 0x6a, 0xc5, 0xf3, 0x4d, 0x15, 'h', 'i'}, buf.Bytes(),
		"kind, length, Unix nanoseconds, payload")
	buf.Reset()
	before := time.Now()
	require.NoError(t, WriteFrame(&buf, KindStderr, nil))
	got, err := ReadFrame(&buf)
	require.NoError(t, err)
	assert.WithinRange(t, got.Time, before.Truncate(0), time.Now(), "WriteFrame stamps the time now")
}

func TestReadFrameRefusesMalformedFrames(t *testing.T) {
	var whole bytes.Buffer
	require.NoError(t, WriteFrame(&whole, KindStdout, []byte("hello")))
	for _, tt := range []struct {
		name string
		b    []byte
		want error
	}{
		{"nothing", nil, io.EOF},
		{"half a header", whole.Bytes()[:HeaderSize-1], io.ErrUnexpectedEOF},
		{"half a payload", whole.Bytes()[:HeaderSize+2], io.ErrUnexpectedEOF},
		{"too long", []byte{KindStdout, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, ErrFrame},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tt.b))
			assert.ErrorIs(t, err, tt.want)
		})
	}
	assert.Error(t, WriteFrame(io.Discard, KindStdout, make([]byte, MaxPayload+1)))
}

func TestEventsAreOutputInputsAndTheStart(t *testing.T) {
	for kind, want := range map[byte]bool{
		KindStdout: true, KindStderr: true, KindInput: true, KindStarted: true,
		KindAnswer: false, KindPosition: false, KindStatus: false, KindMux: false, 0: false,
	} {
		assert.Equal(t, want, IsEvent(kind), "kind %d", kind)
	}
}

func TestTailOptionsValidate(t *testing.T) {
	assert.NoError(t, TailOptions{Skip: -1}.Validate())
	err := TailOptions{Offset: -1, Events: -1}.Validate()
	require.Error(t, err)
	assert.Equal(t, 2, strings.Count(err.Error(), "negative"), "every problem at once")
}
