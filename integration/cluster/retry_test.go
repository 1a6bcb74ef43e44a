package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A start that finds a port taken is tried again on new ports, a bounded
// number of times; any other failure is not.
func TestStartRetriesTakenPorts(t *testing.T) {
	taken := errors.New("start cluster it-2: wait for it-2/etcd: process exited: listen tcp 127.0.0.1:46657: bind: address already in use")
	starts := 0
	c, err := retryTakenPorts(context.Background(), func() (*Cluster, error) {
		starts++
		if starts < 2 {
			return nil, taken
		}
		return &Cluster{Name: "it-2"}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, "it-2", c.Name)
	assert.Equal(t, 2, starts)

	starts = 0
	_, err = retryTakenPorts(context.Background(), func() (*Cluster, error) { starts++; return nil, taken })
	assert.Equal(t, taken, err)
	assert.Equal(t, startAttempts, starts)

	starts = 0
	other := errors.New("configure cluster it-2: no binaries")
	_, err = retryTakenPorts(context.Background(), func() (*Cluster, error) { starts++; return nil, other })
	assert.Equal(t, other, err)
	assert.Equal(t, 1, starts)
}

// The harness's ports lie below the kernel's ephemeral range, where no
// outgoing connection takes one as its source port while a server is
// down (an API server restarted on its port found it taken so).
func TestFreePortsAreNotEphemeral(t *testing.T) {
	start := ephemeralStart()
	ports, err := freePorts(50)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ports {
		assert.Less(t, p, start)
		assert.GreaterOrEqual(t, p, 10000)
		assert.False(t, seen[p], "distinct")
		seen[p] = true
	}
	low, high := portsBelow(32768)
	assert.Equal(t, [2]int{20767, 32767}, [2]int{low, high})
	low, _ = portsBelow(15000)
	assert.Equal(t, 10000, low, "above the common service ports")
}
