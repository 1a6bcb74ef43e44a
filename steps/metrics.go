package steps

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/wire"
)

// Metrics are the steps' Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	submissions *prometheus.CounterVec
	takeovers   prometheus.Counter
	placements  prometheus.Histogram
	podDeletes  prometheus.Counter
	endings     *prometheus.CounterVec
	reattaches  prometheus.Counter
	sandboxes   *prometheus.CounterVec
	sandboxGone *prometheus.CounterVec
	rejected    *prometheus.CounterVec
}

// NewMetrics registers the steps' metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_steps_submitted_total",
			Help: "Steps accepted by POST /api/v1/steps (a repeated handle not counted), by type.",
		}, []string{"type"}),
		endings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_steps_finished_total",
			Help: "Steps ended, by type and final phase.",
		}, []string{"type", "phase"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_step_takeovers_total",
			Help: "Steps this gateway took over from a gateway that was gone (its lease lapsed or deleted).",
		}),
		placements: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetway_step_queue_seconds",
			Help:    "Time from a step's submission to its placement, for the steps this gateway placed.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}),
		podDeletes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_step_owned_pods_deleted_total",
			Help: "Step and sandbox pods this gateway deleted as their owner (lifecycle deletions: jetway_step_pods_deleted_total).",
		}),
		reattaches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_step_reattaches_total",
			Help: "Times a step's output stream broke and jetway attached again from the last complete frame.",
		}),
		sandboxes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_check_sandbox_checks_total",
			Help: "Checks with a reuse_key, by where they ran: warm (a live sandbox) or new (a sandbox made for them).",
		}, []string{"sandbox"}),
		sandboxGone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_check_sandboxes_deleted_total",
			Help: "Check sandboxes deleted, by why: idle (past check-sandbox-ttl), broken, or target (it takes no new work).",
		}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_steps_rejected_total",
			Help: "Pods with jetway's labels that a gateway refused to take as a step's or a check sandbox's, by reason: unsealed (jetway did not make it so: planted, or relabelled), unbound (sealed, but not bound to the UID jetway's create returned: planted with a copied seal, or its maker stopped before it bound it), replaced (not the pod the step's record names).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.submissions, m.endings, m.reattaches, m.sandboxes, m.sandboxGone, m.takeovers, m.placements, m.podDeletes, m.rejected)
	return m
}

func (m *Metrics) submitted(typ string) {
	if m != nil {
		m.submissions.WithLabelValues(typ).Inc()
	}
}

func (m *Metrics) finished(typ string, phase wire.Phase) {
	if m != nil {
		m.endings.WithLabelValues(typ, string(phase)).Inc()
	}
}

func (m *Metrics) reattached() {
	if m != nil {
		m.reattaches.Inc()
	}
}

func (m *Metrics) sandboxUsed(warm bool) {
	if m != nil {
		m.sandboxes.WithLabelValues(map[bool]string{true: "warm", false: "new"}[warm]).Inc()
	}
}

func (m *Metrics) sandboxDeleted(reason string) {
	if m != nil {
		m.sandboxGone.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) tookOver() {
	if m != nil {
		m.takeovers.Inc()
	}
}

func (m *Metrics) placed(waited time.Duration) {
	if m != nil {
		m.placements.Observe(waited.Seconds())
	}
}

func (m *Metrics) podDeleted() {
	if m != nil {
		m.podDeletes.Inc()
	}
}

// Reasons a pod is refused (jetway_steps_rejected_total).
const (
	rejectUnsealed = ownership.Unsealed
	rejectUnbound  = ownership.Unbound
	rejectReplaced = "replaced"
)

func (m *Metrics) rejectedPod(reason string) {
	if m != nil {
		m.rejected.WithLabelValues(reason).Inc()
	}
}
