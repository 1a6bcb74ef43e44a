package concourse

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWorkerListenersAdmitOnlyTheWebNode: a worker's listener on
// 127.0.0.2 with the web node's network 127.0.0.3/32 serves a client
// from 127.0.0.3 and the gateway itself (127.0.0.2), and closes on one
// from 127.0.0.4 before it reads a byte, counting it.
func TestWorkerListenersAdmitOnlyTheWebNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	m := NewMetrics(prometheus.NewRegistry())
	served := 0
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		_, _ = io.WriteString(w, "volumes")
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(&fromWebNode{Listener: ln, nets: []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")},
			what: "volume API", logger: slog.New(slog.DiscardHandler), metrics: m})
	}()
	defer func() { _ = srv.Close(); <-done }()

	get := func(from string) (string, error) {
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + ln.Addr().String() + "/volumes")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for _, from := range []string{"127.0.0.3", "127.0.0.2"} {
		body, err := get(from)
		require.NoError(t, err, from)
		assert.Equal(t, "volumes", body, from)
	}
	_, err = get("127.0.0.4")
	require.Error(t, err, "closed on")
	assert.Equal(t, 2, served)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.refusals))
}
