package agentmount

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/targets"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeTargets is a registry of targets whose Core is a fake clientset.
type fakeTargets struct {
	mu      sync.Mutex
	targets map[string]*targets.Target
	changed chan struct{}
}

func (f *fakeTargets) Snapshot() []targets.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []targets.Status
	for name := range f.targets {
		out = append(out, targets.Status{Name: name})
	}
	return out
}

func (f *fakeTargets) Target(name string) (*targets.Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.targets[name]; ok {
		return t, nil
	}
	return nil, targets.ErrNotFound
}

func (f *fakeTargets) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// set replaces the targets and says they changed.
func (f *fakeTargets) set(ts ...*targets.Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = make(map[string]*targets.Target)
	for _, t := range ts {
		f.targets[t.Name()] = t
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// target is a target named name whose nodes are nodes; forbidden: it may
// not list them.
func target(t *testing.T, name string, selector map[string]string, forbidden bool, nodes ...corev1.Node) *targets.Target {
	t.Helper()
	tgt, err := targets.NewTarget(&targets.Config{Name: name, REST: &rest.Config{Host: "https://127.0.0.1:1"},
		Meta: targets.Metadata{Namespace: "ci", NodeSelector: selector}}, "prod")
	require.NoError(t, err)
	objs := make([]runtime.Object, len(nodes))
	for i := range nodes {
		objs[i] = &nodes[i]
	}
	cs := fake.NewClientset(objs...)
	if forbidden {
		cs.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "", nil)
		})
	}
	tgt.Core = cs.CoreV1()
	return tgt
}

func labelled(n corev1.Node, labels map[string]string) corev1.Node {
	n.Labels = labels
	return n
}

// TestChooser: each target gets its own decision, the init container
// before it; a target that may not list nodes, or whose step pods may
// land on an old node, gets the init container; a target's nodeSelector
// leaves other nodes out; a reconfigured target is decided again, a
// removed one forgotten; the gauge follows.
func TestChooser(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	newer, older := node("new", "containerd://2.2.9", "v1.36.0"), node("old", "containerd://1.7.0", "v1.36.0")
	pool := map[string]string{"pool": "ci"}
	east := target(t, "east", nil, false, newer)
	west := target(t, "west", nil, true, newer)
	mixed := target(t, "mixed", nil, false, newer, older)
	pooled := target(t, "pooled", pool, false, labelled(newer, pool), older)
	ts := &fakeTargets{changed: make(chan struct{})}
	ts.set(east, west, mixed, pooled)
	reg := prometheus.NewPedanticRegistry()
	c := New(Options{Targets: ts, Metrics: NewMetrics(reg)})
	assert.Equal(t, steppod.AgentInitContainer, c.AgentMount(east), "before its first decision")

	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	require.Eventually(t, func() bool { return testutil.CollectAndCount(reg, "jetway_step_agent_mount") == 4 },
		5*time.Second, 10*time.Millisecond, "each target decided")
	assert.Equal(t, steppod.AgentImageVolume, c.AgentMount(east))
	assert.Equal(t, steppod.AgentInitContainer, c.AgentMount(west), "may not list nodes")
	assert.Equal(t, steppod.AgentInitContainer, c.AgentMount(mixed), "one node runs containerd 1.7")
	assert.Equal(t, steppod.AgentImageVolume, c.AgentMount(pooled), "its step pods land on the new node alone")
	assert.Equal(t, 1.0, testutil.ToFloat64(c.opts.Metrics.mount.WithLabelValues("east", "image-volume")))
	assert.Equal(t, 1.0, testutil.ToFloat64(c.opts.Metrics.mount.WithLabelValues("west", "init-container")))

	// east reconfigured onto the old node alone; pooled, mixed, west gone.
	east2 := target(t, "east", nil, false, older)
	assert.Equal(t, steppod.AgentInitContainer, c.AgentMount(east2), "a new configuration waits for its decision")
	ts.set(east2)
	require.Eventually(t, func() bool { return testutil.CollectAndCount(reg, "jetway_step_agent_mount") == 1 },
		5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(c.opts.Metrics.mount.WithLabelValues("east", "init-container")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, steppod.AgentInitContainer, c.AgentMount(east2))
	assert.Equal(t, 1, testutil.CollectAndCount(reg, "jetway_step_agent_mount"), "east's old mount is gone")
}

// TestChooserInterval: a target's decision is made again after Interval,
// so a node replaced by one with an older runtime shows, and logged once.
func TestChooserInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		n := node("n1", "cri-o://1.31.0", "v1.36.0")
		east := target(t, "east", nil, false, n)
		ts := &fakeTargets{changed: make(chan struct{})}
		ts.set(east)
		var logs strings.Builder
		c := New(Options{Targets: ts, Interval: 5 * time.Minute,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{ReplaceAttr: dropTime}))})
		done := make(chan error, 1)
		go func() { done <- c.Start(ctx) }()
		synctest.Wait()
		assert.Equal(t, steppod.AgentImageVolume, c.AgentMount(east))

		n.Status.NodeInfo.ContainerRuntimeVersion = "cri-o://1.30.2"
		_, err := east.Core.Nodes().UpdateStatus(ctx, &n, metav1.UpdateOptions{})
		require.NoError(t, err)
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		assert.Equal(t, steppod.AgentImageVolume, c.AgentMount(east), "not yet due")
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		assert.Equal(t, steppod.AgentInitContainer, c.AgentMount(east), "decided again after Interval")
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, `level=INFO msg="step agent mount chosen" target=east mount=image-volume why="all 1 nodes mount image volumes"
level=INFO msg="step agent mount chosen" target=east mount=init-container why="node n1 runs cri-o://1.30.2"
`, logs.String())
	})
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
