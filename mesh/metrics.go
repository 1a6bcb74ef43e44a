package mesh

import (
	"crypto/x509"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the mesh's. A nil *Metrics records nothing.
type Metrics struct {
	peers           *prometheus.GaugeVec
	handshakes      *prometheus.CounterVec
	malformedFrames prometheus.Counter
	refused         *prometheus.CounterVec
	claims          *prometheus.CounterVec
	streams         prometheus.Counter
	bytesIn         prometheus.Counter
	bytesOut        prometheus.Counter
	forwarded       *prometheus.CounterVec
	bulk            prometheus.Gauge
	certExpiry      prometheus.Gauge
	certFailures    prometheus.Counter
}

// NewMetrics registers the mesh's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_mesh_stream_bytes_total",
		Help: "Bytes carried on mesh streams, by direction (in, out).",
	}, []string{"direction"})
	m := &Metrics{
		bytesIn:  bytes.WithLabelValues("in"),
		bytesOut: bytes.WithLabelValues("out"),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jetway_mesh_peers",
			Help: "Mesh peers by session state: up (a live session) or lost (it ended, and its targets are kept, stalled after the stall threshold).",
		}, []string{"state"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_mesh_handshake_failures_total",
			Help: "Mesh sessions refused or failed at setup, by reason (no-certificate, unknown-authority, expired, no-name, key-usage: a certificate not for both TLS client and server auth, no-role: one without a role URI, bad-role: one with both role URIs or an unknown one, agent-scope: an agent's naming no team (or global), duplicate: a second session of a member whose session answers, tls, version, hello, wrong-kind: a hello of another kind than its certificate, or an agent meeting an agent, yamux, bulk: a bulk connection naming no session of its dialer).",
		}, []string{"reason"}),
		malformedFrames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_mesh_malformed_frames_total",
			Help: "Malformed control frames received, each of which closed the session that sent it, and stream headers naming an origin their sender may not, each of which closed its stream.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_mesh_routes_refused_total",
			Help: "Announced routes refused, by reason (claims-this-member, agent-not-itself, invalid).",
		}, []string{"reason"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_mesh_agent_claims_refused_total",
			Help: "Announcements of agents that claimed a team, tags or privilege their certificate does not give them, by claim (team, tags, privileged); each agent is taken for what its certificate says.",
		}, []string{"claim"}),
		streams: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_mesh_streams_opened_total",
			Help: "Streams this member opened over the mesh (API calls and volume streams).",
		}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_mesh_forwarded_calls_total",
			Help: "API calls forwarded to the owner of their target, by result (ok, client-error, server-error, unreachable).",
		}, []string{"result"}),
		bulk: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetway_mesh_bulk_sessions",
			Help: "Bulk sessions up (the connections volume streams go on), over all peers: up to 8 per peer.",
		}),
		certExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetway_mesh_certificate_expiry_timestamp_seconds",
			Help: "When this member's mesh certificate, as last loaded, expires (Unix time): alert well before it.",
		}),
		certFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_mesh_certificate_reload_failures_total",
			Help: "Changed mesh certificate, key or CA files that did not load; the last good material stays in use.",
		}),
	}
	reg.MustRegister(m.peers, m.handshakes, m.malformedFrames, m.refused, m.claims, m.streams, bytes, m.forwarded,
		m.bulk, m.certExpiry, m.certFailures)
	return m
}

func (m *Metrics) sessionsChanged(mesh *Mesh) {
	if m == nil {
		return
	}
	mesh.mu.Lock()
	up, lost := len(mesh.sessions), len(mesh.lost)
	mesh.mu.Unlock()
	m.peers.WithLabelValues("up").Set(float64(up))
	m.peers.WithLabelValues("lost").Set(float64(lost))
}

func (m *Metrics) handshakeFailed(reason string) {
	if m != nil {
		m.handshakes.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) malformed() {
	if m != nil {
		m.malformedFrames.Inc()
	}
}

func (m *Metrics) routesRefused(reason string, n int) {
	if m != nil {
		m.refused.WithLabelValues(reason).Add(float64(n))
	}
}

func (m *Metrics) claimRefused(claim string) {
	if m != nil {
		m.claims.WithLabelValues(claim).Inc()
	}
}

func (m *Metrics) streamOpened() {
	if m != nil {
		m.streams.Inc()
	}
}

func (m *Metrics) read(n int) {
	if m != nil && n > 0 {
		m.bytesIn.Add(float64(n))
	}
}

func (m *Metrics) wrote(n int) {
	if m != nil && n > 0 {
		m.bytesOut.Add(float64(n))
	}
}

// Forwarded counts a forwarded API call by its result.
func (m *Metrics) Forwarded(result string) {
	if m != nil {
		m.forwarded.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) bulkSessions(delta int) {
	if m != nil {
		m.bulk.Add(float64(delta))
	}
}

// certificate notes a load of the mesh files: the certificate's expiry,
// or a failure.
func (m *Metrics) certificate(leaf *x509.Certificate, err error) {
	switch {
	case m == nil:
	case err != nil:
		m.certFailures.Inc()
	case leaf != nil:
		m.certExpiry.Set(float64(leaf.NotAfter.Unix()))
	}
}
