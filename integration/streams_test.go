package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
	"github.com/jetway-ci/jetway/wire"
)

// volumeTokens are the tokens of the volume servers startVolumes started.
var volumeTokens sync.Map // *volumes.Server -> string

// startVolumes starts a volume server for pod on target, serving the
// token a gateway derives for it from podKey, stopped after the test.
func startVolumes(t *testing.T, target, pod string) *volumes.Server {
	t.Helper()
	vs, err := volumes.Start(t.TempDir(), sidecarHash(target, pod))
	require.NoError(t, err)
	volumeTokens.Store(vs, sidecarToken(target, pod))
	t.Cleanup(func() { vs.Kill() })
	return vs
}

// volumePod runs a step pod whose port 7788 reaches a fresh volume server.
func volumePod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod string) *volumes.Server {
	t.Helper()
	vs := startVolumes(t, ns, pod)
	stepPod(ctx, t, c, ns, ns, "jetway", pod)
	require.NoError(t, c.ForwardPodPort(ctx, ns, pod, streams.VolumePort, "127.0.0.1", vs.Port()))
	return vs
}

// fill creates volume handle on vs with one file of size random bytes.
func fill(t *testing.T, vs *volumes.Server, handle string, size int) []byte {
	t.Helper()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	require.NoError(t, os.MkdirAll(filepath.Join(vs.Path(handle), "out"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(vs.Path(handle), "out", "artifact.bin"), data, 0o644))
	return data
}

// directSHA streams a volume path out of vs directly (no port-forward) and
// hashes it: what the relay must report.
func directSHA(t *testing.T, vs *volumes.Server, handle, enc string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d/volumes/%s/stream-out?path=out", vs.Port(), handle), nil)
	req.Header.Set("Accept-Encoding", enc)
	tok, _ := volumeTokens.Load(vs)
	req.Header.Set("Authorization", "Bearer "+tok.(string))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	h := sha256.New()
	_, err = io.Copy(h, resp.Body)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

func postStream(t *testing.T, g *gateway, req wire.StreamRequest) (int, wire.StreamResult, map[string]string) {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(g.base+"/api/v1/streams", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var res wire.StreamResult
	var errBody map[string]string
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(raw, &res))
	} else {
		require.NoError(t, json.Unmarshal(raw, &errBody), "%s", raw)
	}
	return resp.StatusCode, res, errBody
}

// streamGround is two targets on two clusters, each with a volume pod.
type streamGround struct {
	g        *gateway
	src, dst *volumes.Server
}

func newStreamGround(ctx context.Context, t *testing.T, name string) streamGround {
	t.Helper()
	_, dir := lifecycleTarget(ctx, t, clusters[0], name+"-a")
	b, _ := lifecycleTarget(ctx, t, clusters[1], name+"-c")
	writeFile(t, filepath.Join(dir, name+"-c.kubeconfig"), b.Kubeconfig)
	src := volumePod(ctx, t, clusters[0], name+"-a", "src")
	dst := volumePod(ctx, t, clusters[1], name+"-c", "dst")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, name+"-a", 10*time.Second, running)
	g.waitTarget(t, name+"-c", 10*time.Second, running)
	return streamGround{g: g, src: src, dst: dst}
}

func (sg streamGround) request(name, srcHandle, dstHandle, enc string) wire.StreamRequest {
	return wire.StreamRequest{
		From:     wire.Endpoint{Target: name + "-a", Pod: "src", Handle: srcHandle, Path: "out"},
		To:       wire.Endpoint{Target: name + "-c", Pod: "dst", Handle: dstHandle, Path: "in"},
		Encoding: enc,
	}
}

