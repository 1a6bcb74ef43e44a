// Package client is a Go client of jetway's HTTP API, for a CI core that
// runs its steps through jetway instead of writing HTTP by hand: the
// workers and their lifecycle, steps (submit, follow, abort) and volume
// streams. Every call honours its context; errors are typed, so callers
// tell a missing step from a forbidden one with errors.Is, and a step that
// did not succeed from a failed call with errors.As (*StepError).
//
// Following a step's events survives dropped connections: the client
// asks again from the event after the last it delivered (?since=), so no
// event is lost or delivered twice.
//
// The Orchestrator interface is the contract a CI core codes against:
// RunTask, CheckResource, GetResource and PutResource, plus the workers'
// lifecycle and volume streams.
//
// The API's shapes (wire.Request, wire.View, wire.Event, wire.Worker,
// ...) come from package wire, which imports only the standard library:
// a program that embeds this client gets no Kubernetes, Garden, yamux or
// Prometheus package (deps_test.go checks it).
package client

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jetway-ci/jetway/wire"
)

// Errors an API answer maps to; an *APIError wraps one of them.
var (
	ErrBadRequest   = errors.New("bad request")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	// ErrGone: what was asked for went with a released step's pod (the
	// events of its log).
	ErrGone          = errors.New("gone")
	ErrUnprocessable = errors.New("unprocessable")
	ErrUnavailable   = errors.New("unavailable")
)

// APIError is an answer other than success: its status, the message the
// gateway gave, and for a bad request the field it names.
type APIError struct {
	StatusCode int
	Message    string
	Field      string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("jetway: %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Unwrap maps the status to one of the Err values.
func (e *APIError) Unwrap() error {
	switch e.StatusCode {
	case http.StatusBadRequest:
		return ErrBadRequest
	case http.StatusUnauthorized:
		return ErrUnauthorized
	case http.StatusForbidden:
		return ErrForbidden
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusConflict:
		return ErrConflict
	case http.StatusGone:
		return ErrGone
	case http.StatusUnprocessableEntity:
		return ErrUnprocessable
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return ErrUnavailable
	}
	return nil
}

// StepError is a step that ended without succeeding: failed (its exit
// status), errored or aborted (the reason).
type StepError struct {
	Handle     string
	Phase      wire.Phase
	ExitStatus *int
	Reason     string
	Message    string
}

// NoTargetError is a step no target could run (its team, tags or
// platform), aborted by Run.
type NoTargetError struct {
	Handle  string
	Message string // the gateway's: what the step asks of a target
}

func (e *NoTargetError) Error() string { return "step " + e.Handle + ": " + e.Message }

func (e *StepError) Error() string {
	msg := fmt.Sprintf("step %s %s", e.Handle, e.Phase)
	if e.ExitStatus != nil {
		msg += fmt.Sprintf(" with exit status %d", *e.ExitStatus)
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Options configure a Client.
type Options struct {
	// URL is the gateway's, say https://jetway.example.com.
	URL string
	// Token is a bearer token of the gateway's tokens file.
	Token string
	// HTTPClient carries the calls; default a client without a timeout
	// (event streams are long), whose calls end with their contexts.
	HTTPClient *http.Client
	// Retry is the first pause before following events again after a
	// dropped connection; it doubles to 5 s. Default 100 ms.
	Retry time.Duration
	// WaitForTarget makes Run (and the Orchestrator's calls) wait for a
	// target to appear when none fits a step; by default they abort the
	// step and return a *NoTargetError, as Concourse fails a step no
	// worker satisfies.
	WaitForTarget bool
	// Downloads bounds what one downloaded output may write (zero fields:
	// the defaults, 32 GiB and 1,048,576 entries).
	Downloads Limits
}

// Client calls one gateway. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
	retry time.Duration
	wait  bool
	limit Limits
}

// New checks the options and builds a Client; it does not dial.
func New(opts Options) (*Client, error) {
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: URL %q is not an http(s) URL", opts.URL)
	}
	c := &Client{base: u, token: opts.Token, http: opts.HTTPClient, retry: opts.Retry, wait: opts.WaitForTarget, limit: opts.Downloads}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.retry <= 0 {
		c.retry = 100 * time.Millisecond
	}
	return c, nil
}

// do sends one request, with body as JSON or, an io.Reader, as it is; a
// non-2xx answer is an *APIError. The caller closes the body of the
// response it gets.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any) (*http.Response, error) {
	var rd io.Reader
	contentType := "application/json"
	switch b := body.(type) {
	case nil:
	case io.Reader:
		rd, contentType = b, "application/octet-stream"
	default:
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(raw)
	}
	u := c.base.JoinPath(path)
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jetway: %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, apiError(resp)
	}
	return resp, nil
}

