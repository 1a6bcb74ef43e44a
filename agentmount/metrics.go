package agentmount

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/steppod"
)

// Metrics are the Chooser's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	mount *prometheus.GaugeVec
}

// NewMetrics registers the Chooser's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{mount: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "jetway_step_agent_mount",
		Help: "1 for each target, labelled with how its step pods get the step agent (--step-agent-mount auto): image-volume or init-container.",
	}, []string{"target", "mount"})}
	reg.MustRegister(m.mount)
	return m
}

// chose moves target from the old mount ("": none) to mount.
func (m *Metrics) chose(target string, old, mount steppod.AgentMount) {
	if m == nil {
		return
	}
	if old != "" {
		m.mount.DeleteLabelValues(target, string(old))
	}
	m.mount.WithLabelValues(target, string(mount)).Set(1)
}

// forgot drops a target gone from the registry.
func (m *Metrics) forgot(target string, mount steppod.AgentMount) {
	if m != nil {
		m.mount.DeleteLabelValues(target, string(mount))
	}
}
