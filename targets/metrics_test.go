package targets

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTargetsGaugeHasEveryListedState(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRegistry(RegistryOptions{Interval: 1, Timeout: 1, Metrics: NewMetrics(reg)})
	a, b := testConfig(t, "a"), testConfig(t, "b")
	r.records["a"] = &record{name: "a", cfg: a, checked: true, healthy: true, target: listed(a, Lifecycle{State: StateLanded})}
	r.records["b"] = &record{name: "b", cfg: b, checked: true, healthy: true, target: listed(b, Lifecycle{PrunedHash: b.hash})}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "jetway_targets" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	assert.Equal(t, map[string]float64{"running": 0, "stalled": 0, "landing": 0, "landed": 1, "retiring": 0}, got,
		"every listed state, the pruned target in none")
}
