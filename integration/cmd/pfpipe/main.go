// Command pfpipe is the floor of the streams and agent benchmarks: the
// least a program can do to copy a volume out of a pod. It port-forwards
// to the source pod with client-go (a local listener, as kubectl does)
// and pipes its stream-out with one HTTP/1.1 PUT into either another
// pod's stream-in, port-forwarded the same way (--dst-kubeconfig,
// --dst-pod, --dst-path), or a URL over one TLS 1.3 connection made with
// mesh certificates (--dst-url, --dst-ca, --dst-cert, --dst-key: the
// receiver integration/cmd/tlsrecv, standing in for an agent).
//
// --src-dialer jetway reads the source through jetway's own port-forward
// dialer instead (package portforward: a stream of the upgraded
// connection is the HTTP connection, no local listener), as the gateway
// does: with --dst-url, the gateway's path with the mesh replaced by one
// TLS connection.
//
// It prints one JSON line: the bytes carried, the seconds from the first
// dial to the destination's answer, and that answer.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientportforward "k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/jetway-ci/jetway/mesh"
	"github.com/jetway-ci/jetway/portforward"
)

type options struct {
	srcKube, srcPod, srcPath       string
	srcDialer                      string
	dstKube, dstPod, dstPath       string
	dstURL, dstCA, dstCert, dstKey string
	// Tokens of the source's and the destination's volume servers.
	srcToken, dstToken string
}

// result is what pfpipe prints.
type result struct {
	Bytes   int64           `json:"bytes"`
	Seconds float64         `json:"seconds"`
	Answer  json.RawMessage `json:"answer,omitempty"` // the destination's, when it is JSON
}