// TestStreamsAcrossClusters runs 50 concurrent streams from a pod on one
// cluster into a pod on another, each verified by SHA-256 and content, and
// one per encoding.
func TestStreamsAcrossClusters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sg := newStreamGround(ctx, t, "st")
	data := fill(t, sg.src, "artifact", 256<<10)
	want := directSHA(t, sg.src, "artifact", "raw")
	// kwok picks up the PortForward objects shortly after they are made.
	eventually(t, 20*time.Second, func() error {
		os.MkdirAll(sg.dst.Path("warmup"), 0o755)
		if code, _, body := postStream(t, sg.g, sg.request("st", "artifact", "warmup", "raw")); code != http.StatusOK {
			return fmt.Errorf("%d %v", code, body)
		}
		return nil
	})

	var wg sync.WaitGroup
	for i := range 50 {
		handle := fmt.Sprintf("in-%d", i)
		require.NoError(t, os.MkdirAll(sg.dst.Path(handle), 0o755))
		wg.Go(func() {
			code, res, body := postStream(t, sg.g, sg.request("st", "artifact", handle, "raw"))
			if !assert.Equal(t, http.StatusOK, code, "%v", body) {
				return
			}
			assert.Equal(t, want, res.SHA256)
			got, err := os.ReadFile(filepath.Join(sg.dst.Path(handle), "in", "artifact.bin"))
			if assert.NoError(t, err) {
				assert.True(t, bytes.Equal(data, got), "content of %s", handle)
			}
		})
	}
	wg.Wait()

	for _, enc := range []string{"gzip", "zstd"} {
		require.NoError(t, os.MkdirAll(sg.dst.Path(enc), 0o755))
		code, res, body := postStream(t, sg.g, sg.request("st", "artifact", enc, enc))
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.Greater(t, res.Bytes, int64(0))
		got, err := os.ReadFile(filepath.Join(sg.dst.Path(enc), "in", "artifact.bin"))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(data, got), enc)
	}
	assert.Contains(t, scrape(t, sg.g.reg), "jetway_portforward_connections 2\n", "one connection per pod")

	// The CLI, as an operator runs it.
	require.NoError(t, os.MkdirAll(sg.dst.Path("cli"), 0o755))
	out, err := exec.CommandContext(ctx, gatewayBinary(t), "stream", "--url", sg.g.base,
		"--from", "st-a/src/artifact:out", "--to", "st-c/dst/cli:in", "--encoding", "raw", "--size", "256Ki").Output()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `^streamed 25\d\.\d KiB in \d+\.\ds \(.+/s\), sha256 `+want+"\n$", string(out))
	out, err = exec.CommandContext(ctx, gatewayBinary(t), "stream", "--url", sg.g.base,
		"--from", "st-a/src/missing:out", "--to", "st-c/dst/cli:in").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), `stream failed on the source side: stream-out src/missing: 404 Not Found: volume "missing" not found`)
}

