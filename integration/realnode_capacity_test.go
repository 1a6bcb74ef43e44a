package integration

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/jetway-ci/jetway/steppod"
)

// TestRealNodeVolumeHolderStaysWithinItsLimit: a volume holder on a
// target whose volume holder size is 16Mi (steps.volumeHolder.size), asked through the gateway's
// worker volume API as a web node asks it to take more than that (a
// stream-in of 24 MiB; 10 MiB written into a cow copy, made of links, of
// 10 MiB), answers an
// error naming the limit and where it is set, and takes nothing of it:
// right after each refusal its emptyDir takes less than the sizeLimit on
// the node's disk, as the kubelet counts it, so the kubelet has nothing
// to evict; the pod runs on, never restarted, and later volume calls
// (create, stream-in, stream-out) work.
func TestRealNodeVolumeHolderStaysWithinItsLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const name, limit = "rn-full", 16 << 20
	rn := startRealNode(t)
	g := targetGateway(ctx, t, rn, name, "steps: {volumeHolder: {size: 16Mi}}\n",
		gatewayOptions{agentImage: rn.NodeImage("step-agent-image.tar")})
	api := newHolderAPI(ctx, t, g, name)
	create, streamIn := api.create, api.streamIn
	holderName := steppod.HolderName("jetway")
	holder := func() *corev1.Pod {
		t.Helper()
		p, err := rn.Client.CoreV1().Pods(name).Get(ctx, holderName, metav1.GetOptions{})
		require.NoError(t, err)
		return p
	}
	// withinItsLimit: the holder runs, never restarted, and its emptyDir
	// takes less than the sizeLimit on the node's disk right now.
	withinItsLimit := func(after string) {
		t.Helper()
		p := holder()
		usage, err := rn.EmptyDirUsage(p.UID, p.Spec.Volumes[0].Name)
		require.NoError(t, err)
		t.Logf("after %s, the holder's emptyDir takes %d bytes on the node's disk", after, usage)
		assert.Less(t, usage, int64(limit), "after %s, the emptyDir takes %d bytes on the node's disk", after, usage)
		assert.Equal(t, corev1.PodRunning, p.Status.Phase, "after %s: %s %s", after, p.Status.Reason, p.Status.Message)
		require.Len(t, p.Status.ContainerStatuses, 1)
		assert.Zero(t, p.Status.ContainerStatuses[0].RestartCount, after)
		assert.NotNil(t, p.Status.ContainerStatuses[0].State.Running, after)
	}

	code, msg := create(`{"handle":"up","strategy":{"type":"empty"},"properties":{"kind":"upload"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	assert.Contains(t, strings.Join(holder().Spec.Containers[0].Command, " "), "--capacity 16777216")

	code, msg = streamIn("up", "big", randomBytes(t, 24<<20))
	if code == http.StatusNoContent {
		// What a holder without its limit does: it takes the stream, and
		// the kubelet evicts it with every volume it holds.
		evicted(t, rn.Client.CoreV1().Events(name), holderName)
	}
	assert.Equal(t, http.StatusInsufficientStorage, code, msg)
	assert.Contains(t, msg, `tar entry "big": no room for 24.0 MiB more`)
	assert.Contains(t, msg, "capacity of 16.0 MiB (16777216 bytes)")
	assert.Contains(t, msg, "the target's steps.volumeHolder.size in its target.yaml, else the gateway's volume-holder-size")
	withinItsLimit("the refused stream-in")

	code, msg = streamIn("up", "ten", randomBytes(t, 10<<20))
	require.Equal(t, http.StatusNoContent, code, msg)
	// A copy is made of links: it takes no room for its files. What is
	// written into it does.
	code, msg = create(`{"handle":"copy","strategy":{"type":"cow","volume":"up"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	code, msg = streamIn("copy", "more", randomBytes(t, 10<<20))
	assert.Equal(t, http.StatusInsufficientStorage, code, msg)
	assert.Contains(t, msg, `tar entry "more": no room for 10.0 MiB more`)
	assert.Contains(t, msg, "capacity of 16.0 MiB (16777216 bytes)")
	withinItsLimit("the refused write into the copy")

	// The holder serves on: a new volume, a file in and out.
	code, msg = create(`{"handle":"small","strategy":{"type":"empty"}}`)
	require.Equal(t, http.StatusCreated, code, msg)
	code, msg = streamIn("small", "note", []byte("still here\n"))
	require.Equal(t, http.StatusNoContent, code, msg)
	assert.Equal(t, "still here\n", string(api.readFile("small", "note")))
	withinItsLimit("the later calls")
}

// randomBytes is n bytes no encoding shrinks.
func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

// evicted fails the test once the kubelet evicted the pod name (it
// measures an emptyDir about every minute), with the kubelet's words:
// its Evicted event (the pod itself ends Succeeded: its sidecar ends 0 on
// TERM).
func evicted(t *testing.T, events typedcorev1.EventInterface, name string) {
	t.Helper()
	var why string
	eventually(t, 4*time.Minute, func() error {
		list, err := events.List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=Evicted"})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return errorf("the holder took a stream past its limit, and is not evicted yet")
		}
		why = list.Items[0].Message
		return nil
	})
	t.Fatalf("the holder took a stream past its limit, and the kubelet evicted it: %s", why)
}
