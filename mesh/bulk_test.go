package mesh

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holder answers each request once released, and tells when one arrived:
// while it holds them, a test sees which sessions carry their streams.
type holder struct {
	arrived chan string
	release chan struct{}
}

func newHolder() *holder {
	return &holder{arrived: make(chan string, 16), release: make(chan struct{})}
}

func (h *holder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.arrived <- r.URL.Path
	select {
	case <-h.release:
	case <-r.Context().Done():
	}
	_, _ = io.Copy(io.Discard, r.Body)
	fmt.Fprint(w, "ok")
}

// wait takes n arrivals, or fails after 20 s.
func (h *holder) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-h.arrived:
		case <-time.After(20 * time.Second):
			t.Fatal("timed out waiting for a request to arrive")
		}
	}
}

// send makes a request with c in the background; its error, if any, and
// its answer's status go to errs.
func send(c *http.Client, method, url string, errs chan<- error) {
	go func() {
		req, err := http.NewRequest(method, url, strings.NewReader("some bytes"))
		if err == nil {
			var resp *http.Response
			if resp, err = c.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("%s %s: %s", method, url, resp.Status)
				}
			}
		}
		errs <- err
	}()
}

// streamsOn is how many streams each bulk session of s has open, sorted.
func streamsOn(s *session) []int {
	var n []int
	for _, b := range s.bulkMuxes() {
		n = append(n, b.NumStreams())
	}
	slices.Sort(n)
	return n
}

func (s *session) bulkMuxes() []*yamux.Session {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	var out []*yamux.Session
	for _, b := range s.bulk {
		out = append(out, b.mux)
	}
	return out
}

// testConnTypesWith is testConnTypes with both members started with o.
func testConnTypesWith(t *testing.T, o memberOpts, f func(t *testing.T, a, b *member)) {
	for _, kind := range []connKind{pipeConns, tcpConns, tlsConns} {
		t.Run(kind.name, func(t *testing.T) {
			c := newCA(t, "mesh-ca")
			a := startMember(t, c, "a", o, "a1")
			b := startMember(t, c, "b", o, "b1", "b2")
			kind.connect(t, a, b)
			f(t, a, b)
		})
	}
}

// bulkUp waits for n bulk sessions, their control streams closed, at
// both ends of the session between a and b.
func bulkUp(t *testing.T, a, b *member, n int) (sa, sb *session) {
	t.Helper()
	idle := slices.Repeat([]int{0}, n)
	eventually(t, a, fmt.Sprintf("%d bulk sessions up", n), func() bool {
		sa, sb = a.session(b.Name()), b.session(a.Name())
		return sa != nil && sb != nil && slices.Equal(streamsOn(sa), idle) && slices.Equal(streamsOn(sb), idle)
	})
	return sa, sb
}

func TestVolumeStreamsGoOnBulkSessions(t *testing.T) {
	h := newHolder()
	testConnTypesWith(t, memberOpts{bulk: 2, handler: h}, func(t *testing.T, a, b *member) {
		sa, sb := bulkUp(t, a, b, 2)
		errs := make(chan error, 4)

		// Two volume streams go one on each bulk session, none on the
		// session itself, which keeps its control stream alone.
		send(a.BulkClient(), http.MethodPut, "http://b/volume-1", errs)
		send(a.BulkClient(), http.MethodPut, "http://b/volume-2", errs)
		h.wait(t, 2)
		assert.Equal(t, []int{1, 1}, streamsOn(sa))
		assert.Equal(t, 1, sa.mux.NumStreams())

		// A call goes on the session itself.
		send(a.Client(), http.MethodGet, "http://b/call", errs)
		h.wait(t, 1)
		assert.Equal(t, 2, sa.mux.NumStreams())
		assert.Equal(t, []int{1, 1}, streamsOn(sa))

		// The side that did not dial puts its volume streams on the same
		// bulk sessions.
		send(b.BulkClient(), http.MethodPut, "http://a/volume-3", errs)
		h.wait(t, 1)
		assert.Equal(t, []int{1, 2}, streamsOn(sb))
		assert.Equal(t, 2, sb.mux.NumStreams())

		close(h.release)
		for range 4 {
			require.NoError(t, <-errs)
		}
		h.release = make(chan struct{})
	})
}

func TestVolumeStreamsShareTheSessionWhileNoBulkSessionIsUp(t *testing.T) {
	h := newHolder()
	testConnTypesWith(t, memberOpts{bulk: -1, handler: h}, func(t *testing.T, a, b *member) {
		sa := a.session("b")
		errs := make(chan error, 1)
		send(a.BulkClient(), http.MethodPut, "http://b/volume", errs)
		h.wait(t, 1)
		assert.Empty(t, sa.bulkMuxes())
		assert.Equal(t, 2, sa.mux.NumStreams())
		close(h.release)
		require.NoError(t, <-errs)
		h.release = make(chan struct{})
	})
}

