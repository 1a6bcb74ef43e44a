// Package kubecount counts the requests a client makes of a Kubernetes
// API server, by verb and resource, as the API server's own
// apiserver_request_total would name them: what a target, or the state
// namespace, costs its API server, seen from the gateway.
package kubecount

import (
	"cmp"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Request is one kind of request: its verb (get, list, watch, create,
// update, patch, delete, deletecollection, or the HTTP method of anything
// else) and its resource, with its subresource ("pods/portforward").
type Request struct {
	Verb, Resource string
}

// Counts are the requests made through the round trippers Wrap makes,
// and the bytes of their answers' bodies read (a watch's as it streams).
// The zero value is ready to use.
type Counts struct {
	mu sync.Mutex
	n  map[Request]Count
}

// Count is how many requests of a kind were made, and the bytes of their
// answers read.
type Count struct {
	Requests, Bytes uint64
}

// Wrap counts every request made through rt, for rest.Config's Wrap.
func (c *Counts) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{c: c, next: rt}
}

// Each calls f with every kind of request made so far and its count, in
// order of verb and resource.
func (c *Counts) Each(f func(Request, Count)) {
	c.mu.Lock()
	counts := maps.Clone(c.n)
	c.mu.Unlock()
	kinds := slices.SortedFunc(maps.Keys(counts), func(a, b Request) int {
		return cmp.Or(cmp.Compare(a.Verb, b.Verb), cmp.Compare(a.Resource, b.Resource))
	})
	for _, r := range kinds {
		f(r, counts[r])
	}
}

func (c *Counts) add(r Request, requests, bytes uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[Request]Count{}
	}
	n := c.n[r]
	n.Requests += requests
	n.Bytes += bytes
	c.n[r] = n
}

type roundTripper struct {
	c    *Counts
	next http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r := Classify(req)
	rt.c.add(r, 1, 0)
	resp, err := rt.next.RoundTrip(req)
	if err == nil && resp.Body != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = &countedBody{ReadCloser: resp.Body, c: rt.c, r: r}
	}
	return resp, err
}

// countedBody counts the bytes read of an answer's body.
type countedBody struct {
	io.ReadCloser
	c *Counts
	r Request
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.c.add(b.r, 0, uint64(n))
	}
	return n, err
}

// Classify names req as the API server would: a GET of a collection is a
// list, or a watch if it asks to watch; a DELETE of one is a
// deletecollection; an exec, attach or port-forward is a connect. A path that is not a resource's (/version, /healthz,
// discovery) is its own resource.
func Classify(req *http.Request) Request {
	path := strings.Trim(req.URL.Path, "/")
	parts := strings.Split(path, "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:] // api/v1/...
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:] // apis/group/version/...
	default:
		return Request{Verb: strings.ToLower(req.Method), Resource: "/" + path}
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:] // namespaces/ns/resource/...
	}
	if len(rest) == 0 {
		return Request{Verb: strings.ToLower(req.Method), Resource: "/" + path}
	}
	resource, named := rest[0], len(rest) >= 2
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	verb := strings.ToLower(req.Method)
	switch sub := resource[strings.LastIndex(resource, "/")+1:]; {
	case sub == "exec" || sub == "attach" || sub == "portforward" || sub == "proxy":
		return Request{Verb: "connect", Resource: resource}
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		if !named {
			verb = "deletecollection"
		} else {
			verb = "delete"
		}
	}
	return Request{Verb: verb, Resource: resource}
}

// Collector exports Counts as two Prometheus counters, of requests and
// of their answers' bytes: each source's labels, then verb and resource.
type Collector struct {
	requests, bytes *prometheus.Desc
	sources         func(yield func(labels []string, c *Counts))
}

// NewCollector exports the counts sources yields at each scrape, as
// counters prefix_requests_total and prefix_response_bytes_total, with
// labels (then verb and resource); what names the requests' API server
// ends both helps.
func NewCollector(prefix, what string, labels []string, sources func(yield func(labels []string, c *Counts))) *Collector {
	labels = append(slices.Clone(labels), "verb", "resource")
	return &Collector{
		requests: prometheus.NewDesc(prefix+"_requests_total", "Requests the gateway made of "+what+
			", by verb and resource as the API server names them.", labels, nil),
		bytes: prometheus.NewDesc(prefix+"_response_bytes_total", "Bytes of the answers the gateway read from "+what+
			" (a watch's as it streams; an exec or port-forward's not), by the request's verb and resource.", labels, nil),
		sources: sources,
	}
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.bytes
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.sources(func(labels []string, counts *Counts) {
		counts.Each(func(r Request, n Count) {
			l := append(slices.Clone(labels), r.Verb, r.Resource)
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n.Requests), l...)
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(n.Bytes), l...)
		})
	})
}
