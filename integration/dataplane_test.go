package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/jetway-ci/jetway/client"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/wire"
)

// plant creates, as someone who may create pods in the namespace would, a
// pod with jetway's labels (and annotations) but no seal.
func plant(ctx context.Context, t *testing.T, ns, name, image string, labels, annotations map[string]string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: image}}},
	}
	_, err := clusters[0].Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	waitRunning(ctx, t, clusters[0].Client, ns, name)
}

// TestPlantedPodsGetNothing: pods planted in a target namespace with
// jetway's labels, claiming admin (no team label), are never taken as
// jetway's: not a check sandbox found by a restarted gateway, not the pod
// of the step whose name and labels it has. They get no check and no
// step, jetway leaves them alone, and each is counted and logged.
func TestPlantedPodsGetNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	const ns = "planted"
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, ns, "{}\n", "")
	opts := gatewayOptions{resourceDir: resourceScripts(t)}
	g := startGateway(t, dir, opts)
	g.waitTarget(t, ns, 10*time.Second, running)

	// An admin's check sandbox for git-resource, key repo-x; and the pod
	// of the admin's step "deploy", both owned by "the gateway before".
	labels := func(extra map[string]string) map[string]string {
		l := ownership.Labels(ns, "jetway")
		l[ownership.OwnerLabel] = "replica-gone"
		for k, v := range extra {
			l[k] = v
		}
		return l
	}
	plant(ctx, t, ns, "check-planted", "git-resource",
		labels(map[string]string{steps.SandboxLabel: steps.SandboxKeyHash("", "git-resource", "repo-x")}),
		map[string]string{"jetway-ci.dev/sandbox-key": "repo-x"})
	stepPod := steppod.Name("", "deploy")
	plant(ctx, t, ns, stepPod, "busybox", labels(map[string]string{steps.HandleLabel: "deploy"}), nil)

	// Adopted after a restart: the new gateway's placer looks for the
	// sandboxes of its targets.
	addr := strings.TrimPrefix(g.base, "http://")
	g.stop()
	opts.listen = addr
	g = startGateway(t, dir, opts)
	g.waitTarget(t, ns, 10*time.Second, running)
	api, err := client.New(client.Options{URL: g.base})
	require.NoError(t, err)

	versions, err := api.CheckResource(ctx, client.ResourceStep{Handle: "check-1", Image: "git-resource",
		Source: map[string]string{"uri": "git://secret-token@x"}, ReuseKey: "repo-x"})
	require.NoError(t, err)
	assert.Equal(t, []client.Version{{"ref": "a"}, {"ref": "b"}}, versions)
	assert.NotEqual(t, "check-planted", g.step(t, "check-1").Pod, "the check ran in a sandbox jetway made")

	deploy := shStep("deploy", "echo deployed")
	deploy.Inputs = []wire.Input{{Name: "src", From: wire.InputSource{Upload: true}}}
	code, _, body := g.submitStep(t, "", deploy)
	require.Equal(t, 202, code, body)
	v := g.waitPhase(t, "deploy", wire.Errored)
	assert.Equal(t, "CreatePodFailed", v.Reason)
	assert.Contains(t, v.Message, "jetway did not make it")
	assert.True(t, v.StartedAt.IsZero())

	for _, pod := range []string{"check-planted", stepPod} {
		root := c.StepRoot(ns, pod)
		for _, f := range []string{stepagent.SpecFile, stepagent.InputsFile, stepagent.RunsDir} {
			_, err := os.Stat(filepath.Join(root, f))
			assert.True(t, os.IsNotExist(err), "%s got %s", pod, f)
		}
		vols, _ := os.ReadDir(filepath.Join(root, stepagent.VolumesDir))
		assert.Empty(t, vols, "%s got a volume", pod)
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		require.NoError(t, err, "jetway leaves a pod it did not make alone")
		assert.Equal(t, "replica-gone", p.Labels[ownership.OwnerLabel], "and does not take it over")
	}
	assert.Equal(t, 2.0, metricValue(t, g, `jetway_steps_rejected_total{reason="unsealed"}`))
	assert.Contains(t, g.logs.String(), "pod refused as a check sandbox: it has a sandbox's labels but jetway did not make it")
	assert.Contains(t, g.logs.String(), "pod refused: it has the step's name and labels but not jetway's seal")
	assert.NotContains(t, g.logs.String(), "secret-token", "a check's source reaches no log")
}

