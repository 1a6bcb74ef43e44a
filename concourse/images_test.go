package concourse

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestANodePortNotAnsweringYetIsWaitedFor: a pull of a holder's image
// that met its node port closed (kube-proxy's rules a moment behind the
// Service) is waited for; any other pull failure is not.
func TestANodePortNotAnsweringYetIsWaitedFor(t *testing.T) {
	const served = "localhost:31706/jetway/9744672b@sha256:2c5e"
	refused := `failed to do request: Head "https://localhost:31706/v2/jetway/9744672b/manifests/sha256:2c5e": dial tcp 127.0.0.1:31706: connect: connection refused`
	assert.True(t, nodePortNotYet(served, refused))
	assert.False(t, nodePortNotYet(served, "401 Unauthorized"), "a refused ticket is final")
	assert.False(t, nodePortNotYet("registry.example/app@sha256:2c5e", refused), "a registry's image is not the holder's")
	assert.False(t, nodePortNotYet("localhost:5000/app:1", refused), "a registry on the node's loopback is not the holder's")
}