func apiError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Error  string `json:"error"`
		Stderr string `json:"stderr"`
		Field  string `json:"field"`
	}
	_ = json.Unmarshal(raw, &body)
	msg := body.Error
	if msg == "" {
		msg = body.Stderr
	}
	return &APIError{StatusCode: resp.StatusCode, Message: msg, Field: body.Field}
}

// call sends a request and decodes a JSON answer into out (nil: none).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, body, out any) error {
	resp, err := c.do(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("jetway: %s %s: answer: %w", method, path, err)
	}
	return nil
}

// Workers lists the workers the token sees, as fly does.
func (c *Client) Workers(ctx context.Context) ([]wire.Worker, error) {
	var out []wire.Worker
	return out, c.call(ctx, http.MethodGet, "/api/v1/workers", nil, nil, &out)
}

// Land lands a worker: it takes no new steps and lands once its running
// steps end.
func (c *Client) Land(ctx context.Context, worker string) error {
	return c.call(ctx, http.MethodPut, "/api/v1/workers/"+url.PathEscape(worker)+"/land", nil, nil, nil)
}

// Retire retires a worker: it lands, then its step pods go and it is
// forgotten.
func (c *Client) Retire(ctx context.Context, worker string) error {
	return c.call(ctx, http.MethodPut, "/api/v1/workers/"+url.PathEscape(worker)+"/retire", nil, nil, nil)
}

// Prune forgets a worker that is not running.
func (c *Client) Prune(ctx context.Context, worker string) error {
	return c.call(ctx, http.MethodPut, "/api/v1/workers/"+url.PathEscape(worker)+"/prune", nil, nil, nil)
}

// Stream copies a volume path between step pods, across clusters too.
func (c *Client) Stream(ctx context.Context, req wire.StreamRequest) (wire.StreamResult, error) {
	var out wire.StreamResult
	return out, c.call(ctx, http.MethodPost, "/api/v1/streams", nil, req, &out)
}

func teamQuery(team string) url.Values {
	q := url.Values{}
	if team != "" {
		q.Set("team", team)
	}
	return q
}

// SubmitStep submits a step; created is false when the team already had
// the handle (the existing step is returned, nothing new runs).
//
// A gateway that is starting answers 503 until it has found its steps;
// the submission is tried again then (it is idempotent), until ctx ends.
func (c *Client) SubmitStep(ctx context.Context, req wire.Request) (v wire.View, created bool, err error) {
	resp, err := c.do(ctx, http.MethodPost, "/api/v1/steps", nil, req)
	for pause := c.retry; errors.Is(err, ErrUnavailable); pause = min(2*pause, 5*time.Second) {
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, false, ctx.Err()
		case <-t.C:
		}
		resp, err = c.do(ctx, http.MethodPost, "/api/v1/steps", nil, req)
	}
	if err != nil {
		return v, false, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, false, fmt.Errorf("jetway: submit step %s: answer: %w", req.Handle, err)
	}
	return v, resp.StatusCode == http.StatusAccepted, nil
}

// Step reads a step; team names it for an admin token ("" for a team
// token, or an admin's team-less step).
func (c *Client) Step(ctx context.Context, team, handle string) (wire.View, error) {
	var v wire.View
	return v, c.call(ctx, http.MethodGet, "/api/v1/steps/"+url.PathEscape(handle), teamQuery(team), nil, &v)
}

