package streams

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	ok := Request{StreamRequest: wire.StreamRequest{From: wire.Endpoint{Target: "a", Pod: "p", Handle: "h"}, To: wire.Endpoint{Target: "b", Pod: "q", Handle: "i"}}}
	require.NoError(t, ok.Validate())
	ok.Encoding = "zstd"
	require.NoError(t, ok.Validate())
	ok.Limit = "10.5"
	require.NoError(t, ok.Validate())

	bad := Request{StreamRequest: wire.StreamRequest{From: wire.Endpoint{Target: "a"}, Encoding: "br", Limit: "-1"}}
	err := bad.Validate()
	require.ErrorIs(t, err, ErrInvalid)
	for _, want := range []string{"from.pod is required", "from.handle is required", "to.target is required",
		`encoding "br" is not one of raw, gzip, zstd`, `limit "-1" is not a positive number of MB`} {
		assert.Contains(t, err.Error(), want)
	}
}

// stuckReader returns some data, then blocks until closed.
type stuckReader struct {
	data    []byte
	release chan struct{}
}

func (r *stuckReader) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	<-r.release
	return 0, errors.New("released")
}

func TestPumpHashesAndCounts(t *testing.T) {
	data := bytes.Repeat([]byte("artifact"), 100_000)
	var out bytes.Buffer
	h := sha256.New()
	wd := newWatchdog(time.Minute, func() {})
	var progress Progress
	n, err := pump(&out, bytes.NewReader(data), h, make([]byte, 4096), wd, &progress)
	assert.Equal(t, phaseNone, wd.stop())
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	assert.Equal(t, n, progress.Load())
	sum := sha256.Sum256(data)
	assert.Equal(t, sum[:], h.Sum(nil))
	assert.Equal(t, data, out.Bytes())
}

// The watchdog fires once no bytes moved for its timeout, give or take a
// tick, and blames the side the relay waited on.
func TestWatchdogBlamesTheSideItWaitsOn(t *testing.T) {
	const timeout = 2 * time.Minute
	t.Run("source stalls", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			src := &stuckReader{data: []byte("some"), release: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			wd := newWatchdog(timeout, cancel)
			go func() { <-ctx.Done(); close(src.release) }()
			start := time.Now()
			_, err := pump(io.Discard, src, sha256.New(), make([]byte, 16), wd, nil)
			require.Error(t, err)
			assert.Equal(t, phaseReading, wd.stop())
			assert.Equal(t, timeout+timeout/watchdogTicks, time.Since(start), "the first tick past the timeout")
		})
	})
	t.Run("destination stalls", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			pr, pw := io.Pipe() // nobody reads pr: writes block
			ctx, cancel := context.WithCancel(context.Background())
			wd := newWatchdog(timeout, cancel)
			go func() { <-ctx.Done(); pr.CloseWithError(errors.New("cancelled")) }()
			_, err := pump(pw, bytes.NewReader([]byte("data")), sha256.New(), make([]byte, 16), wd, nil)
			assert.ErrorIs(t, err, errDestinationDone)
			assert.Equal(t, phaseWriting, wd.stop())
		})
	})
	t.Run("slow but moving", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			wd := newWatchdog(timeout, func() { t.Error("cancelled a stream that moves") })
			src := &tricklingReader{n: 10, every: timeout - time.Second}
			n, err := pump(io.Discard, src, sha256.New(), make([]byte, 16), wd, nil)
			require.NoError(t, err)
			assert.Equal(t, int64(10), n)
			assert.Equal(t, phaseNone, wd.stop())
		})
	})
}

// tricklingReader returns one byte every interval, n times.
type tricklingReader struct {
	n     int
	every time.Duration
}

func (r *tricklingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.every)
	r.n--
	p[0] = 'x'
	return 1, nil
}
