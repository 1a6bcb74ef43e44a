package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jetway-ci/jetway/internal/backoff"
	"github.com/jetway-ci/jetway/wire"
)

// REST reaches a web node through its REST API (concourse-url) instead of
// its TSA, for installations where the web node reaches the gateway
// directly. It registers workers as a system client of the web node (a
// client_credentials token of `concourse web --add-client ID:SECRET
// --system-claim-value ID`) and heartbeats them itself, as the TSA does
// for its workers (tsa/heartbeater.go). Each Forward listens on
// WorkerHost, on one port the kernel picks for Garden and one for the
// volume API, and registers those as the worker's addr and
// baggageclaim_url. One REST serves every target; Close it when done.
type REST struct {
	opts   RESTOptions
	base   *url.URL
	client *http.Client
	// ping is the client of the worker's own listeners (no keep-alive:
	// one call per heartbeat, as the TSA's).
	ping *http.Client

	lock chan struct{} // one slot: held while tok is read or fetched
	tok  token
}

// RESTOptions configure a REST.
type RESTOptions struct {
	// URL is the web node's external URL (concourse-url).
	URL string
	// ClientID and ClientSecret are the web node's system client
	// (concourse-client-id, concourse-client-secret-file).
	ClientID     string
	ClientSecret Secret
	// Insecure allows an http:// URL (concourse-insecure): the secret and
	// the tokens then travel unencrypted.
	Insecure bool
	// WorkerHost is the host name or IP address the web node reaches this
	// gateway at (concourse-worker-address).
	WorkerHost string
	// HeartbeatInterval is the time between heartbeats; the worker's TTL
	// is twice it, as the TSA's. Default 30 s, the TSA's default.
	HeartbeatInterval time.Duration
	// RetryInterval is the time before a failed heartbeat is tried again;
	// default 1 s, as the TSA's. A worker with no heartbeat for its TTL is
	// stalled by the web node: Forward then fails.
	RetryInterval time.Duration
	// Timeout bounds each call to the web node and to the worker's own
	// APIs; default 30 s.
	Timeout time.Duration
	// WebNodeNetworks are where the web node calls the workers from
	// (concourse-web-node-networks), at least one: the worker's listeners
	// take no credential (an unmodified web node sends none: Garden's
	// client dials plain TCP, and the baggageclaim URL, where a secret
	// could go, is shown to every user who sees the worker), so they
	// accept connections only from these and from the gateway itself.
	WebNodeNetworks []netip.Prefix
	// Now is the clock the token's lifetime is read on; default time.Now.
	Now     func() time.Time
	Logger  *slog.Logger
	Metrics *Metrics
}

// Secret is a value that is never shown: formatted, logged or marshalled,
// it reads [redacted].
type Secret string

const redacted = "[redacted]"

func (Secret) Format(f fmt.State, _ rune)      { _, _ = io.WriteString(f, redacted) }
func (Secret) String() string                  { return redacted }
func (Secret) GoString() string                { return redacted }
func (Secret) LogValue() slog.Value            { return slog.StringValue(redacted) }
func (Secret) MarshalText() ([]byte, error)    { return []byte(redacted), nil }
func (s Secret) reveal() string                { return string(s) }
func (s Secret) redactFrom(text string) string { return redact(text, string(s)) }

// token is the access token and when to fetch the next.
type token struct {
	value   string
	refresh time.Time
}