// TestStreamFailures: a source killed mid-stream, an API server restarted
// mid-stream and a deleted pod each fail the stream with an error naming
// the side, and the destination never gets partial content.
func TestStreamFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sg := newStreamGround(ctx, t, "sf")
	fill(t, sg.src, "big", 8<<20)
	eventually(t, 20*time.Second, func() error {
		os.MkdirAll(sg.dst.Path("warmup"), 0o755)
		if code, _, body := postStream(t, sg.g, sg.request("sf", "big", "warmup", "zstd")); code != http.StatusOK {
			return fmt.Errorf("%d %v", code, body)
		}
		return nil
	})
	sg.src.SetRate(4 << 20) // 8 MiB at 4 MiB/s: two seconds to break it in

	t.Run("source killed", func(t *testing.T) {
		require.NoError(t, os.MkdirAll(sg.dst.Path("killed"), 0o755))
		time.AfterFunc(500*time.Millisecond, func() { sg.src.Kill() })
		code, _, body := postStream(t, sg.g, sg.request("sf", "big", "killed", "raw"))
		assert.Equal(t, http.StatusBadGateway, code)
		assert.Equal(t, "source", body["side"], "%v", body)
		_, err := os.Stat(filepath.Join(sg.dst.Path("killed"), "in"))
		assert.True(t, os.IsNotExist(err), "no partial content lands")
	})

	// A new source server behind the same pod.
	src2 := startVolumes(t, "sf-a", "src")
	fill(t, src2, "big", 8<<20)
	require.NoError(t, clusters[0].ForwardPodPort(ctx, "sf-a", "src", streams.VolumePort, "127.0.0.1", src2.Port()))
	eventually(t, 20*time.Second, func() error {
		os.MkdirAll(sg.dst.Path("warmup2"), 0o755)
		if code, _, body := postStream(t, sg.g, sg.request("sf", "big", "warmup2", "zstd")); code != http.StatusOK {
			return fmt.Errorf("%d %v", code, body)
		}
		return nil
	})
	src2.SetRate(4 << 20)

	t.Run("API server restarted", func(t *testing.T) {
		require.NoError(t, os.MkdirAll(sg.dst.Path("restart"), 0o755))
		time.AfterFunc(500*time.Millisecond, clusters[0].StopAPIServer)
		code, _, body := postStream(t, sg.g, sg.request("sf", "big", "restart", "raw"))
		assert.Equal(t, http.StatusBadGateway, code)
		assert.Equal(t, "source", body["side"], "%v", body)
		_, err := os.Stat(filepath.Join(sg.dst.Path("restart"), "in"))
		assert.True(t, os.IsNotExist(err), "no partial content lands")
		require.NoError(t, clusters[0].StartAPIServer(ctx))
		src2.SetRate(0)
		eventually(t, 30*time.Second, func() error {
			if code, _, body := postStream(t, sg.g, sg.request("sf", "big", "restart", "zstd")); code != http.StatusOK {
				return fmt.Errorf("next stream: %d %v", code, body)
			}
			return nil
		})
	})

	t.Run("client cancels", func(t *testing.T) {
		src2.SetRate(4 << 20)
		defer func() { src2.SetRate(0) }()
		require.NoError(t, os.MkdirAll(sg.dst.Path("cancelled"), 0o755))
		body, _ := json.Marshal(sg.request("sf", "big", "cancelled", "raw"))
		cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer ccancel()
		hreq, _ := http.NewRequestWithContext(cctx, http.MethodPost, sg.g.base+"/api/v1/streams", bytes.NewReader(body))
		_, err := http.DefaultClient.Do(hreq)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		eventually(t, 5*time.Second, func() error {
			if !strings.Contains(sg.g.logs.String(), "context canceled") {
				return fmt.Errorf("gateway did not abort the stream")
			}
			return nil
		})
		_, err = os.Stat(filepath.Join(sg.dst.Path("cancelled"), "in"))
		assert.True(t, os.IsNotExist(err), "a cancelled stream lands nothing")
	})

	t.Run("destination fails while the source is slow", func(t *testing.T) {
		// The tar's first header, then five seconds before the next bytes,
		// longer than the stall timeout (3s): the relay waits in the
		// source's read when the destination refuses the upload.
		src2.SetRate(100)
		defer src2.SetRate(0)
		code, _, body := postStream(t, sg.g, sg.request("sf", "big", "absent", "raw"))
		assert.Equal(t, http.StatusBadGateway, code)
		assert.Equal(t, map[string]string{"side": "destination", "error": `stream-in dst/absent: 404 Not Found: volume "absent" not found`}, body,
			"the destination's answer, not a stall of the source after the timeout")
	})

	t.Run("destination's volume server died", func(t *testing.T) {
		sg.dst.Kill() // the pod stays; nothing listens on its port 7788
		code, _, body := postStream(t, sg.g, sg.request("sf", "big", "gone", "raw"))
		assert.Equal(t, http.StatusBadGateway, code)
		assert.Equal(t, "destination", body["side"], "%v", body)
		assert.Contains(t, body["error"], "stream-in dst/gone: ")
		assert.Contains(t, body["error"], "sf-c/dst port 7788")
	})

	t.Run("deleted pod", func(t *testing.T) {
		require.NoError(t, clusters[1].Client.CoreV1().Pods("sf-c").Delete(ctx, "dst", metav1.DeleteOptions{}))
		eventually(t, 10*time.Second, func() error {
			_, err := clusters[1].Client.CoreV1().Pods("sf-c").Get(ctx, "dst", metav1.GetOptions{})
			if err == nil {
				return fmt.Errorf("pod still there")
			}
			return nil
		})
		code, _, body := postStream(t, sg.g, sg.request("sf", "big", "gone", "raw"))
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, map[string]string{"error": `destination: pod "dst" not found on target "sf-c"`}, body)
	})
}

