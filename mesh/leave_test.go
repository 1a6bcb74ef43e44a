package mesh

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A member that leaves right after answering a call (a retired agent)
// gets that answer to its caller. It used to close the session itself
// right after saying it leaves, and about one call in eighty on a loaded
// machine failed with "session shutdown" instead of the answer: the
// caller's HTTP client took the request it had sent, whose write the
// closing session failed after the fact, for one never sent, and retried
// it on the closed session. Now the caller closes the session once its
// calls are done. The race needs a busy machine to show, so this asks
// many times.
func TestALeavingMemberAnswersItsLastCall(t *testing.T) {
	c := newCA(t, "mesh-ca")
	for i := range 25 {
		hub := startMember(t, c, "hub", memberOpts{listen: true}, "h1")
		var pod *member
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut {
				go pod.stop()
				<-pod.ctx.Done()
			}
			fmt.Fprint(w, r.Method)
		})
		pod = startMember(t, c, "pod", memberOpts{peers: []string{hub.Addr().String()}, leave: true, handler: handler}, "p1")
		eventually(t, hub, "the pod's targets", func() bool { return len(hub.Remotes()) == 1 })
		// A call first, so the last one reuses its stream, as the API's do.
		assert.Equal(t, "GET", callPod(t, hub, http.MethodGet), "call %d", i)
		assert.Equal(t, "PUT", callPod(t, hub, http.MethodPut), "call %d", i)
		eventually(t, hub, "the pod gone", func() bool { return hub.session("pod") == nil && len(hub.Remotes()) == 0 })
		hub.stop()
	}
}

func callPod(t *testing.T, hub *member, method string) string {
	t.Helper()
	req, err := http.NewRequest(method, "http://pod/", http.NoBody)
	require.NoError(t, err)
	resp, err := hub.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
