// Package integration proves jetway's Kubernetes claims against real local
// clusters (see integration/cluster). Run via `make test`, which builds the
// control-plane binaries first.
package integration

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// clusters are shared by every test of the package: starting a control
// plane costs seconds, and tests work in namespaces of their own.
var clusters []*cluster.Cluster

// The cluster whose one node is a real kubelet with containerd and runc
// (realnode_test.go), started by the first test that needs it
// (startRealNode): one runs on a machine at a time, and it needs root,
// which the kwok suites do not.
var (
	realNodeOnce sync.Once
	realNode     *cluster.Cluster
	realNodeErr  error
)

// startRealNode is the real node's cluster, started on first use.
func startRealNode(t *testing.T) *cluster.Cluster {
	t.Helper()
	realNodeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cluster.StartupTimeout)
		defer cancel()
		realNode, realNodeErr = cluster.Start(ctx, cluster.Options{Name: "real", RealNode: true})
	})
	require.NoError(t, realNodeErr, "start the real node")
	return realNode
}

// releaseOnCleanup frees a real-node target's namespace when t ends. Its
// step pods stay while their steps keep outputs, and each requests CPU: on
// the node's few cores, what the tests before left would fail a later
// test's steps as Unschedulable. kwok's fake nodes have room for all.
func releaseOnCleanup(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	if c != realNode {
		return
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, c.Release(ctx, ns), "release %s", ns)
	})
}

// podsLeft names the pods the tests left on the real node outside
// kube-system: each test releases what it made (releaseOnCleanup).
func podsLeft(c *cluster.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the pods left on the real node: %w", err)
	}
	var left []string
	for _, p := range pods.Items {
		if p.Namespace != metav1.NamespaceSystem && p.DeletionTimestamp == nil {
			left = append(left, p.Namespace+"/"+p.Name)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("the tests left %d pods on the real node, each holding its requests: %s", len(left), strings.Join(left, ", "))
	}
	return nil
}

func TestMain(m *testing.M) {
	code := runMain(m)
	if code == 0 {
		// Every gateway, dialer and stream a test started is gone by now;
		// idle keep-alive connections of the tests' own clients are not
		// goroutines of jetway's.
		http.DefaultClient.CloseIdleConnections()
		if err := findLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "integration: leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func runMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), cluster.StartupTimeout)
	defer cancel()
	// Two clusters for most tests; the mesh's three gateways own one each.
	var err error
	clusters, err = cluster.StartN(ctx, 3, "it")
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		return 1
	}
	defer cluster.StopAll(clusters)
	defer func() {
		if realNode != nil {
			realNode.Stop()
		}
	}()
	stopKubelets, err := startStepKubelets(clusters)
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		return 1
	}
	defer stopKubelets()
	code := m.Run()
	if realNode != nil {
		if err := podsLeft(realNode); err != nil {
			fmt.Fprintf(os.Stderr, "integration: %v\n", err)
			code = 1
		}
	}
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	if code != 0 {
		for _, c := range clusters {
			fmt.Fprintf(os.Stderr, "logs of cluster %s:\n%s\n", c.Name, c.Logs(30))
		}
		if realNode != nil {
			fmt.Fprintf(os.Stderr, "logs of cluster %s:\n%s\n", realNode.Name, realNode.Logs(30))
		}
	}
	return code
}

// findLeaks looks for goroutines left behind, giving those that end on
// their own a moment: client-go's WebSocket exec heartbeat notices that
// its connection closed only at its next ping, at most 5 s later.
func findLeaks() error {
	deadline := time.Now().Add(7 * time.Second)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// needDisk fails t at once unless the file system of the clusters'
// folder (the real node's pods and images) has bytes free: a test that
// moves GiBs on a disk without room would wedge the node (its kubelet
// evicts at 1% free) and wait out every bound after it.
func needDisk(t *testing.T, bytes uint64) {
	t.Helper()
	dir := cmp.Or(os.Getenv("JETWAY_CLUSTER_DIR"), os.TempDir())
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st), "free space under %s", dir)
	free := st.Bavail * uint64(st.Bsize)
	require.GreaterOrEqual(t, free, bytes, "this test needs %d MiB free under %s; it has %d MiB", bytes>>20, dir, free>>20)
}
