package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
)

// StartupTimeout bounds bringing up one cluster in tests; a cold start on a
// 2-core machine takes about 10 s.
const StartupTimeout = 2 * time.Minute

// StartN starts n clusters named <prefix>-0 ... in parallel. If any fails,
// the others are stopped and the error names it.
func StartN(ctx context.Context, n int, prefix string) ([]*Cluster, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return StartNamed(ctx, names...)
}

// StartNamed starts a cluster of each name in parallel. If any fails, the
// others are stopped and the error names it.
func StartNamed(ctx context.Context, names ...string) ([]*Cluster, error) {
	clusters := make([]*Cluster, len(names))
	g, gctx := errgroup.WithContext(ctx)
	for i, name := range names {
		g.Go(func() error {
			c, err := Start(gctx, Options{Name: name})
			clusters[i] = c
			return err
		})
	}
	if err := g.Wait(); err != nil {
		StopAll(clusters)
		return nil, err
	}
	return clusters, nil
}

// StopAll stops every non-nil cluster.
func StopAll(clusters []*Cluster) {
	for _, c := range clusters {
		if c != nil {
			c.Stop()
		}
	}
}

// ForTest starts n clusters for one test and stops them in its cleanup,
// printing their logs first if the test failed.
func ForTest(tb testing.TB, n int) []*Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartupTimeout)
	defer cancel()
	clusters, err := StartN(ctx, n, "t")
	if err != nil {
		tb.Fatalf("start clusters: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, c := range clusters {
				tb.Logf("logs of cluster %s:\n%s", c.Name, c.Logs(30))
			}
		}
		StopAll(clusters)
	})
	return clusters
}