func main() {
	var o options
	flag.StringVar(&o.srcKube, "src-kubeconfig", "", "source target kubeconfig")
	flag.StringVar(&o.srcPod, "src-pod", "", "source pod")
	flag.StringVar(&o.srcPath, "src-path", "", "stream-out path and query, e.g. /volumes/h/stream-out?path=out")
	flag.StringVar(&o.srcDialer, "src-dialer", "client-go", "how to port-forward to the source: client-go (a local listener) or jetway (package portforward)")
	flag.StringVar(&o.dstKube, "dst-kubeconfig", "", "destination target kubeconfig")
	flag.StringVar(&o.dstPod, "dst-pod", "", "destination pod")
	flag.StringVar(&o.dstPath, "dst-path", "", "stream-in path and query")
	flag.StringVar(&o.dstURL, "dst-url", "", "stream-in URL (https) of a receiver that takes mesh certificates, in place of a destination pod")
	flag.StringVar(&o.dstCA, "dst-ca", "", "with --dst-url: the mesh CA (PEM)")
	flag.StringVar(&o.dstCert, "dst-cert", "", "with --dst-url: this sender's mesh certificate (PEM)")
	flag.StringVar(&o.dstKey, "dst-key", "", "with --dst-url: its key (PEM)")
	flag.StringVar(&o.srcToken, "src-token", "", "the source volume server's token")
	flag.StringVar(&o.dstToken, "dst-token", "", "the destination volume server's token")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "pfpipe: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	start := time.Now()
	srcURL, srcClient, stopSrc, err := source(o)
	if err != nil {
		return err
	}
	defer stopSrc()
	dstURL, client, stopDst, err := destination(o)
	if err != nil {
		return err
	}
	defer stopDst()
	req, _ := http.NewRequest(http.MethodPut, srcURL, nil)
	req.Header.Set("Accept-Encoding", "raw")
	bearer(req, o.srcToken)
	out, err := srcClient.Do(req)
	if err != nil {
		return err
	}
	defer out.Body.Close()
	if out.StatusCode != http.StatusOK {
		return fmt.Errorf("stream-out: %s", out.Status)
	}
	counter := &countReader{r: out.Body}
	in, err := http.NewRequest(http.MethodPut, dstURL, io.NopCloser(counter))
	if err != nil {
		return err
	}
	in.Header.Set("Content-Encoding", "raw")
	bearer(in, o.dstToken)
	resp, err := client.Do(in)
	if err != nil {
		return err
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("stream-in: %s: %s", resp.Status, answer)
	}
	res := result{Bytes: counter.n, Seconds: time.Since(start).Seconds()}
	if json.Valid(answer) {
		res.Answer = answer
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// bearer sends token, if there is one.
func bearer(req *http.Request, token string) {
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
}

// source is the stream-out URL and the client that reaches it.
func source(o options) (string, *http.Client, func(), error) {
	switch o.srcDialer {
	case "client-go":
		port, stop, err := forward(o.srcKube, o.srcPod)
		if err != nil {
			return "", nil, nil, err
		}
		return fmt.Sprintf("http://127.0.0.1:%d%s", port, o.srcPath), http.DefaultClient, stop, nil
	case "jetway":
		cfg, ns, err := load(o.srcKube)
		if err != nil {
			return "", nil, nil, err
		}
		d := portforward.New(portforward.Options{Resolve: func(string) (*rest.Config, error) { return cfg, nil }})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Start(ctx) }()
		u := "http://" + portforward.Host("src", ns, o.srcPod, 7788) + o.srcPath
		return u, &http.Client{Transport: d.RoundTripper()}, func() { cancel(); <-done }, nil
	}
	return "", nil, nil, fmt.Errorf("--src-dialer %q: want client-go or jetway", o.srcDialer)
}

// destination is the stream-in URL and the client that reaches it: a
// port-forward to the destination pod, or --dst-url over TLS with the
// mesh's own client settings (TLS 1.3, the peer checked against the mesh
// CA). A client with its own TLS settings speaks HTTP/1.1, on one
// connection for the one request.
func destination(o options) (string, *http.Client, func(), error) {
	if o.dstURL != "" {
		id, err := mesh.LoadIdentity(o.dstCA, o.dstCert, o.dstKey)
		if err != nil {
			return "", nil, nil, err
		}
		tr := &http.Transport{TLSClientConfig: id.ClientConfig(), DisableCompression: true}
		return o.dstURL, &http.Client{Transport: tr}, tr.CloseIdleConnections, nil
	}
	port, stop, err := forward(o.dstKube, o.dstPod)
	if err != nil {
		return "", nil, nil, err
	}
	return fmt.Sprintf("http://127.0.0.1:%d%s", port, o.dstPath), http.DefaultClient, stop, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// forward port-forwards a local port to the pod's port 7788, in the
// kubeconfig's namespace.
func forward(kubeconfig, pod string) (int, func(), error) {
	cfg, ns, err := load(kubeconfig)
	if err != nil {
		return 0, nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return 0, nil, err
	}
	u.Path = fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", ns, pod)
	dialer, err := dialerFor(cfg, u)
	if err != nil {
		return 0, nil, err
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := clientportforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:7788"}, stop, ready, io.Discard, os.Stderr)
	if err != nil {
		return 0, nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	select {
	case <-ready:
	case err := <-errc:
		return 0, nil, err
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil {
		return 0, nil, err
	}
	return int(ports[0].Local), func() { close(stop); <-errc }, nil
}

// load reads a kubeconfig: its client configuration and namespace.
func load(kubeconfig string) (*rest.Config, string, error) {
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := loader.Namespace()
	return cfg, ns, err
}

// dialerFor is kubectl's transport choice: WebSocket, SPDY on refusal.
func dialerFor(cfg *rest.Config, u *url.URL) (httpstream.Dialer, error) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	ws, err := clientportforward.NewSPDYOverWebsocketDialer(u, cfg)
	if err != nil {
		return nil, err
	}
	return clientportforward.NewFallbackDialer(ws, spdyDialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || httpstream.IsUpgradeFailure(err)
	}), nil
}
