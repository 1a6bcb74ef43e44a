package portforward

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
)

func TestParseHost(t *testing.T) {
	target, ns, pod, err := parseHost("step.v1.2.ci.prod-eu")
	require.NoError(t, err)
	assert.Equal(t, []string{"prod-eu", "ci", "step.v1.2"}, []string{target, ns, pod})
	for _, bad := range []string{"pod", "ns.target", ".ns.target", ""} {
		_, _, _, err := parseHost(bad)
		assert.Error(t, err, bad)
	}
	assert.Equal(t, "p.ns.t:7788", Host("t", "ns", "p", 7788))
}

// TestFallbackMatchesRealUpgradeFailure dials client-go's WebSocket
// port-forward against a server that refuses the upgrade, as an API server
// without WebSocket support does, and checks the fallback decision fires
// on the error really returned.
func TestFallbackMatchesRealUpgradeFailure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upgrade refused", http.StatusBadRequest)
	}))
	defer srv.Close()
	u, err := url.Parse(srv.URL + "/api/v1/namespaces/ns/pods/p/portforward")
	require.NoError(t, err)
	ws, err := portforward.NewSPDYOverWebsocketDialer(u, &rest.Config{Host: srv.URL})
	require.NoError(t, err)
	_, _, err = ws.Dial(portforward.PortForwardProtocolV1Name)
	require.Error(t, err)
	assert.True(t, shouldFallback(err), "fallback must fire on %T: %v", err, err)
	assert.False(t, httpstream.IsUpgradeFailure(err),
		"apimachinery's check alone misses client-go's error; if this starts matching, the workaround can go")
}
