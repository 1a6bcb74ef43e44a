package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

// volumeServers answers the volume servers' requests in memory: handlers
// by operation (the last path element), so a test gives each side a
// behaviour.
type volumeServers map[string]func(*http.Request) (*http.Response, error)

func (v volumeServers) RoundTrip(req *http.Request) (*http.Response, error) {
	op := req.URL.Path[strings.LastIndexByte(req.URL.Path, '/')+1:]
	if !strings.HasPrefix(req.Header.Get("Authorization"), "Bearer ") {
		return answer(http.StatusUnauthorized, io.NopCloser(strings.NewReader(`{"error": "no valid credential"}`))), nil
	}
	h, ok := v[op]
	if !ok {
		return nil, fmt.Errorf("no volume server handles %s", op)
	}
	return h(req)
}

func answer(code int, body io.ReadCloser) *http.Response {
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: http.Header{}, Body: body}
}

// slowBody sends nothing until its request's ctx ends, as a volume server
// that answered the headers and is still walking a big volume.
type slowBody struct{ ctx context.Context }

func (b slowBody) Read([]byte) (int, error) { <-b.ctx.Done(); return 0, b.ctx.Err() }
func (b slowBody) Close() error             { return nil }

var crossTarget = Request{StreamRequest: wire.StreamRequest{From: wire.Endpoint{Target: "a", Pod: "src", Handle: "h", Path: "out"},
	To: wire.Endpoint{Target: "b", Pod: "dst", Handle: "missing", Path: "in"}}, Caller: Caller{Admin: true}}

// stepPod is a pod as jetway makes it for target and team ("" for none):
// sealed, with a nonce, and bound to its UID by ownership.Bind.
func stepPod(target, name, team string) *corev1.Pod {
	labels := ownership.Labels(target, "jetway")
	if team != "" {
		labels[ownership.TeamLabel] = team
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + target + "-" + name), Labels: labels,
		Annotations: map[string]string{ownership.SealAnnotation: testKey.Seal(target, name, team), ownership.NonceAnnotation: target + "-" + name}},
		Status: corev1.PodStatus{PodIP: "10.0.0.1"}}
	bound, err := ownership.Bind(context.Background(), fake.NewClientset(p).CoreV1().Pods("ns"), testKey, target, p)
	if err != nil {
		panic(err)
	}
	return bound
}

// testKey is the installation's pod key in tests.
var testKey, _ = ownership.NewKey([]byte("0123456789abcdef0123456789abcdef"))

// pods is a fake of the targets' API servers: pods by "target/name".
type pods map[string]*corev1.Pod

// target serves each target's pods from a fake clientset, in namespace ns.
func (p pods) target(name string) (*targets.Target, error) {
	var objs []runtime.Object
	for key, pod := range p {
		if t, _, _ := strings.Cut(key, "/"); t == name {
			pod = pod.DeepCopy()
			pod.Namespace = "ns"
			objs = append(objs, pod)
		}
	}
	return &targets.Target{Config: &targets.Config{Name: name, Meta: targets.Metadata{Namespace: "ns"}},
		Core: fake.NewClientset(objs...).CoreV1()}, nil
}

// testOptions serve crossTarget's pods, as jetway's and no team's, from
// volume servers in memory.
func testOptions(servers volumeServers) Options {
	return Options{Installation: "jetway", Key: testKey, Transport: servers, Metrics: NewMetrics(prometheus.NewRegistry()),
		Target: pods{"a/src": stepPod("a", "src", ""), "b/dst": stepPod("b", "dst", "")}.target}
}

// A destination that fails while the source sends nothing fails the
// stream at once, naming the destination: the source is cancelled rather
// than waited on until the stall timeout.
func TestDestinationFailureEndsTheStreamAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(testOptions(volumeServers{
			"stream-out": func(req *http.Request) (*http.Response, error) {
				return answer(http.StatusOK, slowBody{req.Context()}), nil
			},
			"stream-in": func(*http.Request) (*http.Response, error) {
				return answer(http.StatusNotFound, io.NopCloser(strings.NewReader(`{"error": "volume \"missing\" not found"}`))), nil
			},
		}))
		defer s.Close()
		start := time.Now()
		_, err := s.Stream(context.Background(), crossTarget, nil)
		var serr *Error
		require.ErrorAs(t, err, &serr)
		assert.Equal(t, "destination", serr.Side, "%v", err)
		assert.Contains(t, err.Error(), `stream-in dst/missing: Not Found: volume "missing" not found`)
		assert.Zero(t, time.Since(start), "no wait for the stall timeout")
		assert.Equal(t, 1.0, count(t, s.opts.Metrics.streams.WithLabelValues(ModeRelay, resultDestination)))
	})
}

// A source failing mid-stream fails the stream naming the source, and the
// destination sees its upload cut rather than ended.
func TestSourceFailureAbortsTheUpload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		uploaded := make(chan error, 1)
		s := New(testOptions(volumeServers{
			"stream-out": func(*http.Request) (*http.Response, error) {
				body := io.MultiReader(strings.NewReader("some"), iotest.ErrReader(errors.New("connection lost")))
				return answer(http.StatusOK, io.NopCloser(body)), nil
			},
			"stream-in": func(req *http.Request) (*http.Response, error) {
				_, err := io.ReadAll(req.Body)
				uploaded <- err
				return answer(http.StatusBadRequest, io.NopCloser(strings.NewReader(`{"error": "stream-in: unexpected EOF"}`))), nil
			},
		}))
		defer s.Close()
		_, err := s.Stream(context.Background(), crossTarget, nil)
		var serr *Error
		require.ErrorAs(t, err, &serr)
		assert.Equal(t, SideSource, serr.Side, "%v", err)
		assert.EqualError(t, err, "source: connection lost")
		assert.EqualError(t, <-uploaded, "connection lost", "the upload ends with the source's error")
		assert.Equal(t, 1.0, count(t, s.opts.Metrics.streams.WithLabelValues(ModeRelay, resultSource)))
		assert.Equal(t, 4.0, count(t, s.opts.Metrics.bytes), "bytes relayed before the failure")
	})
}

// A destination answering success before it took the whole stream does
// not make a partial copy look complete.
func TestDestinationAnsweringEarlyFailsTheStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(testOptions(volumeServers{
			"stream-out": func(*http.Request) (*http.Response, error) {
				return answer(http.StatusOK, io.NopCloser(strings.NewReader(strings.Repeat("x", 1<<20)))), nil
			},
			"stream-in": func(*http.Request) (*http.Response, error) {
				return answer(http.StatusNoContent, http.NoBody), nil
			},
		}))
		defer s.Close()
		_, err := s.Stream(context.Background(), crossTarget, nil)
		assert.EqualError(t, err, "destination: stream-in dst/missing: answered before the stream ended")
	})
}