// Abort kills the step's process and releases its pod.
func (c *Client) Abort(ctx context.Context, team, handle string) (wire.View, error) {
	var v wire.View
	return v, c.call(ctx, http.MethodDelete, "/api/v1/steps/"+url.PathEscape(handle), teamQuery(team), nil, &v)
}

// Follow calls fn with each of the step's events from since on, in
// order, until the step's last event, ctx ends or fn fails. A dropped
// connection, or a gateway that restarts, is asked again from the event
// after the last delivered: none is lost or repeated. Answers that say
// the step cannot be followed (not found, forbidden) end it at once.
func (c *Client) Follow(ctx context.Context, team, handle string, since int, fn func(wire.Event) error) error {
	pause := c.retry
	for {
		next, done, err := c.follow(ctx, team, handle, since, fn)
		if done {
			return err
		}
		if next > since {
			since, pause = next, c.retry
		}
		var apiErr *APIError
		if ctx.Err() != nil || errors.As(err, &apiErr) && apiErr.StatusCode != http.StatusServiceUnavailable {
			return cmp.Or(ctx.Err(), err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// follow reads one events answer. It returns the number of the next
// event wanted, and done when the step's last event was delivered or fn
// failed (err is fn's).
func (c *Client) follow(ctx context.Context, team, handle string, since int, fn func(wire.Event) error) (int, bool, error) {
	q := teamQuery(team)
	q.Set("since", strconv.Itoa(since))
	resp, err := c.do(ctx, http.MethodGet, "/api/v1/steps/"+url.PathEscape(handle)+"/events", q, nil)
	if err != nil {
		return since, false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e wire.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return since, false, fmt.Errorf("jetway: events of %s: %w", handle, err)
		}
		if e.N < since {
			continue // already delivered
		}
		if err := fn(e); err != nil {
			return e.N + 1, true, err
		}
		since = e.N + 1
		if e.Type == wire.EventExited || e.Type == wire.EventFailed {
			return since, true, nil
		}
	}
	return since, false, cmp.Or(sc.Err(), fmt.Errorf("jetway: events of %s ended before the step did", handle))
}

// Run submits a step (or takes the team's existing one of that handle),
// follows its events into onEvent (nil: none) and returns its final view;
// a step that did not succeed is a *StepError.
func (c *Client) Run(ctx context.Context, req wire.Request, onEvent func(wire.Event)) (wire.View, error) {
	v, _, err := c.SubmitStep(ctx, req)
	if err != nil {
		return v, err
	}
	var noTarget *NoTargetError
	err = c.Follow(ctx, v.Team, v.Handle, 0, func(e wire.Event) error {
		if onEvent != nil {
			onEvent(e)
		}
		if e.Type != wire.EventWaiting || e.Reason != wire.ReasonNoTargetFits || c.wait {
			return nil
		}
		// Only if it still waits for that: a replayed event of a step
		// placed since is history.
		if cur, err := c.Step(ctx, v.Team, v.Handle); err == nil && cur.Phase == wire.Pending && cur.Waiting == e.Message {
			noTarget = &NoTargetError{Handle: v.Handle, Message: e.Message}
			return noTarget
		}
		return nil
	})
	if noTarget != nil {
		if _, err := c.Abort(ctx, v.Team, v.Handle); err != nil {
			return v, fmt.Errorf("%w (and aborting it: %v)", noTarget, err)
		}
		return v, noTarget
	}
	if err != nil {
		return v, err
	}
	if v, err = c.Step(ctx, v.Team, v.Handle); err != nil {
		return v, err
	}
	if v.Phase != wire.Succeeded {
		return v, &StepError{Handle: v.Handle, Phase: v.Phase, ExitStatus: v.ExitStatus, Reason: v.Reason, Message: v.Message}
	}
	return v, nil
}
