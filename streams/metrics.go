package streams

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetway-ci/jetway/wire"
)

// Metrics of the streams; a nil *Metrics records nothing.
type Metrics struct {
	streams  *prometheus.CounterVec
	rejected *prometheus.CounterVec
	bytes    prometheus.Counter
	duration *prometheus.HistogramVec
}

// Results of a stream that ran, and reasons a stream was refused: the
// label values.
const (
	resultOK          = "ok"
	resultSource      = "source_error"
	resultDestination = "destination_error"
	resultCanceled    = "canceled"

	reasonInvalid  = "invalid"
	reasonBusy     = "busy"
	reasonNotFound = "not_found"
	// ownership.Unsealed and ownership.Unbound: pods jetway may not trust.
	reasonUnsealed = "unsealed"
	reasonUnbound  = "unbound"
)

// NewMetrics registers the streams' metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_streams_total",
			Help: "Streams that ran, by mode (relay, p2p) and result (ok, source_error, destination_error, canceled).",
		}, []string{"mode", "result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetway_streams_rejected_total",
			Help: "Streams refused before they ran, by reason (invalid, busy: past max-streams, not_found: a pod missing or not the caller's; unsealed: a pod with jetway's labels but not its seal; unbound: a pod with its seal but not bound to the UID jetway's create returned (planted under the name of one of jetway's pods); both answered as not_found, and a request the gateway was about to send such a pod is not sent).",
		}, []string{"reason"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetway_stream_bytes_total",
			Help: "Encoded bytes relayed through jetway (direct streams pass none).",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "jetway_stream_duration_seconds",
			Help: "Time a stream ran, by mode, whatever its result.",
			// 50ms to about 7 minutes: artifacts from a few KiB to many GiB.
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}, []string{"mode"}),
	}
	reg.MustRegister(m.streams, m.rejected, m.bytes, m.duration)
	return m
}

// outcome is the result label of a stream that ran.
func outcome(ctx context.Context, err error) string {
	var serr *Error
	switch {
	case err == nil:
		return resultOK
	case ctx.Err() != nil:
		return resultCanceled
	case errors.As(err, &serr) && serr.Side == SideDestination:
		return resultDestination
	}
	return resultSource
}

func (m *Metrics) finished(res wire.StreamResult, result string) {
	if m == nil {
		return
	}
	m.streams.WithLabelValues(res.Mode, result).Inc()
	m.bytes.Add(float64(res.Bytes))
	m.duration.WithLabelValues(res.Mode).Observe(res.Seconds)
}

func (m *Metrics) reject(reason string) {
	if m != nil {
		m.rejected.WithLabelValues(reason).Inc()
	}
}
