package streams

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
)

func TestMayTouch(t *testing.T) {
	s := New(Options{Installation: "jetway", Transport: volumeServers{}})
	admin, main := Caller{Admin: true}, Caller{Team: "main"}
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	otherInstallation := stepPod("a", "x", "main")
	otherInstallation.Labels[ownership.InstallationLabel] = "staging"
	emptyTeam := stepPod("a", "x", "")
	emptyTeam.Labels[ownership.TeamLabel] = ""
	for _, tc := range []struct {
		name   string
		caller Caller
		pod    *corev1.Pod
		want   bool
	}{
		{"admin, jetway pod without team", admin, stepPod("a", "x", ""), true},
		{"admin, a team's pod", admin, stepPod("a", "x", "other"), true},
		{"admin, pod jetway did not make", admin, foreign, false},
		{"admin, another installation's pod", admin, otherInstallation, false},
		{"admin, another target's pod", admin, stepPod("b", "x", ""), false},
		{"team, its pod", main, stepPod("a", "x", "main"), true},
		{"team, another team's pod", main, stepPod("a", "x", "other"), false},
		{"team, pod without team", main, stepPod("a", "x", ""), false},
		{"team, pod jetway did not make", main, foreign, false},
		{"team, another installation's pod of its team", main, otherInstallation, false},
		{"nobody, pod with an empty team", Caller{}, emptyTeam, false},
	} {
		assert.Equal(t, tc.want, s.mayTouch(tc.caller, "a", tc.pod), tc.name)
	}
	assert.False(t, New(Options{Transport: volumeServers{}}).mayTouch(admin, "a", stepPod("a", "x", "")),
		"without an installation, no pod is jetway's")
}

// A pod the caller may not touch answers exactly as a missing one, and
// no volume server hears of the stream.
func TestPodsNotTheCallersAnswerAsMissing(t *testing.T) {
	var calls atomic.Int32
	opts := testOptions(volumeServers{
		"stream-out": func(*http.Request) (*http.Response, error) { calls.Add(1); return nil, nil },
		"stream-in":  func(*http.Request) (*http.Response, error) { calls.Add(1); return nil, nil },
	})
	opts.Target = pods{"a/src": stepPod("a", "src", "other"), "b/dst": stepPod("b", "dst", "main"),
		"a/foreign": {ObjectMeta: metav1.ObjectMeta{Name: "foreign"}}}.target
	s := New(opts)
	defer s.Close()
	main := Caller{Team: "main"}
	answer := func(caller Caller, fromPod string) error {
		req := crossTarget
		req.Caller, req.From.Pod = caller, fromPod
		_, err := s.Stream(context.Background(), req, nil)
		return err
	}
	missing := answer(main, "nope")
	require.ErrorIs(t, missing, ErrNotFound)
	assert.EqualError(t, missing, `source: pod "nope" not found on target "a"`)
	for name, err := range map[string]error{
		"another team's pod":                      answer(main, "src"),
		"a pod jetway did not make, for an admin": answer(Caller{Admin: true}, "foreign"),
		"a pod jetway did not make, for a team":   answer(main, "foreign"),
	} {
		require.ErrorIs(t, err, ErrNotFound, name)
		assert.Equal(t, strings.ReplaceAll(missing.Error(), "nope", podName(err)), err.Error(), name)
	}
	assert.Zero(t, calls.Load(), "no volume server was asked")
	assert.Equal(t, 4.0, count(t, opts.Metrics.rejected.WithLabelValues(reasonNotFound)))
}

// podName is the pod an ErrNotFound names.
func podName(err error) string {
	_, after, _ := strings.Cut(err.Error(), `pod "`)
	name, _, _ := strings.Cut(after, `"`)
	return name
}

// Past MaxStreams a stream is refused at once; a finished one frees its
// slot.
func TestMaxStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		opts := testOptions(volumeServers{
			"stream-out": func(*http.Request) (*http.Response, error) {
				return answer(http.StatusOK, http.NoBody), nil
			},
			"stream-in": func(req *http.Request) (*http.Response, error) {
				<-release
				return answer(http.StatusNoContent, http.NoBody), nil
			},
		})
		opts.MaxStreams = 1
		s := New(opts)
		defer s.Close()
		first := make(chan error, 1)
		var progress Progress
		go func() {
			_, err := s.Stream(context.Background(), crossTarget, &progress)
			first <- err
		}()
		<-progress.Started()
		_, err := s.Stream(context.Background(), crossTarget, nil)
		require.ErrorIs(t, err, ErrBusy)
		assert.EqualError(t, err, "too many streams: 1 are running, as many as max-streams allows")
		close(release)
		require.NoError(t, <-first)
		_, err = s.Stream(context.Background(), crossTarget, nil)
		require.NoError(t, err, "the finished stream's slot is free")
		assert.Equal(t, 1.0, count(t, opts.Metrics.rejected.WithLabelValues(reasonBusy)))
		assert.Equal(t, 2.0, count(t, opts.Metrics.streams.WithLabelValues(ModeRelay, resultOK)))
	})
}

