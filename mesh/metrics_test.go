package mesh

import (
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The certificate's expiry is a metric from the start; a rotation that
// does not load is counted once, and the expiry stays the last good one's.
func TestCertificateMetrics(t *testing.T) {
	c := newCA(t, "mesh-ca")
	notAfter := time.Now().Add(time.Hour)
	caFile, certFile, keyFile := c.Files(t, c, t.TempDir(), "a", notAfter)
	id, err := LoadIdentity(caFile, certFile, keyFile)
	require.NoError(t, err)
	metrics := NewMetrics(prometheus.NewRegistry())
	_, err = New(Options{Identity: id, Metrics: metrics})
	require.NoError(t, err)
	assert.Equal(t, float64(notAfter.Unix()), testutil.ToFloat64(metrics.certExpiry))

	require.NoError(t, os.WriteFile(keyFile, []byte("half a key"), 0o600))
	future := time.Now().Add(time.Second)
	require.NoError(t, os.Chtimes(keyFile, future, future))
	for range 3 {
		assert.Error(t, id.Reload())
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.certFailures))
	assert.Equal(t, float64(notAfter.Unix()), testutil.ToFloat64(metrics.certExpiry))
}
