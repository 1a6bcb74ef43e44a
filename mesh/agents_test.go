package mesh

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An agent joins a gateway as a member of kind agent, announcing itself;
// it is offered no route: the installation's targets, other teams' among
// them, are not its business.
func TestAnAgentJoinsAGateway(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	mac := startMember(t, c, "mac", memberOpts{kind: KindAgent, peers: []string{hub.Addr().String()}}, "mac")
	spoke := startMember(t, c, "spoke", memberOpts{peers: []string{hub.Addr().String()}}, "s1")
	eventually(t, hub, "the agent's route", func() bool { return len(hub.Remotes()) == 2 })
	assert.Equal(t, []string{"mac/mac=running", "spoke/s1=running"}, remoteNames(hub))
	require.NotNil(t, hub.session("mac"))
	assert.Equal(t, KindAgent, hub.session("mac").kind)
	eventually(t, spoke, "the hub's routes", func() bool { return len(spoke.Remotes()) == 2 })
	assert.Len(t, hub.offer(hub.session("spoke")), 2, "a gateway is offered the hub's and the agent's")
	assert.Empty(t, hub.offer(hub.session("mac")), "an agent is offered nothing")
	assert.Empty(t, mac.Remotes())
	resp, err := mac.Client().Get("http://hub/x")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "hub /x from mac: ", string(body))
}

// A peer's hello must say the kind its certificate is for: an agent
// cannot pass for a gateway, nor a gateway for an agent.
func TestAHelloMustSayItsCertificatesKind(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	for name, o := range map[string]memberOpts{
		"an agent saying gateway": {kind: KindAgent, hello: KindGateway},
		"a gateway saying agent":  {hello: KindAgent},
	} {
		t.Run(name, func(t *testing.T) {
			before := testutil.ToFloat64(hub.metrics.handshakes.WithLabelValues("wrong-kind"))
			o.peers = []string{hub.Addr().String()}
			liar := startMember(t, c, "liar", o, "liar")
			eventually(t, hub, "the refusal counted", func() bool {
				return testutil.ToFloat64(hub.metrics.handshakes.WithLabelValues("wrong-kind")) > before
			})
			assert.Empty(t, hub.Peers())
			assert.Empty(t, liar.Remotes(), "a refused peer learns no target")
			liar.stop()
		})
	}
}

// Two agents never hold a session with each other: each refuses the
// other.
func TestAgentsHoldNoSessionWithEachOther(t *testing.T) {
	c := newCA(t, "mesh-ca")
	a := startMember(t, c, "mac-a", memberOpts{kind: KindAgent, listen: true}, "mac-a")
	b := startMember(t, c, "mac-b", memberOpts{kind: KindAgent, peers: []string{a.Addr().String()}}, "mac-b")
	for _, m := range []*member{a, b} {
		eventually(t, m, m.Name()+" refused the other", func() bool {
			return testutil.ToFloat64(m.metrics.handshakes.WithLabelValues("wrong-kind")) >= 1
		})
		assert.Empty(t, m.Peers())
		assert.Empty(t, m.Remotes())
	}
}

// A bulk connection's hello is checked against its certificate as a
// session's is.
func TestABulkConnectionMustSayItsCertificatesKind(t *testing.T) {
	c := newCA(t, "mesh-ca")
	b := startMember(t, c, "b", memberOpts{listen: true, bulk: 1}, "b1")
	a := startMember(t, c, "a", memberOpts{kind: KindAgent, peers: []string{b.Addr().String()}, bulk: 1}, "a")
	sa, _ := bulkUp(t, a, b, 1)
	// A bulk connection of a's certificate, for a's session, whose hello
	// says gateway.
	liar := startMember(t, c, "a", memberOpts{identity: a.opts.Identity, kind: KindAgent, hello: KindGateway}, "a")
	fake := &session{m: liar.Mesh, peer: "b", theirs: sa.theirs, redial: liar.bulkDialer(b.Addr().String()), ctx: t.Context()}
	mux, err := fake.dialBulk(t.Context())
	if mux != nil {
		mux.Close()
	}
	require.Error(t, err, "the accepting side closes the connection")
	eventually(t, b, "the refusal counted", func() bool {
		return testutil.ToFloat64(b.metrics.handshakes.WithLabelValues("wrong-kind")) == 1
	})
	bulkUp(t, a, b, 1) // the live session's pool is untouched
}

// whoAsks answers with the origin of each call, as the API sees it.
func whoAsks(w http.ResponseWriter, r *http.Request) {
	peer, _ := Peer(r.Context())
	fmt.Fprintf(w, "%s (%s)", peer, PeerKind(r.Context()))
}

