package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/wire"
)

// TestStepsPrivilegedOnlyWhereTheTargetAllows: with the gateway's default
// limits, a step pod as the API server admits it has the step container's
// restricted context, a bounded emptyDir and the default requests, and
// runs. A privileged step waits while the only target's target.yaml does
// not allow it, the waiting naming that target's policy; a target whose
// target.yaml allows it appears, takes it, and its pod is privileged.
func TestStepsPrivilegedOnlyWhereTheTargetAllows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	dir := t.TempDir()
	placeTarget(ctx, t, c, dir, "pv-plain", "{}\n", "")
	g := startGateway(t, dir, gatewayOptions{stepDefaults: gatewayDefaults})
	g.waitTarget(t, "pv-plain", 10*time.Second, running)
	pod := func(ns, handle string) *corev1.Pod {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, g.step(t, handle).Pod, metav1.GetOptions{})
		require.NoError(t, err)
		return p
	}

	priv := shStep("privileged", "true")
	priv.Privileged = true
	g.run(t, priv)
	g.run(t, shStep("plain", "true"))
	evs := g.stepEvents(ctx, t, "plain", "", 0)
	assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, types(evs), "%+v", evs)
	assert.Equal(t, wire.Succeeded, g.step(t, "plain").Phase)
	p := pod("pv-plain", "plain")
	sc := p.Spec.Containers[0].SecurityContext
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	assert.Equal(t, []corev1.Capability{"NET_RAW"}, sc.Capabilities.Drop)
	assert.Equal(t, "10Gi", p.Spec.Volumes[0].EmptyDir.SizeLimit.String())
	assert.Equal(t, "1Gi", p.Spec.Containers[0].Resources.Requests.StorageEphemeral().String())

	want := "pv-plain: " + selection.ReasonPrivileged
	eventually(t, 10*time.Second, func() error {
		if v := g.step(t, "privileged"); v.Phase != wire.Pending || !strings.HasSuffix(v.Waiting, want) {
			return errorf("privileged step %s, waiting %q; want it waiting on %q", v.Phase, v.Waiting, want)
		}
		return nil
	})
	assert.Contains(t, g.step(t, "privileged").Waiting, "steps.allowPrivileged in its target.yaml")

	placeTarget(ctx, t, c, dir, "pv-trusted", "steps: {allowPrivileged: true}\n", "")
	g.waitTarget(t, "pv-trusted", 10*time.Second, running)
	evs = g.stepEvents(ctx, t, "privileged", "", 0)
	got := types(evs)
	require.GreaterOrEqual(t, len(got), 5, "%+v", evs)
	assert.Equal(t, "waiting", got[0], "a waiting per reason: the new target's state moves it")
	assert.Equal(t, []string{"placed", "scheduled", "started", "exited"}, got[len(got)-4:], "%+v", evs)
	v := g.step(t, "privileged")
	assert.Equal(t, wire.Succeeded, v.Phase)
	assert.Equal(t, "pv-trusted", v.Target)
	p = pod("pv-trusted", "privileged")
	assert.Equal(t, &corev1.SecurityContext{Privileged: ptrTo(true)}, p.Spec.Containers[0].SecurityContext,
		"privileged, without the unprivileged step's seccomp and capabilities")
}

func ptrTo[T any](v T) *T { return &v }
