// Command pfpipe is the floor of the streams benchmark: the least a program
// can do to copy a volume between pods on two clusters. It port-forwards
// to each pod with client-go (local listeners, as kubectl does), and pipes
// one pod's stream-out into the other's stream-in with io.Copy.
package main

import (
	"context"
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
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

func main() {
	srcKube := flag.String("src-kubeconfig", "", "source target kubeconfig")
	srcPod := flag.String("src-pod", "", "source pod")
	srcURL := flag.String("src-path", "", "stream-out path and query, e.g. /volumes/h/stream-out?path=out")
	dstKube := flag.String("dst-kubeconfig", "", "destination target kubeconfig")
	dstPod := flag.String("dst-pod", "", "destination pod")
	dstURL := flag.String("dst-path", "", "stream-in path and query")
	flag.Parse()
	if err := run(*srcKube, *srcPod, *srcURL, *dstKube, *dstPod, *dstURL); err != nil {
		fmt.Fprintf(os.Stderr, "pfpipe: %v\n", err)
		os.Exit(1)
	}
}

func run(srcKube, srcPod, srcPath, dstKube, dstPod, dstPath string) error {
	srcPort, stopSrc, err := forward(srcKube, srcPod)
	if err != nil {
		return err
	}
	defer stopSrc()
	dstPort, stopDst, err := forward(dstKube, dstPod)
	if err != nil {
		return err
	}
	defer stopDst()
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d%s", srcPort, srcPath), nil)
	req.Header.Set("Accept-Encoding", "raw")
	out, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer out.Body.Close()
	if out.StatusCode != http.StatusOK {
		return fmt.Errorf("stream-out: %s", out.Status)
	}
	counter := &countReader{r: out.Body}
	in, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d%s", dstPort, dstPath), io.NopCloser(counter))
	in.Header.Set("Content-Encoding", "raw")
	resp, err := http.DefaultClient.Do(in)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("stream-in: %s", resp.Status)
	}
	fmt.Printf("%d bytes in %.3fs\n", counter.n, time.Since(start).Seconds())
	return nil
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
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return 0, nil, err
	}
	ns, _, err := loader.Namespace()
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
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:7788"}, stop, ready, io.Discard, os.Stderr)
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

// dialerFor is kubectl's transport choice: WebSocket, SPDY on refusal.
func dialerFor(cfg *rest.Config, u *url.URL) (httpstream.Dialer, error) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	ws, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
	if err != nil {
		return nil, err
	}
	return portforward.NewFallbackDialer(ws, spdyDialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || httpstream.IsUpgradeFailure(err)
	}), nil
}