func TestABulkSessionThatEndsIsDialedAgainAndAllEndWithTheirSession(t *testing.T) {
	testConnTypesWith(t, memberOpts{bulk: 2, backoff: time.Millisecond}, func(t *testing.T, a, b *member) {
		sa, sb := bulkUp(t, a, b, 2)

		// A bulk session ends, at either end: the dialer dials another.
		for _, end := range []func() *yamux.Session{
			func() *yamux.Session { return sa.bulkMuxes()[0] },
			func() *yamux.Session { return sb.bulkMuxes()[1] },
		} {
			before := sa.bulkMuxes()
			end().Close() // its connection dies at either end
			eventually(t, a, "a bulk session dialed again", func() bool {
				now := sa.bulkMuxes()
				return len(now) == 2 && (!slices.Contains(now, before[0]) || !slices.Contains(now, before[1]))
			})
			bulkUp(t, a, b, 2)
			assert.Equal(t, 2.0, testutil.ToFloat64(a.metrics.bulk), "a's bulk sessions counted")
			assert.Equal(t, 2.0, testutil.ToFloat64(b.metrics.bulk), "b's bulk sessions counted")
		}
		resp, err := a.BulkClient().Get("http://b/after")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, "b /after from a: ", string(body))

		pool := append(sa.bulkMuxes(), sb.bulkMuxes()...)
		sa.close()
		<-sa.done
		<-sb.done
		for _, m := range pool {
			assert.True(t, m.IsClosed(), "a bulk session outlived its session")
		}
		for _, m := range []*member{a, b} {
			eventually(t, m, "no bulk session counted", func() bool { return testutil.ToFloat64(m.metrics.bulk) == 0 })
		}
	})
}

func TestBulkConnectionsForAnotherSessionAreRefused(t *testing.T) {
	c := newCA(t, "mesh-ca")
	b := startMember(t, c, "b", memberOpts{listen: true, bulk: 1}, "b1")
	a := startMember(t, c, "a", memberOpts{peers: []string{b.Addr().String()}, bulk: 1, backoff: time.Millisecond}, "a1")
	other := startMember(t, c, "other", memberOpts{listen: true}, "o1")
	sa, sb := bulkUp(t, a, b, 1)
	stale := sa.theirs

	// a's session is lost and dialed again: its id is a new one.
	sa.close()
	eventually(t, a, "a new session", func() bool {
		s := a.session("b")
		return s != nil && s != sa && b.session("a") != nil && b.session("a") != sb
	})
	current := a.session("b").theirs

	for name, tc := range map[string]struct {
		from    *member
		session string
		addr    string
		err     string
		counted bool
	}{
		"the session before":      {from: a, session: stale, addr: b.Addr().String(), err: errBulkRefused.Error(), counted: true},
		"no session at all":       {from: a, session: "", addr: b.Addr().String(), err: errBulkRefused.Error(), counted: true},
		"another member's":        {from: other, session: current, addr: b.Addr().String(), err: errBulkRefused.Error(), counted: true},
		"reaching another member": {from: a, session: current, addr: other.Addr().String(), err: `reached "other", not "b"`},
	} {
		t.Run(name, func(t *testing.T) {
			refused := testutil.ToFloat64(b.metrics.handshakes.WithLabelValues("bulk"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fake := &session{m: tc.from.Mesh, peer: "b", theirs: tc.session, redial: tc.from.bulkDialer(tc.addr), ctx: ctx}
			mux, err := fake.dialBulk(ctx)
			if mux != nil {
				mux.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			if tc.counted {
				eventually(t, b, "the refusal counted", func() bool {
					return testutil.ToFloat64(b.metrics.handshakes.WithLabelValues("bulk")) == refused+1
				})
			}
		})
	}
	bulkUp(t, a, b, 1) // the live session's pool is untouched
}

func TestAHubRelaysVolumeStreamsOnBulkSessions(t *testing.T) {
	c := newCA(t, "mesh-ca")
	h := newHolder()
	hub := startMember(t, c, "hub", memberOpts{listen: true, bulk: 2}, "h1")
	a := startMember(t, c, "a", memberOpts{peers: []string{hub.Addr().String()}, bulk: 2}, "a1")
	b := startMember(t, c, "b", memberOpts{peers: []string{hub.Addr().String()}, bulk: 2, handler: h}, "b1")
	eventually(t, a, "b's target at a", func() bool { return len(a.Remotes()) == 2 })
	ha, _ := bulkUp(t, hub, a, 2)
	hb, _ := bulkUp(t, hub, b, 2)

	errs := make(chan error, 2)
	send(a.BulkClient(), http.MethodPut, "http://b/volume", errs)
	h.wait(t, 1)
	assert.Equal(t, []int{0, 1}, streamsOn(ha), "the stream came to the hub on a bulk session")
	assert.Equal(t, []int{0, 1}, streamsOn(hb), "the hub carried it on on a bulk session")
	assert.Equal(t, 1, ha.mux.NumStreams())
	assert.Equal(t, 1, hb.mux.NumStreams())

	send(a.Client(), http.MethodGet, "http://b/call", errs)
	h.wait(t, 1)
	assert.Equal(t, 2, hb.mux.NumStreams(), "a call goes on the sessions themselves")
	close(h.release)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}