// TestSameTargetStreamsGoDirect streams between two pods of one target:
// the source pushes straight to the destination (stream-p2p-out), and when
// it cannot, jetway relays instead.
func TestSameTargetStreamsGoDirect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	_, dir := lifecycleTarget(ctx, t, c, "p2p")
	src := volumePod(ctx, t, c, "p2p", "src")
	dst := volumePod(ctx, t, c, "p2p", "dst")
	pod, err := c.Client.CoreV1().Pods("p2p").Get(ctx, "dst", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, pod.Status.PodIP)
	// The test's pod network: the source reaches the destination pod's IP
	// at its volume server on loopback, and nothing else.
	routes := map[string]string{net.JoinHostPort(pod.Status.PodIP, "7788"): fmt.Sprintf("127.0.0.1:%d", dst.Port())}
	src.Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		local, ok := routes[addr]
		if !ok {
			return nil, fmt.Errorf("no route to %s in the test's pod network", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", local)
	}}}
	data := fill(t, src, "art", 1<<20)
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, "p2p", 10*time.Second, running)
	req := wire.StreamRequest{From: wire.Endpoint{Target: "p2p", Pod: "src", Handle: "art", Path: "out"},
		To: wire.Endpoint{Target: "p2p", Pod: "dst", Handle: "direct", Path: "in"}, Encoding: "zstd"}
	require.NoError(t, os.MkdirAll(dst.Path("direct"), 0o755))
	var res wire.StreamResult
	eventually(t, 20*time.Second, func() error {
		code, r, body := postStream(t, g, req)
		if code != http.StatusOK {
			return fmt.Errorf("%d %v", code, body)
		}
		res = r
		return nil
	})
	assert.Equal(t, streams.ModeP2P, res.Mode)
	got, err := os.ReadFile(filepath.Join(dst.Path("direct"), "in", "artifact.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, directSHA(t, src, "art", "zstd"), res.SHA256, "the source's sidecar hashes what the destination took")

	delete(routes, net.JoinHostPort(pod.Status.PodIP, "7788")) // the pods cannot see each other now
	req.To.Handle = "relayed"
	require.NoError(t, os.MkdirAll(dst.Path("relayed"), 0o755))
	code, res, body := postStream(t, g, req)
	require.Equal(t, http.StatusOK, code, "%v", body)
	assert.Equal(t, streams.ModeRelay, res.Mode, "falls back to relaying")
	assert.NotEmpty(t, res.SHA256)
	got, err = os.ReadFile(filepath.Join(dst.Path("relayed"), "in", "artifact.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
	assert.Contains(t, g.logs.String(), "direct stream failed; relaying")
}

// labelledVolumePod runs a pod with labels whose port 7788 reaches a fresh
// volume server holding volume "art".
func labelledVolumePod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string, labels map[string]string) *volumes.Server {
	t.Helper()
	vs := startVolumes(t, labels[ownership.WorkerLabel], name)
	fill(t, vs, "art", 64<<10)
	target := labels[ownership.WorkerLabel]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: jetwayAnnotations(target, name, labels[ownership.TeamLabel])},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: "example.invalid/step"}}},
	}
	createJetwayPod(ctx, t, c, target, pod)
	waitRunning(ctx, t, c.Client, ns, name)
	require.NoError(t, c.ForwardPodPort(ctx, ns, name, streams.VolumePort, "127.0.0.1", vs.Port()))
	return vs
}

// teamLabels are the labels of a step pod of team on target ("" for none).
func teamLabels(target, installation, team string) map[string]string {
	labels := ownership.Labels(target, installation)
	if team != "" {
		labels[ownership.TeamLabel] = team
	}
	return labels
}

