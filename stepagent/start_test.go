package stepagent

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Starts side by side spawn one supervisor: an extra one would wait on the
// lock and wake after the step ended, writing into a folder its owner may
// be deleting.
func TestStartsSideBySideSpawnOneSupervisor(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, Prepare(root, []byte(`{"handle":"h","path":"sh","args":["-c","echo hi"]}`)))
	var spawned atomic.Int32
	var supervisors sync.WaitGroup
	spawn := func(root string) error {
		spawned.Add(1)
		supervisors.Go(func() { assert.NoError(t, Supervise(root)) })
		return nil
	}
	var starts sync.WaitGroup
	for range 8 {
		starts.Go(func() { assert.NoError(t, start(root, []byte("[]"), spawn)) })
	}
	starts.Wait()
	supervisors.Wait()
	assert.Equal(t, int32(1), spawned.Load())
	st, ended, err := ReadStatus(root)
	require.NoError(t, err)
	require.True(t, ended)
	assert.Equal(t, ReasonExited, st.Reason)
	assert.Equal(t, 0, st.ExitStatus)
}
