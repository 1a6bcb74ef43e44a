package targets

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the targets' Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	checkDuration prometheus.Histogram
	checks        prometheus.Counter
	failures      *prometheus.CounterVec
	states        *stateCollector
}

// NewMetrics registers the targets' metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		checkDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetway_target_check_duration_seconds",
			Help:    "Duration of one target health check (readiness probe and permission reviews).",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 13), // 2 ms .. 8 s
		}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_target_checks_total",
			Help: "Target health checks run.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_target_check_failures_total",
			Help: "Failed target checks (and invalid target entries), by reason.",
		}, []string{"reason"}),
		states: &stateCollector{desc: prometheus.NewDesc("jetway_targets",
			"Targets by Concourse worker state.", []string{"state"}, nil)},
	}
	for _, reason := range []string{ReasonInvalid, ReasonUnreachable, ReasonTimeout, ReasonUnauthorized,
		ReasonNotReady, ReasonPermissions, ReasonError} {
		m.failures.WithLabelValues(reason)
	}
	reg.MustRegister(m.checkDuration, m.checks, m.failures, m.states)
	return m
}

func (m *Metrics) checked(h Health) {
	if m == nil {
		return
	}
	m.checks.Inc()
	m.checkDuration.Observe(h.Duration.Seconds())
	if !h.OK() {
		m.failures.WithLabelValues(h.Reason).Inc()
	}
}

func (m *Metrics) failed(reason string) {
	if m != nil {
		m.failures.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) observeStates(r *Registry) {
	if m != nil {
		m.states.registry = r
	}
}

// stateCollector counts targets by state at scrape time.
type stateCollector struct {
	desc     *prometheus.Desc
	registry *Registry
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	// Every listed state is always exported, so an alert on one sees 0, not
	// a missing series; pruned and retired targets are listed nowhere.
	counts := map[State]int{StateRunning: 0, StateStalled: 0, StateLanding: 0, StateLanded: 0, StateRetiring: 0}
	if c.registry != nil {
		for _, s := range c.registry.Snapshot() {
			counts[s.State]++
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(state))
	}
}
