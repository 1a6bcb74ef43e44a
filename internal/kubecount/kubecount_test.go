package kubecount_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/kubecount"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		want        kubecount.Request
	}{
		{"GET", "/api/v1/namespaces/ns/pods", kubecount.Request{Verb: "list", Resource: "pods"}},
		{"GET", "/api/v1/namespaces/ns/pods?labelSelector=a%3Db&watch=true", kubecount.Request{Verb: "watch", Resource: "pods"}},
		{"GET", "/api/v1/namespaces/ns/pods/p", kubecount.Request{Verb: "get", Resource: "pods"}},
		{"GET", "/api/v1/namespaces/ns/pods/p/log", kubecount.Request{Verb: "get", Resource: "pods/log"}},
		{"POST", "/api/v1/namespaces/ns/pods/p/portforward", kubecount.Request{Verb: "connect", Resource: "pods/portforward"}},
		{"GET", "/api/v1/namespaces/ns/pods/p/exec?command=sh", kubecount.Request{Verb: "connect", Resource: "pods/exec"}},
		{"POST", "/api/v1/namespaces/ns/pods/p/eviction", kubecount.Request{Verb: "create", Resource: "pods/eviction"}},
		{"POST", "/api/v1/namespaces/ns/secrets", kubecount.Request{Verb: "create", Resource: "secrets"}},
		{"PATCH", "/api/v1/namespaces/ns/secrets/s", kubecount.Request{Verb: "patch", Resource: "secrets"}},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", kubecount.Request{Verb: "update", Resource: "leases"}},
		{"DELETE", "/api/v1/namespaces/ns/pods/p", kubecount.Request{Verb: "delete", Resource: "pods"}},
		{"DELETE", "/api/v1/namespaces/ns/pods", kubecount.Request{Verb: "deletecollection", Resource: "pods"}},
		{"POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", kubecount.Request{Verb: "create", Resource: "selfsubjectaccessreviews"}},
		{"GET", "/api/v1/namespaces", kubecount.Request{Verb: "list", Resource: "namespaces"}},
		{"GET", "/api/v1/namespaces/ns", kubecount.Request{Verb: "get", Resource: "namespaces"}},
		{"GET", "/readyz", kubecount.Request{Verb: "get", Resource: "/readyz"}},
		{"GET", "/apis", kubecount.Request{Verb: "get", Resource: "/apis"}},
		{"GET", "/api/v1", kubecount.Request{Verb: "get", Resource: "/api/v1"}},
	} {
		t.Run(tc.method+" "+tc.url, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.url, nil)
			assert.Equal(t, tc.want, kubecount.Classify(req))
		})
	}
}

func TestCountsCountEachRequestThroughTheWrap(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hello")) }))
	defer srv.Close()
	var counts kubecount.Counts
	client := &http.Client{Transport: counts.Wrap(http.DefaultTransport)}
	for _, path := range []string{"/api/v1/namespaces/a/pods", "/api/v1/namespaces/b/pods", "/api/v1/namespaces/a/pods/p"} {
		resp, err := client.Get(srv.URL + path)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
	}
	var got []string
	counts.Each(func(r kubecount.Request, n kubecount.Count) {
		got = append(got, fmt.Sprintf("%s %s %d %d", r.Verb, r.Resource, n.Requests, n.Bytes))
	})
	assert.Equal(t, []string{"get pods 1 5", "list pods 2 10"}, got, "requests, and the bytes of their answers read")
	srv.CloseClientConnections()
}
