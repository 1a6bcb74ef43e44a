package concourse

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
)

// TestCopiesCountWhatTheHolderCopied: a cow volume made of links counts
// as a linked copy, not as a copy of bytes; one whose files were copied
// (some, or all) counts as a copy of those bytes; one with both, as both.
func TestCopiesCountWhatTheHolderCopied(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	m.copied(0, 8, time.Millisecond)     // all linked
	m.copied(1<<20, 0, time.Millisecond) // all copied
	m.copied(100, 3, time.Millisecond)   // a file it could not link
	m.copied(0, 0, time.Millisecond)     // an empty parent
	assert.Equal(t, 2.0, testutil.ToFloat64(m.copies))
	assert.Equal(t, float64(1<<20+100), testutil.ToFloat64(m.copiedBytes))
	assert.Equal(t, 2.0, testutil.ToFloat64(m.linkedCopies))
}
