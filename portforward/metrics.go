package portforward

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the port-forward dialer's. A nil *Metrics records nothing.
type Metrics struct {
	open     prometheus.Gauge
	dials    *prometheus.CounterVec
	latency  prometheus.Histogram
	streams  *prometheus.CounterVec
	bytesIn  prometheus.Counter
	bytesOut prometheus.Counter
}

// NewMetrics registers the dialer's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetway_portforward_bytes_total",
		Help: "Bytes carried through port-forward streams, by direction (read from or written to pods).",
	}, []string{"direction"})
	m := &Metrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetway_portforward_connections",
			Help: "Open upgraded port-forward connections (one per pod in use).",
		}),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_portforward_dials_total",
			Help: "Port-forward connection upgrades, by transport and result (ok, timeout, cancelled, error).",
		}, []string{"transport", "result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetway_portforward_dial_seconds",
			Help:    "Time to upgrade a port-forward connection.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_portforward_streams_total",
			Help: "Forwarded connections opened, by result (ok, timeout, cancelled, error).",
		}, []string{"result"}),
		bytesIn:  bytes.WithLabelValues("read"),
		bytesOut: bytes.WithLabelValues("written"),
	}
	reg.MustRegister(m.open, m.dials, m.latency, m.streams, bytes)
	return m
}

// result is the result label: ok, timeout (the upgrade's DialTimeout or
// the caller's deadline passed), cancelled (the caller gave up or the
// Dialer stopped) or error.
func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
		return "cancelled"
	default:
		return "error"
	}
}

func (m *Metrics) dialed(transport string, err error, took time.Duration) {
	if m == nil {
		return
	}
	if transport == "" {
		transport = "none"
	}
	m.dials.WithLabelValues(transport, result(err)).Inc()
	if err == nil {
		m.latency.Observe(took.Seconds())
	}
}

func (m *Metrics) opened() {
	if m != nil {
		m.open.Inc()
	}
}

func (m *Metrics) closed() {
	if m != nil {
		m.open.Dec()
	}
}

func (m *Metrics) stream(err error) {
	if m != nil {
		m.streams.WithLabelValues(result(err)).Inc()
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