// count reads a counter.
func count(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// A pod with jetway's labels but not its seal (planted by someone who may
// create pods there, or relabelled to another team), or with the seal,
// nonce and binding of a pod of its name copied onto another pod (another
// UID), answers as a missing one: no volume server hears of the stream,
// and it is counted.
func TestUnsealedPodsAnswerAsMissing(t *testing.T) {
	var calls atomic.Int32
	opts := testOptions(volumeServers{
		"stream-out": func(*http.Request) (*http.Response, error) { calls.Add(1); return nil, nil },
		"stream-in":  func(*http.Request) (*http.Response, error) { calls.Add(1); return nil, nil },
	})
	planted := stepPod("a", "planted", "main")
	delete(planted.Annotations, ownership.SealAnnotation)
	relabelled := stepPod("a", "relabelled", "other")
	relabelled.Labels[ownership.TeamLabel] = "main"
	copied := stepPod("a", "copied", "main")
	copied.Annotations[ownership.SealAnnotation] = stepPod("a", "src", "main").Annotations[ownership.SealAnnotation]
	replanted := stepPod("a", "replanted", "main") // everything copied from the pod jetway made...
	replanted.UID = "uid-of-a-pod-made-after-it"   // ... onto a pod made later under its name
	opts.Target = pods{"a/planted": planted, "a/relabelled": relabelled, "a/copied": copied, "a/replanted": replanted,
		"b/dst": stepPod("b", "dst", "main")}.target
	s := New(opts)
	defer s.Close()
	for _, caller := range []Caller{{Team: "main"}, {Admin: true}} {
		for _, pod := range []string{"planted", "relabelled", "copied", "replanted"} {
			req := crossTarget
			req.Caller, req.From.Pod = caller, pod
			_, err := s.Stream(context.Background(), req, nil)
			require.ErrorIs(t, err, ErrNotFound, pod)
			assert.EqualError(t, err, `source: pod "`+pod+`" not found on target "a"`)
		}
	}
	assert.Zero(t, calls.Load(), "no volume server was asked")
	assert.Equal(t, 6.0, count(t, opts.Metrics.rejected.WithLabelValues(reasonUnsealed)))
	assert.Equal(t, 2.0, count(t, opts.Metrics.rejected.WithLabelValues(reasonUnbound)))
}

// Each side of a stream is reached with its own pod's token.
func TestEachPodGetsItsOwnToken(t *testing.T) {
	var got [2]string
	s := New(testOptions(volumeServers{
		"stream-out": func(req *http.Request) (*http.Response, error) {
			got[0] = req.Header.Get("Authorization")
			return answer(http.StatusOK, http.NoBody), nil
		},
		"stream-in": func(req *http.Request) (*http.Response, error) {
			got[1] = req.Header.Get("Authorization")
			return answer(http.StatusNoContent, http.NoBody), nil
		},
	}))
	defer s.Close()
	_, err := s.Stream(context.Background(), crossTarget, nil)
	require.NoError(t, err)
	assert.Equal(t, [2]string{"Bearer " + testKey.PodToken("a", stepPod("a", "src", "")), "Bearer " + testKey.PodToken("b", stepPod("b", "dst", ""))}, got)
	assert.NotEqual(t, got[0], got[1])

	_, err = New(Options{Installation: "jetway", Transport: volumeServers{}, Target: testOptions(nil).Target}).
		OpenVolume(context.Background(), crossTarget.From, "raw")
	assert.ErrorContains(t, err, "pod key is not read")
}

// Until the installation's pod key is read, a stream touches no pod and
// says why.
func TestNoStreamWithoutThePodKey(t *testing.T) {
	var calls atomic.Int32
	opts := testOptions(volumeServers{
		"stream-out": func(*http.Request) (*http.Response, error) { calls.Add(1); return nil, nil },
	})
	opts.Key = ownership.NewKeyLoader(nil, "state", "jetway", nil).Key() // never read
	s := New(opts)
	defer s.Close()
	_, err := s.Stream(context.Background(), crossTarget, nil)
	assert.ErrorContains(t, err, "pod key is not read from the state namespace")
	assert.Zero(t, calls.Load())
}
