package concourse

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCompatibleAsAWebNodePlaces: a web node places work on workers of
// its worker version or a later one of the same major, as
// atc/worker/pool.go decides.
func TestCompatibleAsAWebNodePlaces(t *testing.T) {
	for _, tc := range []struct {
		have, want string
		ok         bool
	}{
		{"2.5", "2.5", true},
		{"2.6", "2.5", true},
		{"2.5.1", "2.5", true},
		{"2.4", "2.5", false},
		{"3.0", "2.5", false},
		{"1.9", "2.5", false},
		{"2.5", "2.5.0", true},
	} {
		ok, err := Compatible(tc.have, tc.want)
		require.NoError(t, err)
		assert.Equal(t, tc.ok, ok, "%s on a web node of %s", tc.have, tc.want)
	}
	_, err := Compatible("2.5", "two")
	assert.ErrorContains(t, err, `"two" is not a worker version like 2.5`)
}

func TestVersionErrorSaysWhatToRun(t *testing.T) {
	err := &VersionError{URL: "http://ci", Info: Info{Version: "9.0.0", WorkerVersion: "3.0"}, Have: "2.5"}
	assert.Equal(t, "worker version mismatch: the web node at http://ci (Concourse 9.0.0) places work only on workers "+
		"of version 3.0 or a later 3.x; jetway's workers are version 2.5, so none is registered: run a jetway that speaks worker version 3.0",
		err.Error())
}