// get answers c's GET of url with its status and body.
func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// A gateway relaying a stream names its origin: the far member sees who
// made the call, not the gateway that carried it. Agents never talk to
// each other, even through a gateway.
func TestARelayedStreamCarriesItsOrigin(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true, bulk: 1}, "h1")
	spoke := func(name, kind string) *member {
		return startMember(t, c, name, memberOpts{kind: kind, peers: []string{hub.Addr().String()}, bulk: 1,
			handler: http.HandlerFunc(whoAsks)}, name)
	}
	b, a, mac := spoke("b", KindGateway), spoke("a", KindGateway), spoke("mac", KindAgent)
	spoke("mac-2", KindAgent)
	eventually(t, a, "every route at a", func() bool { return len(a.Remotes()) == 4 })
	eventually(t, mac, "the agent's session", func() bool { return mac.session("hub") != nil })
	assert.Empty(t, mac.Remotes(), "an agent learns no routes: the hub relays its calls")

	for _, tt := range []struct {
		from *member
		to   string
		want string
	}{
		{mac, "b", "mac (agent)"},
		{a, "b", "a (gateway)"},
		{b, "mac", "b (gateway)"},
	} {
		for _, client := range []*http.Client{tt.from.Client(), tt.from.BulkClient()} {
			code, body := get(t, client, "http://"+tt.to+"/x")
			assert.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, tt.want, body, "%s to %s", tt.from.Name(), tt.to)
		}
	}
	code, body := get(t, mac.Client(), "http://mac-2/x")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "hub relays no stream from agent mac to agent mac-2")
}

// An agent's stream header naming another origin is refused: it would
// borrow a gateway's identity.
func TestAnOriginNamedByAnAgentIsRefused(t *testing.T) {
	c := newCA(t, "mesh-ca")
	var served atomic.Int32
	b := startMember(t, c, "b", memberOpts{listen: true, handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		served.Add(1)
	})}, "b1")
	mac := startMember(t, c, "mac", memberOpts{kind: KindAgent, peers: []string{b.Addr().String()}}, "mac")
	eventually(t, mac, "the session", func() bool { return mac.session("b") != nil && b.session("mac") != nil })

	st, err := mac.session("b").open(t.Context(), header{Type: streamHTTP, To: "b", From: "gw-admin", FromKind: KindGateway})
	require.NoError(t, err)
	defer st.Close()
	_, _ = io.WriteString(st, "GET /x HTTP/1.1\r\nHost: b\r\n\r\n") // b may close it first
	_, err = http.ReadResponse(bufio.NewReader(st), nil)
	assert.Error(t, err, "the stream is closed unanswered")
	eventually(t, b, "the header counted malformed", func() bool { return testutil.ToFloat64(b.metrics.malformedFrames) == 1 })
	assert.Zero(t, served.Load())
	assert.NotNil(t, b.session("mac"), "the session goes on")
	code, _ := get(t, mac.Client(), "http://b/x")
	assert.Equal(t, http.StatusOK, code)
}

// A lost agent's target is forgotten on Forget (a pruned stalled worker),
// by the gateway that lost it and, at its next announcement, by the
// gateways it relayed the target to; while a live session announces the
// target, Forget refuses and names that peer. The agent joining again
// announces itself again.
func TestForgetALostAgent(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	spoke := startMember(t, c, "spoke", memberOpts{peers: []string{hub.Addr().String()}}, "s1")
	macID := issuedAs(t, c, "mac", roleAgent, scopeGlobal)
	mac := startMember(t, c, "mac", memberOpts{kind: KindAgent, identity: macID, peers: []string{hub.Addr().String()}}, "mac")
	eventually(t, spoke, "the agent relayed", func() bool { return slices.Contains(remoteNames(spoke), "mac/mac=running") })

	var announced *AnnouncedError
	require.ErrorAs(t, hub.Forget("mac", "mac"), &announced, "the agent is connected")
	assert.Equal(t, "mac", announced.Via)
	assert.ErrorIs(t, hub.Forget("mac", "other"), ErrNotLearned)

	mac.stop()
	eventually(t, hub, "the agent lost", func() bool { return hub.session("mac") == nil })
	eventually(t, spoke, "the agent unreachable at the spoke", func() bool {
		return slices.ContainsFunc(spoke.Remotes(), func(r Remote) bool { return r.Owner == "mac" && !r.Reachable })
	})
	require.ErrorAs(t, spoke.Forget("mac", "mac"), &announced, "the hub still announces it")
	assert.Equal(t, "hub", announced.Via)
	assert.Equal(t, 1.0, testutil.ToFloat64(hub.metrics.peers.WithLabelValues("lost")))

	require.NoError(t, hub.Forget("mac", "mac"))
	assert.Equal(t, []string{"spoke/s1=running"}, remoteNames(hub))
	assert.Equal(t, 0.0, testutil.ToFloat64(hub.metrics.peers.WithLabelValues("lost")))
	eventually(t, spoke, "the spoke forgets it too", func() bool { return !slices.Contains(remoteNames(spoke), "mac/mac=running") })
	assert.ErrorIs(t, hub.Forget("mac", "mac"), ErrNotLearned)

	startMember(t, c, "mac", memberOpts{kind: KindAgent, identity: macID, peers: []string{hub.Addr().String()}}, "mac")
	eventually(t, hub, "the agent back", func() bool { return slices.Contains(remoteNames(hub), "mac/mac=running") })
}
