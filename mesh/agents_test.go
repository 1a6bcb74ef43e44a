package mesh

import (
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An agent joins a gateway as a member of kind agent, announcing itself.
func TestAnAgentJoinsAGateway(t *testing.T) {
	c := newCA(t, "mesh-ca")
	hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
	mac := startMember(t, c, "mac", memberOpts{kind: KindAgent, peers: []string{hub.Addr().String()}}, "mac")
	eventually(t, hub, "the agent's route", func() bool { return len(hub.Remotes()) == 1 })
	assert.Equal(t, []string{"mac/mac=running"}, remoteNames(hub))
	require.NotNil(t, hub.session("mac"))
	assert.Equal(t, KindAgent, hub.session("mac").kind)
	eventually(t, mac, "the hub's routes", func() bool { return len(mac.Remotes()) == 1 })
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