// StatusError is a web node's answer with a status other than the one
// expected. Body is bounded, with the secret and the token redacted.
type StatusError struct {
	Call   string // method and path
	Code   int
	Status string
	Body   string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("%s: the web node answered %s", e.Call, e.Status)
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// Bounds on what is read of an answer: its body in an error, and a
// sweep's list of handles.
const (
	maxErrorBody = 4 << 10
	maxAnswer    = 1 << 20
)

// NewREST checks opts and makes a REST.
func NewREST(opts RESTOptions) (*REST, error) {
	base, err := url.Parse(strings.TrimRight(opts.URL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("%q is not the web node's URL (http:// or https://HOST[:PORT])", opts.URL)
	}
	switch {
	case base.Scheme == "http" && !opts.Insecure:
		return nil, fmt.Errorf("%q is http://: the client secret would travel unencrypted; give an https:// URL, or allow it (concourse-insecure)", opts.URL)
	case opts.ClientID == "":
		return nil, errors.New("no client ID")
	case opts.ClientSecret == "":
		return nil, errors.New("no client secret")
	case opts.WorkerHost == "":
		return nil, errors.New("no worker address: the host the web node reaches this gateway at")
	case len(opts.WebNodeNetworks) == 0:
		return nil, errors.New("no web node networks: the workers' listeners take no credential, so they accept only the web node's networks (concourse-web-node-networks)")
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 30 * time.Second
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// The worker's own lists come from the worker's address, so that its
	// listeners tell them from the web node's (WebNodeNetworks).
	dialer := &net.Dialer{Timeout: opts.Timeout}
	if ip, err := netip.ParseAddr(opts.WorkerHost); err == nil {
		dialer.LocalAddr = &net.TCPAddr{IP: ip.AsSlice()}
	}
	return &REST{opts: opts, base: base, client: &http.Client{Transport: transport},
		ping: &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialer.DialContext}},
		lock: make(chan struct{}, 1)}, nil
}

// Close closes the connections kept open to the web node.
func (r *REST) Close() {
	r.client.CloseIdleConnections()
	r.ping.CloseIdleConnections()
}

// TTL is how long the web node keeps a worker running without a
// heartbeat: twice HeartbeatInterval.
func (r *REST) TTL() time.Duration { return 2 * r.opts.HeartbeatInterval }

// Forward registers worker w and heartbeats it, serving the web node's
// connections to its Garden and volume APIs with garden and baggageclaim
// on two ports of WorkerHost until it returns. Each heartbeat first lists
// the worker's containers and volumes through those ports, as the TSA
// does: a worker whose listeners do not answer is not heartbeated. It
// returns nil when the web node ended the registration (the worker
// landed, or a heartbeat answered 404: retired or pruned), ctx's error
// when ctx ended, else why the registration failed or broke (no
// heartbeat for the TTL).
func (r *REST) Forward(ctx context.Context, w wire.Worker, garden, baggageclaim http.Handler, on func(Event)) error {
	if on == nil {
		on = func(Event) {}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	gardenAddr, stopGarden, err := r.serve(ctx, &wg, "Garden", garden)
	if err != nil {
		return err
	}
	defer stopGarden()
	volumeAddr, stopVolumes, err := r.serve(ctx, &wg, "volume API", baggageclaim)
	if err != nil {
		return err
	}
	defer stopVolumes()
	w.GardenAddr = net.JoinHostPort(r.opts.WorkerHost, port(gardenAddr))
	w.BaggageclaimURL = "http://" + net.JoinHostPort(r.opts.WorkerHost, port(volumeAddr))
	own := ownAPIs{garden: "http://" + gardenAddr, volumes: "http://" + volumeAddr}

	if err := r.register(ctx, w, own); err != nil {
		return err
	}
	on(Event{Type: "registered"})
	return r.heartbeat(ctx, w, own, on)
}

// serve serves h on a port of WorkerHost the kernel picks, until stop.
// It returns the address listened on.
func (r *REST) serve(ctx context.Context, wg *sync.WaitGroup, what string, h http.Handler) (string, func(), error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", net.JoinHostPort(r.opts.WorkerHost, "0"))
	if err != nil {
		return "", nil, fmt.Errorf("listen for the web node's calls to the worker's %s on %s (concourse-worker-address): %w",
			what, r.opts.WorkerHost, err)
	}
	ln = &fromWebNode{Listener: ln, nets: r.opts.WebNodeNetworks, what: what, logger: r.opts.Logger, metrics: r.opts.Metrics}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	wg.Go(func() { _ = srv.Serve(ln) })
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// register lists the worker's containers and volumes and registers it
// with the TTL.
func (r *REST) register(ctx context.Context, w wire.Worker, own ownAPIs) error {
	if err := r.count(ctx, &w, own); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	body, _ := json.Marshal(w)
	_, err := r.call(ctx, call{method: http.MethodPost, path: "/api/v1/workers",
		query: url.Values{"ttl": {r.TTL().String()}}, body: body, want: http.StatusOK})
	var status *StatusError
	if errors.As(err, &status) && status.Code == http.StatusForbidden {
		err = fmt.Errorf("%w (is the client ID one of the web node's --system-claim-value?)", err)
	}
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	return nil
}

// errGone: the web node has no such worker (a heartbeat's 404).
var errGone = errors.New("the web node has no such worker")

// heartbeat heartbeats w every HeartbeatInterval until the web node ends
// its registration or ctx ends; a failed heartbeat is tried again every
// RetryInterval until the TTL since the last one ran out.
func (r *REST) heartbeat(ctx context.Context, w wire.Worker, own ownAPIs, on func(Event)) error {
	log := r.opts.Logger.With("target", w.Name)
	last := r.opts.Now()
	wait := r.opts.HeartbeatInterval
	for {
		if backoff.Sleep(ctx, wait) != nil {
			return ctx.Err()
		}
		state, err := r.heartbeatOnce(ctx, w, own)
		switch {
		case errors.Is(err, errGone):
			return nil // retired, or pruned: what forward-worker's status 0 says
		case err == nil:
			on(Event{Type: "heartbeated"})
			if state == "landed" {
				return nil
			}
			last, wait = r.opts.Now(), r.opts.HeartbeatInterval
		case ctx.Err() != nil:
			return ctx.Err()
		case r.opts.Now().Sub(last) >= r.TTL():
			return fmt.Errorf("no heartbeat for %s, the worker's TTL (the web node stalls it): %w", r.TTL(), err)
		default:
			log.Warn("heartbeat failed; trying again", "error", err.Error(), "retry_in", r.opts.RetryInterval.String())
			wait = r.opts.RetryInterval
		}
	}
}

// heartbeatOnce lists the worker's containers and volumes and heartbeats
// it; it returns the worker's state on the web node.
func (r *REST) heartbeatOnce(ctx context.Context, w wire.Worker, own ownAPIs) (string, error) {
	if err := r.count(ctx, &w, own); err != nil {
		return "", fmt.Errorf("heartbeat: %w", err)
	}
	body, _ := json.Marshal(w)
	answer, err := r.call(ctx, call{method: http.MethodPut, path: "/api/v1/workers/" + url.PathEscape(w.Name) + "/heartbeat",
		query: url.Values{"ttl": {r.TTL().String()}}, body: body, want: http.StatusOK})
	var status *StatusError
	if errors.As(err, &status) && status.Code == http.StatusNotFound {
		return "", errGone
	}
	if err != nil {
		return "", fmt.Errorf("heartbeat: %w", err)
	}
	var saved struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(answer, &saved); err != nil {
		return "", fmt.Errorf("heartbeat: the web node's answer is not a worker: %w", err)
	}
	return saved.State, nil
}

// ownAPIs are the worker's Garden and volume API as this gateway serves
// them, by the addresses listened on.
type ownAPIs struct{ garden, volumes string }

// count sets w's active containers and volumes from its own lists, as
// the TSA's heartbeat does (it registers nothing it cannot list).
func (r *REST) count(ctx context.Context, w *wire.Worker, own ownAPIs) error {
	var containers struct {
		Handles []string `json:"handles"`
	}
	if err := r.list(ctx, own.garden+"/containers", &containers); err != nil {
		return fmt.Errorf("the worker's Garden: %w", err)
	}
	var volumes []json.RawMessage
	if err := r.list(ctx, own.volumes+"/volumes", &volumes); err != nil {
		return fmt.Errorf("the worker's volume API: %w", err)
	}
	w.ActiveContainers, w.ActiveVolumes = len(containers.Handles), len(volumes)
	return nil
}

func (r *REST) list(ctx context.Context, u string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := r.ping.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, bound(string(b)))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// Command runs one of the TSA's one-shot commands for w through the REST
// API: land-worker, retire-worker and delete-worker, report-containers
// H... and report-volumes H... (what the worker holds), sweep-containers
// and sweep-volumes (the JSON list of handles the web node wants
// destroyed, returned).
func (r *REST) Command(ctx context.Context, command string, w wire.Worker) ([]byte, error) {
	verb, handles := commandArgs(command)
	if w.Name == "" {
		return nil, fmt.Errorf("%s: no worker name", verb)
	}
	worker := "/api/v1/workers/" + url.PathEscape(w.Name)
	byName := url.Values{"worker_name": {w.Name}}
	report, _ := json.Marshal(handles)
	var c call
	switch verb {
	case "land-worker":
		c = call{method: http.MethodPut, path: worker + "/land", want: http.StatusOK}
	case "retire-worker":
		c = call{method: http.MethodPut, path: worker + "/retire", want: http.StatusOK}
	case "delete-worker":
		c = call{method: http.MethodDelete, path: worker, want: http.StatusOK}
	case "report-containers":
		c = call{method: http.MethodPut, path: "/api/v1/containers/report", query: byName, body: report, want: http.StatusNoContent}
	case "report-volumes":
		c = call{method: http.MethodPut, path: "/api/v1/volumes/report", query: byName, body: report, want: http.StatusNoContent}
	case "sweep-containers":
		c = call{method: http.MethodGet, path: "/api/v1/containers/destroying", query: byName, want: http.StatusOK}
	case "sweep-volumes":
		c = call{method: http.MethodGet, path: "/api/v1/volumes/destroying", query: byName, want: http.StatusOK}
	default:
		return nil, fmt.Errorf("%s: not a command jetway sends the web node", verb)
	}
	answer, err := r.call(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", verb, w.Name, err)
	}
	if c.method != http.MethodGet {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(answer, &list); err != nil {
		return nil, fmt.Errorf("%s %s: the web node's answer is not a list of handles: %w", verb, w.Name, err)
	}
	return answer, nil
}

// commandArgs splits a TSA command line into its verb and arguments (a
// report's handles: never nil, so that it is sent as a JSON list).
func commandArgs(command string) (string, []string) {
	f := strings.Fields(command)
	if len(f) == 0 {
		return "", []string{}
	}
	return f[0], append([]string{}, f[1:]...)
}

// call is one call to the web node's API.
type call struct {
	method, path string
	query        url.Values
	body         []byte // JSON
	want         int    // the status of success
}

// call makes c with the client's token; a 401 fetches a new token and
// tries once more. It returns the answer's body.
func (r *REST) call(ctx context.Context, c call) ([]byte, error) {
	for retried := false; ; retried = true {
		tok, err := r.token(ctx)
		if err != nil {
			return nil, err
		}
		answer, err := r.do(ctx, c, tok)
		var status *StatusError
		if !retried && errors.As(err, &status) && status.Code == http.StatusUnauthorized {
			r.forget(ctx, tok)
			continue
		}
		return answer, err
	}
}

func (r *REST) do(ctx context.Context, c call, tok string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	u := r.base.JoinPath(c.path)
	u.RawQuery = c.query.Encode()
	var body io.Reader
	if c.body != nil {
		body = bytes.NewReader(c.body)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if c.body != nil {
		// Without it the web node parses the body as a form: 400.
		req.Header.Set("Content-Type", "application/json")
	}
	return r.send(req, c.method+" "+c.path, c.want, tok)
}

// send sends req and reads its answer, which must have status want.
func (r *REST) send(req *http.Request, what string, want int, tok string) ([]byte, error) {
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: reach the web node at %s: %w", what, r.base.Redacted(), errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("%s: read the web node's answer: %w", what, err)
	}
	if resp.StatusCode != want {
		text := r.opts.ClientSecret.redactFrom(redact(string(b), tok))
		return nil, &StatusError{Call: what, Code: resp.StatusCode, Status: resp.Status, Body: bound(text)}
	}
	if len(b) > maxAnswer {
		return nil, fmt.Errorf("%s: the web node's answer is over %d bytes", what, maxAnswer)
	}
	return b, nil
}

// token is the client's access token, fetched when there is none or it
// is due for refresh (at three quarters of its lifetime).
func (r *REST) token(ctx context.Context) (string, error) {
	select {
	case r.lock <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-r.lock }()
	if r.tok.value != "" && r.opts.Now().Before(r.tok.refresh) {
		return r.tok.value, nil
	}
	tok, err := r.fetchToken(ctx)
	if err != nil {
		return "", err
	}
	r.tok = tok
	return tok.value, nil
}

// forget drops tok, which the web node refused, unless another call
// already replaced it.
func (r *REST) forget(ctx context.Context, tok string) {
	select {
	case r.lock <- struct{}{}:
	case <-ctx.Done():
		return // the call that follows fails with ctx's error
	}
	defer func() { <-r.lock }()
	if r.tok.value == tok {
		r.tok = token{}
	}
}

// fetchToken asks the web node's token endpoint for a client_credentials
// token.
func (r *REST) fetchToken(ctx context.Context) (token, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	const path = "/sky/issuer/token"
	form := url.Values{"grant_type": {"client_credentials"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base.JoinPath(path).String(), strings.NewReader(form.Encode()))
	if err != nil {
		return token{}, err
	}
	// As RFC 6749 2.3.1 says (and golang.org/x/oauth2 does): the ID and
	// the secret form-encoded, then in Basic authentication.
	req.SetBasicAuth(url.QueryEscape(r.opts.ClientID), url.QueryEscape(r.opts.ClientSecret.reveal()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	issued := r.opts.Now()
	b, err := r.send(req, "token for client "+r.opts.ClientID, http.StatusOK, "")
	var status *StatusError
	if errors.As(err, &status) && (status.Code == http.StatusUnauthorized || status.Code == http.StatusBadRequest) {
		err = fmt.Errorf("%w (is the client in the web node's --add-client, with the secret in concourse-client-secret-file?)", err)
	}
	if err != nil {
		return token{}, err
	}
	var answer struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(b, &answer); err != nil || answer.AccessToken == "" {
		return token{}, fmt.Errorf("token for client %s: no access_token in the web node's answer", r.opts.ClientID)
	}
	refresh := issued.Add(100 * 365 * 24 * time.Hour) // no lifetime said: until the web node refuses it
	if answer.ExpiresIn > 0 {
		refresh = issued.Add(time.Duration(answer.ExpiresIn) * time.Second * 3 / 4)
	}
	return token{value: answer.AccessToken, refresh: refresh}, nil
}

// redact replaces every occurrence of secret (and of its form encoding)
// in text.
func redact(text, secret string) string {
	if secret == "" {
		return text
	}
	text = strings.ReplaceAll(text, secret, redacted)
	return strings.ReplaceAll(text, url.QueryEscape(secret), redacted)
}

// bound trims text to maxErrorBody bytes.
func bound(text string) string {
	text = strings.TrimSpace(text)
	if len(text) > maxErrorBody {
		text = text[:maxErrorBody] + "…"
	}
	return text
}

// fromWebNode is a worker's listener that accepts connections only from
// the web node's networks and from the gateway itself (its heartbeat
// lists through its own listeners): anyone else is closed on before a
// byte is read.
type fromWebNode struct {
	net.Listener
	nets    []netip.Prefix
	what    string
	logger  *slog.Logger
	metrics *Metrics
}

func (l *fromWebNode) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if admits(l.nets, c.LocalAddr(), c.RemoteAddr()) {
			return c, nil
		}
		_ = c.Close()
		l.metrics.refused()
		l.logger.Debug("refused a connection to a worker's listener from outside concourse-web-node-networks",
			"api", l.what, "remote", c.RemoteAddr().String())
	}
}

// admits reports whether a connection from remote to local comes from
// the gateway itself or from one of nets.
func admits(nets []netip.Prefix, local, remote net.Addr) bool {
	from, ok := addrIP(remote)
	if !ok {
		return false
	}
	if to, ok := addrIP(local); ok && to == from {
		return true
	}
	for _, n := range nets {
		if n.Contains(from) {
			return true
		}
	}
	return false
}

func addrIP(a net.Addr) (netip.Addr, bool) {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	return t.AddrPort().Addr().Unmap(), true
}