// postStreamAs posts a stream with token, as JSON or NDJSON, and returns
// the status, Content-Type and body.
func postStreamAs(t *testing.T, g *gateway, token, accept, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.base+"/api/v1/streams", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// TestStreamsKeepTeamsApart: a stream touches only pods jetway made for
// the target and installation, and a team token only its team's; every
// other pod answers 404 exactly as a missing pod does.
func TestStreamsKeepTeamsApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, dir := lifecycleTarget(ctx, t, clusters[0], "si-g") // global
	team, err := clusters[1].CreateTarget(ctx, cluster.TargetOptions{Namespace: "si-m", Rules: targets.RBACRules(targets.Required)})
	require.NoError(t, err)
	writeFile(t, filepath.Join(dir, "si-m", "kubeconfig"), team.Kubeconfig)
	writeFile(t, filepath.Join(dir, "si-m", "target.yaml"), []byte("team: main\n"))
	for name, labels := range map[string]map[string]string{
		"main-a":  teamLabels("si-g", "jetway", "main"),
		"other-a": teamLabels("si-g", "jetway", "other"),
		"noteam":  teamLabels("si-g", "jetway", ""),
		"foreign": {"app": "not-jetway"},
		"staging": teamLabels("si-g", "staging", "main"),
	} {
		labelledVolumePod(ctx, t, clusters[0], "si-g", name, labels)
	}
	dst := labelledVolumePod(ctx, t, clusters[1], "si-m", "main-c", teamLabels("si-m", "jetway", "main"))
	g := startGateway(t, dir, gatewayOptions{tokens: []api.Token{adminToken, mainToken}})
	eventually(t, 10*time.Second, func() error {
		for _, name := range []string{"si-g", "si-m"} {
			if _, body, _ := call(t, http.MethodGet, g.base+"/api/v1/targets/"+name, adminToken.Token); !strings.Contains(body, `"state":"running"`) {
				return fmt.Errorf("%s: %s", name, body)
			}
		}
		return nil
	})

	body := func(from, to wire.Endpoint) string {
		b, _ := json.Marshal(wire.StreamRequest{From: from, To: to, Encoding: "raw"})
		return string(b)
	}
	onGlobal := func(pod string) wire.Endpoint {
		return wire.Endpoint{Target: "si-g", Pod: pod, Handle: "art", Path: "out"}
	}
	into := func(handle string) wire.Endpoint {
		require.NoError(t, os.MkdirAll(dst.Path(handle), 0o755))
		return wire.Endpoint{Target: "si-m", Pod: "main-c", Handle: handle, Path: "in"}
	}
	// kwok picks up the PortForward objects shortly after they are made.
	eventually(t, 20*time.Second, func() error {
		if code, _, b := postStreamAs(t, g, mainToken.Token, "", body(onGlobal("main-a"), into("warmup"))); code != http.StatusOK {
			return fmt.Errorf("%d %s", code, b)
		}
		return nil
	})

	t.Run("allowed", func(t *testing.T) {
		for _, tc := range []struct {
			name, token, pod string
		}{
			{"a team's own pods on a global and a team target", mainToken.Token, "main-a"},
			{"an admin, a jetway pod without team", adminToken.Token, "noteam"},
			{"an admin, a team's pod", adminToken.Token, "other-a"},
		} {
			code, _, b := postStreamAs(t, g, tc.token, "", body(onGlobal(tc.pod), into(tc.pod)))
			assert.Equal(t, http.StatusOK, code, "%s: %s", tc.name, b)
			_, err := os.Stat(filepath.Join(dst.Path(tc.pod), "in", "artifact.bin"))
			assert.NoError(t, err, tc.name)
		}
	})

	missing := func(token, accept string) string {
		code, ctype, b := postStreamAs(t, g, token, accept, body(onGlobal("nope"), into("missing")))
		require.Equal(t, http.StatusNotFound, code, b)
		assert.Equal(t, "application/json", ctype)
		return b
	}
	t.Run("refused as missing", func(t *testing.T) {
		for _, tc := range []struct {
			name, token, pod string
		}{
			{"a team, another team's pod", mainToken.Token, "other-a"},
			{"a team, a pod without team", mainToken.Token, "noteam"},
			{"a team, a pod jetway did not make", mainToken.Token, "foreign"},
			{"an admin, a pod jetway did not make", adminToken.Token, "foreign"},
			{"an admin, another installation's pod", adminToken.Token, "staging"},
		} {
			for _, accept := range []string{"", api.NDJSON} {
				code, ctype, b := postStreamAs(t, g, tc.token, accept, body(onGlobal(tc.pod), into("refused")))
				assert.Equal(t, http.StatusNotFound, code, "%s %s: %s", tc.name, accept, b)
				assert.Equal(t, "application/json", ctype, "%s %s", tc.name, accept)
				assert.Equal(t, strings.Replace(missing(tc.token, accept), `\"nope\"`, `\"`+tc.pod+`\"`, 1), b,
					"%s %s: answers as a missing pod", tc.name, accept)
			}
		}
		_, err := os.Stat(filepath.Join(dst.Path("refused"), "in"))
		assert.True(t, os.IsNotExist(err), "nothing was streamed")
		// The destination side is checked alike.
		code, _, b := postStreamAs(t, g, mainToken.Token, "",
			body(wire.Endpoint{Target: "si-m", Pod: "main-c", Handle: "warmup", Path: "in"}, onGlobal("other-a")))
		assert.Equal(t, http.StatusNotFound, code, b)
		assert.JSONEq(t, `{"error": "destination: pod \"other-a\" not found on target \"si-g\""}`, b)
	})

	t.Run("bad requests are refused before anything", func(t *testing.T) {
		for _, accept := range []string{"", api.NDJSON} {
			code, ctype, b := postStreamAs(t, g, mainToken.Token, accept,
				`{"from": {"pod": "main-a", "handle": "art"}, "to": {"target": "si-m", "pod": "main-c", "handle": "x"}}`)
			assert.Equal(t, http.StatusBadRequest, code, b)
			assert.Equal(t, "application/json", ctype)
			assert.Contains(t, b, "from.target is required")
		}
	})
	metrics := scrape(t, g.reg)
	assert.Contains(t, metrics, `jetway_streams_rejected_total{reason="not_found"} 21`)
	assert.Contains(t, metrics, `jetway_streams_total{mode="relay",result="ok"} 4`)
}
