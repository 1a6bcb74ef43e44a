package portforward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/httpstream"
	httpstreamspdy "k8s.io/apimachinery/pkg/util/httpstream/spdy"
	pfconstants "k8s.io/apimachinery/pkg/util/portforward"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/websocket"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// spdyPingPeriod is what client-go's spdy.RoundTripperFor uses: pings keep
// idle connections alive through proxies and load balancers.
const spdyPingPeriod = 5 * time.Second

// upgrade opens the pod's port-forward connection under ctx: WebSocket
// first, then SPDY when the server refuses the WebSocket upgrade.
//
// client-go's port-forward dialers take no context: their requests carry
// none, and its SPDY round tripper waits for the upgrade response without
// bound. So the two upgrades below are client-go's, step for step, with
// the request under ctx and the connection's I/O cut when ctx ends.
func (d *Dialer) upgrade(ctx context.Context, key podKey) (httpstream.Connection, string, error) {
	cfg, err := d.opts.Resolve(key.target)
	if err != nil {
		return nil, "", err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, "", fmt.Errorf("API server URL: %w", err)
	}
	u.Path = path.Join("/", u.Path, "api/v1/namespaces", key.namespace, "pods", key.pod, "portforward")
	if d.opts.SPDYOnly {
		conn, err := upgradeSPDY(ctx, cfg, u)
		return conn, TransportSPDY, err
	}
	conn, err := upgradeWebSocket(ctx, cfg, u)
	if err == nil || !shouldFallback(err) {
		return conn, TransportWebSocket, err
	}
	d.opts.Logger.Info("API server refused the WebSocket port-forward; using SPDY", "pod", key.String(), "error", err.Error())
	conn, err = upgradeSPDY(ctx, cfg, u)
	return conn, TransportSPDY, err
}

// shouldFallback reports whether a WebSocket dial failed for want of
// WebSocket support. client-go's WebSocket transport returns
// k8s.io/streaming's UpgradeFailureError, which apimachinery's
// IsUpgradeFailure (what older code checks) does not match: check both.
func shouldFallback(err error) bool {
	return streamhttp.IsUpgradeFailure(err) || httpstream.IsUpgradeFailure(err) ||
		streamhttp.IsHTTPSProxyError(err) || httpstream.IsHTTPSProxyError(err)
}

// upgradeWebSocket is client-go's NewSPDYOverWebsocketDialer(...).Dial
// with its request under ctx. gorilla/websocket honours ctx while
// connecting and its deadline through the handshake; the cutter, fed the
// connection by the trace hook, ends the handshake on cancellation too.
func upgradeWebSocket(ctx context.Context, cfg *rest.Config, u *url.URL) (httpstream.Connection, error) {
	rt, holder, err := websocket.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	var cut cutter
	traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { cut.watch(ctx, info.Conn) },
	})
	req, err := http.NewRequestWithContext(traced, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	ws, err := websocket.Negotiate(rt, holder, req, pfconstants.WebsocketsSPDYTunnelingPortForwardV1)
	if err = cut.stop(ctx, err); err != nil {
		if ws != nil {
			_ = ws.Close()
		}
		return nil, err
	}
	return httpstreamspdy.NewClientConnectionWithPings(portforward.NewTunnelingConnection("client", ws), portforward.PingPeriod)
}

// upgradeSPDY is client-go's spdy.NewDialer(spdy.RoundTripperFor(cfg))
// .Dial with its request under ctx; spdyUpgrader reads the response.
func upgradeSPDY(ctx context.Context, cfg *rest.Config, u *url.URL) (httpstream.Connection, error) {
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	proxy := http.ProxyFromEnvironment
	if cfg.Proxy != nil {
		proxy = cfg.Proxy
	}
	dialer, err := httpstreamspdy.NewRoundTripperWithConfig(httpstreamspdy.RoundTripperConfig{TLS: tlsConfig, Proxier: proxy})
	if err != nil {
		return nil, err
	}
	up := &spdyUpgrader{dialer: dialer}
	rt, err := rest.HTTPWrappersForConfig(cfg, up) // credentials, impersonation, user agent
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Add(httpstream.HeaderProtocolVersion, portforward.PortForwardProtocolV1Name)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("error sending request: %w", err)
	}
	return up.connection(resp)
}

// spdyUpgrader is the innermost round tripper of a SPDY upgrade: it dials
// with client-go's SpdyRoundTripper (proxy, TLS, ctx while connecting),
// then reads the answer with its I/O cut when the request's ctx ends.
type spdyUpgrader struct {
	dialer *httpstreamspdy.SpdyRoundTripper
	conn   net.Conn
}

func (u *spdyUpgrader) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	req = req.Clone(ctx)
	req.Header.Add(httpstream.HeaderConnection, httpstream.HeaderUpgrade)
	req.Header.Add(httpstream.HeaderUpgrade, httpstreamspdy.HeaderSpdy31)
	conn, err := u.dialer.Dial(req) // connects and sends req
	if err != nil {
		return nil, err
	}
	var cut cutter
	cut.watch(ctx, conn)
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err == nil && resp.StatusCode != http.StatusSwitchingProtocols {
		// Read the refusal now, while the cutter still bounds the read.
		var body []byte
		body, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	if err = cut.stop(ctx, err); err != nil {
		_ = conn.Close()
		return nil, err
	}
	u.conn = conn
	return resp, nil
}

// connection checks the upgrade response, as SpdyRoundTripper's
// NewConnection does, and starts SPDY on the upgraded connection.
func (u *spdyUpgrader) connection(resp *http.Response) (httpstream.Connection, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols ||
		!strings.Contains(strings.ToLower(resp.Header.Get(httpstream.HeaderConnection)), strings.ToLower(httpstream.HeaderUpgrade)) ||
		!strings.Contains(strings.ToLower(resp.Header.Get(httpstream.HeaderUpgrade)), strings.ToLower(httpstreamspdy.HeaderSpdy31)) {
		_ = u.conn.Close()
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("unable to upgrade connection: %s", refusal(body))
	}
	return httpstreamspdy.NewClientConnectionWithPings(u.conn, spdyPingPeriod)
}

// refusal is the message of an API server's refusal body: a Status's
// message when it is one, else the body's text.
func refusal(body []byte) string {
	var status struct{ Message, Error string }
	if json.Unmarshal(body, &status) == nil {
		for _, msg := range []string{status.Message, status.Error} {
			if msg = strings.TrimSpace(msg); msg != "" {
				return msg
			}
		}
	}
	if msg := strings.TrimSpace(string(body)); msg != "" {
		return msg
	}
	return "empty server response"
}

// cutter ends an upgrade's network I/O when its ctx ends, by moving the
// connections' deadlines into the past (as net/http does to abort).
type cutter struct {
	mu    sync.Mutex
	stops []func() bool
}

var aLongTimeAgo = time.Unix(1, 0)

func (c *cutter) watch(ctx context.Context, conn net.Conn) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	c.mu.Lock()
	c.stops = append(c.stops, stop)
	c.mu.Unlock()
}

// stop stops watching. If ctx ended meanwhile, a connection may have been
// cut, even after a successful upgrade: the result is ctx's error.
func (c *cutter) stop(ctx context.Context, err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cut := false
	for _, stop := range c.stops {
		if !stop() {
			cut = true
		}
	}
	if cut || (err != nil && ctx.Err() != nil) {
		return ctx.Err()
	}
	return err
}
