package portforward

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// Host names a pod for the RoundTripper: <pod>.<namespace>.<target>.
// Namespaces and target names are DNS labels, so the pod is everything
// before the last two dots.
func Host(target, namespace, pod string, port int) string {
	return net.JoinHostPort(pod+"."+namespace+"."+target, strconv.Itoa(port))
}

func parseHost(host string) (target, namespace, pod string, err error) {
	i := strings.LastIndexByte(host, '.')
	if i <= 0 {
		return "", "", "", fmt.Errorf("host %q is not <pod>.<namespace>.<target>", host)
	}
	j := strings.LastIndexByte(host[:i], '.')
	if j <= 0 {
		return "", "", "", fmt.Errorf("host %q is not <pod>.<namespace>.<target>", host)
	}
	return host[i+1:], host[j+1 : i], host[:j], nil
}

// RoundTripper returns an HTTP transport whose connections are
// port-forward streams: a request to http://<Host(...)>/path reaches the
// pod's port. Each request gets a fresh stream on the pod's shared
// connection (cheap: no TLS, one round trip), so a request never rides a
// stream whose pod side died since; large buffers keep artifact streams
// fast.
func (d *Dialer) RoundTripper() *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, address string) (net.Conn, error) {
			host, portStr, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(portStr)
			if err != nil {
				return nil, fmt.Errorf("port %q: %w", portStr, err)
			}
			target, namespace, pod, err := parseHost(host)
			if err != nil {
				return nil, err
			}
			return d.Dial(ctx, target, namespace, pod, port)
		},
		Proxy:              nil,
		DisableCompression: true, // artifact encodings are chosen by the caller
		DisableKeepAlives:  true,
		ReadBufferSize:     256 << 10,
		WriteBufferSize:    256 << 10,
	}
}
