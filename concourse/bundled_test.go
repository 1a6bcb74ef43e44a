package concourse

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/wire"
)

// The bundled types are Concourse v8.2.5's twelve, each its Docker Hub
// image of the version bundled, docker-image privileged and time with a
// version history per resource; a type the operator maps wins over the
// bundled one of its name, and the others are kept.
func TestBundledResourceTypes(t *testing.T) {
	var names []string
	for _, rt := range BundledResourceTypes {
		names = append(names, rt.Type)
		assert.Equal(t, "docker.io/concourse/"+rt.Type+"-resource:"+rt.Version, rt.Image)
		assert.Equal(t, rt.Type == "docker-image", rt.Privileged, rt.Type)
		assert.Equal(t, rt.Type == "time", rt.UniqueVersionHistory, rt.Type)
	}
	assert.Equal(t, []string{"bosh-io-release", "bosh-io-stemcell", "docker-image", "git", "github-release", "hg", "mock",
		"pool", "registry-image", "s3", "semver", "time"}, names)

	mine := wire.ResourceType{Type: "mock", Image: "jetway.test/mock-resource:dev"}
	extra := wire.ResourceType{Type: "jetway-test", Image: "jetway.test/busybox:1"}
	got := WithBundled([]wire.ResourceType{mine, extra})
	require.Len(t, got, len(BundledResourceTypes)+1)
	for i, rt := range got {
		if i > 0 {
			assert.Less(t, got[i-1].Type, rt.Type, "sorted by type")
		}
		switch rt.Type {
		case "mock":
			assert.Equal(t, mine, rt, "the operator's, not the bundled one")
		case "jetway-test":
			assert.Equal(t, extra, rt)
		case "git":
			assert.Equal(t, wire.ResourceType{Type: "git", Image: "docker.io/concourse/git-resource:1.22.3", Version: "1.22.3"}, rt)
		}
	}
	assert.Equal(t, BundledResourceTypes, WithBundled(nil))
}
