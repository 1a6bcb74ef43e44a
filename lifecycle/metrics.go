package lifecycle

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrUnreachable means the target's cluster could not record a decision.
var ErrUnreachable = errors.New("cannot reach the target's cluster")

// ErrDenied means the target's cluster refused jetway's credentials the
// request (403): the target's Role lacks a permission.
var ErrDenied = errors.New("the target's credentials are not allowed to do this")

// Metrics count what the lifecycle controller did. A nil *Metrics records
// nothing.
type Metrics struct {
	actions *prometheus.CounterVec
	deletes *prometheus.CounterVec
}

// NewMetrics registers the lifecycle metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_lifecycle_transitions_total",
			Help: "Lifecycle transitions this replica performed, by resulting state (landed, retired, pruned, resumed).",
		}, []string{"state"}),
		deletes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_step_pods_deleted_total",
			Help: "Step pods this replica deleted, by reason (gc, sync, retire).",
		}, []string{"reason"}),
	}
	for _, s := range []string{"landed", "retired", "pruned", "resumed"} {
		m.actions.WithLabelValues(s)
	}
	for _, r := range []string{"gc", "sync", "retire"} {
		m.deletes.WithLabelValues(r)
	}
	reg.MustRegister(m.actions, m.deletes)
	return m
}

func (m *Metrics) acted(state string) {
	if m != nil {
		m.actions.WithLabelValues(state).Inc()
	}
}

func (m *Metrics) deleted(reason string) {
	if m != nil {
		m.deletes.WithLabelValues(reason).Inc()
	}
}
