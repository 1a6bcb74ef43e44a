package targets

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/internal/kubecount"
)

// Metrics are the targets' Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	checkDuration prometheus.Histogram
	checks        prometheus.Counter
	failures      *prometheus.CounterVec
	states        *stateCollector
	requests      *kubecount.Collector
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
		states: &stateCollector{
			counts: prometheus.NewDesc("jetway_targets",
				"Targets by Concourse worker state.", []string{"state"}, nil),
			state: prometheus.NewDesc("jetway_target_state",
				"1 for each target, labelled with its Concourse worker state and team (empty: global).",
				[]string{"target", "team", "state"}, nil),
			missing: prometheus.NewDesc("jetway_target_missing_permissions",
				"Required permissions the target's last check found missing (0 when none, or when it could not review them).",
				[]string{"target"}, nil),
		},
	}
	m.requests = kubecount.NewCollector("jetway_target_api",
		"each target's API server (from the target's last load: a rotated kubeconfig starts again)", []string{"target"}, func(yield func([]string, *kubecount.Counts)) {
			if r := m.states.registry; r != nil {
				r.eachRequests(func(name string, c *kubecount.Counts) { yield([]string{name}, c) })
			}
		})
	for _, reason := range []string{ReasonInvalid, ReasonUnreachable, ReasonTimeout, ReasonUnauthorized,
		ReasonNotReady, ReasonPermissions, ReasonError} {
		m.failures.WithLabelValues(reason)
	}
	reg.MustRegister(m.checkDuration, m.checks, m.failures, m.states, m.requests)
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

// stateCollector reads the registry's snapshot at scrape time: targets
// counted by state, and each target's state and missing permissions, the
// series an alert on one target needs. Its labels are the target's name
// (its entry in the targets directory) and team, never its server or
// credentials.
type stateCollector struct {
	counts, state, missing *prometheus.Desc
	registry               *Registry
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.counts
	ch <- c.state
	ch <- c.missing
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	// Every listed state is always exported, so an alert on one sees 0, not
	// a missing series; pruned and retired targets are listed nowhere.
	counts := map[State]int{StateRunning: 0, StateStalled: 0, StateLanding: 0, StateLanded: 0, StateRetiring: 0}
	var snapshot []Status
	if c.registry != nil {
		snapshot = c.registry.Snapshot()
	}
	for _, s := range snapshot {
		counts[s.State]++
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, 1, s.Name, s.Meta.Team, string(s.State))
		ch <- prometheus.MustNewConstMetric(c.missing, prometheus.GaugeValue, float64(len(s.MissingPermissions)), s.Name)
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.counts, prometheus.GaugeValue, float64(n), string(state))
	}
}
