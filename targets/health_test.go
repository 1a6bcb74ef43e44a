package targets

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// restFor returns a client of a fake API server that serves only paths.
func restFor(t *testing.T, paths map[string]int) rest.Interface {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, ok := paths[r.URL.Path]
		if !ok {
			code = http.StatusNotFound
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte("[-]etcd failed"))
	}))
	t.Cleanup(srv.Close)
	rc, err := rest.UnversionedRESTClientFor(&rest.Config{Host: srv.URL,
		ContentConfig: rest.ContentConfig{NegotiatedSerializer: scheme.Codecs.WithoutConversion()}})
	require.NoError(t, err)
	return rc
}

func TestReadyFallsBackToHealthz(t *testing.T) {
	ctx := context.Background()
	assert.NoError(t, ready(ctx, restFor(t, map[string]int{"/readyz": 200})))
	assert.NoError(t, ready(ctx, restFor(t, map[string]int{"/healthz": 200})), "old server without /readyz")
	err := ready(ctx, restFor(t, map[string]int{"/readyz": 500}))
	require.Error(t, err)
	_, reason := classify(ctx, err)
	assert.Equal(t, ReasonNotReady, reason)
}
