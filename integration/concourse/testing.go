package concourse

import (
	"context"
	"testing"
)

// ForTest starts a web node for one test and stops it in the test's
// cleanup, printing its logs first if the test failed.
func ForTest(tb testing.TB, opts Options) *WebNode {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartupTimeout)
	defer cancel()
	w, err := Start(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("logs of the concourse web node in %s:\n%s", w.Dir, w.Logs(40))
		}
		w.Stop()
	})
	return w
}

// StockForTest starts a stock worker for one test, registered with w,
// and stops it in the test's cleanup, printing its log first if the test
// failed. Start it after a real node the test also runs (see StockSocket).
func StockForTest(tb testing.TB, w *WebNode, opts StockOptions) *StockWorker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartupTimeout)
	defer cancel()
	s, err := w.StartStock(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("logs of the stock worker in %s:\n%s", s.Dir, s.Logs(60))
		}
		s.Stop()
	})
	return s
}
