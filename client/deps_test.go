package client

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/jetway-ci/jetway/internal/golist"
)

// heavy are the module paths a program that embeds the client must not
// get: Kubernetes' client and its API machinery, Garden, yamux and
// Prometheus, all of which the gateway needs and the client does not.
var heavy = []string{"k8s.io/", "sigs.k8s.io/", "code.cloudfoundry.org/garden", "github.com/hashicorp/yamux", "github.com/prometheus/"}

// The client imports only wire of jetway's API types (and the tar
// extractor), so `go list -deps` of it names none of the gateway's heavy
// dependencies.
func TestClientBringsNoKubernetesGardenYamuxOrPrometheus(t *testing.T) {
	deps := golist.Deps(t, "github.com/jetway-ci/jetway/client", false)
	var found []string
	for _, d := range deps {
		for _, h := range heavy {
			if strings.HasPrefix(d, h) {
				found = append(found, d)
			}
		}
	}
	if len(found) > 0 {
		t.Errorf("the client depends on %d such packages, %s among them: keep the API's types in wire",
			len(found), strings.Join(found[:min(len(found), 5)], ", "))
	}
	assert.True(t, slices.Contains(deps, "github.com/jetway-ci/jetway/wire"), "the client takes the API's types from wire")
}
