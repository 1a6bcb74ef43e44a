//go:build linux

package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// dialed remembers the TCP connections a member dialed, so that a test can
// kill the one under a live session.
type dialed struct {
	mu    sync.Mutex
	conns map[string]net.Conn // by local address
}

func (d *dialed) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns[c.LocalAddr().String()] = c
		d.mu.Unlock()
	}
	return c, err
}

// kill closes the TCP connection under s, as a dropped network path would.
func (d *dialed) kill(t *testing.T, s *session) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.conns[s.mux.LocalAddr().String()]
	require.NotNil(t, c, "the session's connection")
	c.Close()
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

func TestStreamsAndDroppedSessionsLeakNothing(t *testing.T) {
	const (
		cycles  = 10_000
		drops   = 100
		workers = 8
		// Goroutines and descriptors may be this many above the baseline:
		// runtime helpers come and go.
		tolerance = 5
	)
	c := newCA(t, "mesh-ca")
	sink := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	})
	d := &dialed{conns: map[string]net.Conn{}}
	b := startMember(t, c, "b", memberOpts{listen: true, bulk: 2, handler: sink}, "b1")
	a := startMember(t, c, "a", memberOpts{peers: []string{b.Addr().String()}, bulk: 2, backoff: time.Millisecond, dial: d.dial}, "a1")
	bulkUp(t, a, b, 2)

	body := strings.Repeat("x", 64<<10)
	cycle := func(i int) error {
		var resp *http.Response
		var err error
		if i%2 == 0 {
			resp, err = a.Client().Get("http://b/call")
		} else {
			resp, err = a.BulkClient().Post("http://b/volume", "application/octet-stream", strings.NewReader(body))
		}
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s", resp.Status)
		}
		return err
	}
	// idle closes the streams the HTTP clients keep for the next request,
	// whose goroutines are not leaks.
	idle := func() {
		a.transport.CloseIdleConnections()
		a.bulk.CloseIdleConnections()
	}
	for i := range 2 * workers {
		require.NoError(t, cycle(i))
	}
	idle()
	settled := func(what string, goroutines, fds int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			g, f := runtime.NumGoroutine(), openFDs(t)
			if g <= goroutines+tolerance && f <= fds+tolerance {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d goroutines (baseline %d), %d open files (baseline %d)", what, g, goroutines, f, fds)
			}
			time.Sleep(10 * time.Millisecond) // polling, with the deadline above
		}
	}
	// The baseline: whatever the warm-up left must settle first too.
	baseG, baseFD := runtime.NumGoroutine(), openFDs(t)
	settled("warm-up", baseG, baseFD)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < cycles; i += workers {
				if err := cycle(i); err != nil {
					errs <- fmt.Errorf("cycle %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	idle()
	settled("after the streams", baseG, baseFD)

	for i := range drops {
		old := a.session("b")
		d.kill(t, old)
		eventually(t, a, "the session dialed again", func() bool {
			s := a.session("b")
			return s != nil && s != old
		})
		bulkUp(t, a, b, 2)
		require.NoError(t, cycle(i), "after drop %d", i)
	}
	idle()
	settled("after the dropped sessions", baseG, baseFD)
}