// TestAnUnboundPodInAStepsWayIsGoneBeforeTheStepsPod: a pod with a step's
// name, labels and seal but not bound to jetway's create (its maker
// stopped first, or it was planted with a copied seal) is deleted with a
// second's grace, not forced, and the step's pod is made only once it is
// gone. Forced, its object goes at once while its containers may run on
// (a planted pod may ask for an hour's grace and trap TERM), and the
// kubelet finds the pod it execs into by name among the pods it runs: the
// step's exec, its spec and inputs, could reach the planted pod.
func TestAnUnboundPodInAStepsWayIsGoneBeforeTheStepsPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	const ns = "unbound-in-way"
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, ns, "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{})
	g.waitTarget(t, ns, 10*time.Second, running)

	name := steppod.Name("", "deploy")
	labels := ownership.Labels(ns, "jetway")
	labels[steps.HandleLabel] = "deploy"
	plant(ctx, t, ns, name, "busybox", labels, jetwayAnnotations(ns, name, ""))
	planted, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	w, err := c.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name,
		ResourceVersion: planted.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()

	g.run(t, shStep("deploy", "echo deployed"))
	replacedGently(t, w, planted.UID)
	assert.Equal(t, 1.0, metricValue(t, g, `jetway_steps_rejected_total{reason="unbound"}`))
}

// TestGatewaysStartingTogetherShareOnePodKey: gateways of an installation
// starting at once against a state namespace without a pod key make one,
// and all read the same, with the state namespace's permissions alone.
func TestGatewaysStartingTogetherShareOnePodKey(t *testing.T) {
	st := newState(t)
	client, err := kubernetes.NewForConfig(st.rest)
	require.NoError(t, err)
	seals := make([]string, 8)
	var wg sync.WaitGroup
	for i := range seals {
		wg.Go(func() {
			k, err := ownership.LoadKey(context.Background(), client.CoreV1(), st.namespace, "fresh")
			if assert.NoError(t, err) {
				seals[i] = k.Seal("t", "p", "main")
			}
		})
	}
	wg.Wait()
	for _, s := range seals {
		assert.Equal(t, seals[0], s)
	}
	assert.NotEmpty(t, seals[0])
	secret, err := clusters[0].Client.CoreV1().Secrets(st.namespace).Get(context.Background(), ownership.KeySecretName("fresh"), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "fresh", secret.Labels[ownership.InstallationLabel])
	assert.Empty(t, secret.Annotations, "the key is in the data alone")
}

// TestATakenOverStepsRunningPodIsFollowed: a step whose owner made and
// bound its pod, then stopped before the pod ran, is taken over by a
// gateway started once the pod runs: no change of the pod comes after the
// new owner took it (its owner label), yet the new owner follows it: the
// step is scheduled, its head final. (The new owner's watch waited for a
// change of the pod to learn which pod is the step's, and none came.)
func TestATakenOverStepsRunningPodIsFollowed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "takeover-running"
	dir := t.TempDir()
	placeTarget(ctx, t, clusters[0], dir, ns, "nodeSelector: "+cluster.KubeletManualSelector+"\n", "")
	state := newState(t)
	a := startGateway(t, dir, gatewayOptions{state: state})
	a.waitTarget(t, ns, 10*time.Second, running)
	a.run(t, shStep("to-1", "true"))
	v := a.waitPhase(t, "to-1", wire.Starting)
	eventually(t, 20*time.Second, func() error {
		p, err := clusters[0].Client.CoreV1().Pods(ns).Get(ctx, v.Pod, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName == "" || p.Annotations[ownership.BoundAnnotation] == "" {
			return errorf("pod %s not scheduled and bound yet (%v)", v.Pod, err)
		}
		return nil
	})
	a.stop() // its lease goes with it: the next gateway takes the step over at once

	// As a kubelet would: the pod runs, while no gateway does.
	setPodStatus(ctx, t, clusters[0], ns, v.Pod, func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{
			{Name: steppod.StepContainer, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: steppod.SidecarContainer, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	})
	b := startGateway(t, dir, gatewayOptions{state: state})
	b.waitTarget(t, ns, 10*time.Second, running)
	eventually(t, 20*time.Second, func() error {
		var v wire.View
		resp, err := http.Get(b.base + "/api/v1/steps/to-1")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
			return errorf("to-1: %s (%v)", resp.Status, err)
		}
		if v.Events < 2 {
			return errorf("to-1 has %d events, want placed and scheduled", v.Events)
		}
		return nil
	})
	assert.Contains(t, b.logs.String(), `"msg":"step pod taken over"`)
}
