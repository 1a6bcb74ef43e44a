package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetway-ci/jetway/api"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/steps/stepstest"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var tokens = []api.Token{
	{Name: "ops", Token: "admin-token-0123456789", Admin: true},
	{Name: "main-ci", Token: "main-token-0123456789", Team: "main"},
}

// scripted is a step API whose one step, "s", has the given events and
// ends in view; its inputs are unpacked into, and its outputs packed
// from, dir/<name>.
type scripted struct {
	events []wire.Event
	view   wire.View
	dir    string
	aborts int
}

func (s *scripted) Upload(_ context.Context, _ streams.Caller, _, _, input, encoding string, body io.Reader) (wire.InputDigest, error) {
	if encoding != "gzip" {
		return wire.InputDigest{}, fmt.Errorf("encoding %q", encoding)
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return wire.InputDigest{}, err
	}
	_, err = Untar(bytes.NewReader(data), filepath.Join(s.dir, input))
	return wire.InputDigest{Name: input, Bytes: int64(len(data))}, err
}
func (s *scripted) Download(_ context.Context, _ streams.Caller, _, _, output, _ string) (io.ReadCloser, error) {
	dir := filepath.Join(s.dir, output)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("%w: no output %s", wire.ErrNotFound, output)
	}
	return TarDir(dir), nil
}

func (s *scripted) Submit(streams.Caller, wire.Request) (wire.View, bool, error) {
	return s.view, true, nil
}
func (s *scripted) Get(_ streams.Caller, _, handle string) (wire.View, error) {
	if handle != s.view.Handle {
		return wire.View{}, wire.ErrNotFound
	}
	return s.view, nil
}
func (s *scripted) Readable(c streams.Caller, team, handle string, _ int) error {
	_, err := s.Get(c, team, handle)
	return err
}
func (s *scripted) Abort(context.Context, streams.Caller, string, string) (wire.View, error) {
	s.aborts++
	return s.view, nil
}
func (s *scripted) Events(ctx context.Context, _ streams.Caller, _, _ string, since int, send func([]wire.Event) error) error {
	for _, e := range s.events[since:] {
		if err := send([]wire.Event{e}); err != nil {
			return err
		}
	}
	return nil
}

// cutting drops the connection of the first cuts events answers after
// every lines lines, as a gateway restart or a network blip would, and
// records the since each answer was asked from.
type cutting struct {
	next        http.Handler
	every, cuts int

	mu     sync.Mutex
	sinces []string
}

func (c *cutting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/events") {
		c.next.ServeHTTP(w, r)
		return
	}
	c.mu.Lock()
	c.sinces = append(c.sinces, r.URL.Query().Get("since"))
	cut := len(c.sinces) <= c.cuts
	c.mu.Unlock()
	if !cut {
		c.next.ServeHTTP(w, r)
		return
	}
	c.next.ServeHTTP(&cutWriter{ResponseWriter: w, left: c.every}, r)
}

type cutWriter struct {
	http.ResponseWriter
	left int
}

func (w *cutWriter) Write(p []byte) (int, error) {
	if w.left == 0 {
		panic(http.ErrAbortHandler) // the connection drops mid-answer
	}
	w.left -= strings.Count(string(p), "\n")
	return w.ResponseWriter.Write(p)
}

func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func serve(t *testing.T, st api.Steps, wrap func(http.Handler) http.Handler) *Client {
	t.Helper()
	h := api.New(api.Options{Gatherer: prometheus.NewRegistry(), Steps: st, Tokens: tokens}).Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(Options{URL: srv.URL, Token: tokens[0].Token, Retry: time.Millisecond})
	require.NoError(t, err)
	return c
}

func lines(n int) []wire.Event {
	var evs []wire.Event
	for i := range n - 1 {
		evs = append(evs, wire.Event{N: i, Type: wire.EventStdout, Data: fmt.Sprintf("line %d\n", i)})
	}
	code := 42
	return append(evs, wire.Event{N: n - 1, Type: wire.EventExited, Phase: wire.Failed, ExitStatus: &code})
}

func TestFollowAcrossDroppedConnections(t *testing.T) {
	st := &scripted{events: lines(10), view: wire.View{Handle: "s", Phase: wire.Failed}}
	cut := &cutting{every: 3, cuts: 2}
	c := serve(t, st, func(h http.Handler) http.Handler { cut.next = h; return cut })
	var got []int
	require.NoError(t, c.Follow(context.Background(), "", "s", 0, func(e wire.Event) error {
		got = append(got, e.N)
		return nil
	}))
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, got, "every event once, in order")
	assert.Equal(t, []string{"0", "3", "6"}, cut.sinces, "each reconnect asks from the next event")
}

func TestRunReturnsTheStepsFailure(t *testing.T) {
	code := 42
	st := &scripted{events: lines(4), view: wire.View{Handle: "s", Phase: wire.Failed, ExitStatus: &code}}
	c := serve(t, st, nil)
	var out strings.Builder
	_, err := c.Run(context.Background(), wire.Request{Handle: "s"}, func(e wire.Event) { out.WriteString(e.Data) })
	var se *StepError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, wire.Failed, se.Phase)
	assert.Equal(t, 42, *se.ExitStatus)
	assert.EqualError(t, err, "step s failed with exit status 42")
	assert.Equal(t, "line 0\nline 1\nline 2\n", out.String())
}

// noTargets is a registry without targets: steps wait.
type noTargets struct{}

func (noTargets) Loaded() bool                           { return true }
func (noTargets) Snapshot() []targets.Status             { return nil }
func (noTargets) Target(string) (*targets.Target, error) { return nil, targets.ErrNotFound }
func (noTargets) Changed() <-chan struct{}               { return nil }

func TestErrorsAreTyped(t *testing.T) {
	m := stepstest.Start(t, steps.Options{Registry: noTargets{}}).Manager
	ctx := context.Background()
	c := serve(t, m, nil)
	require.Eventually(t, func() bool {
		_, err := c.Step(ctx, "", "none")
		return !errors.Is(err, ErrUnavailable)
	}, time.Second, time.Millisecond)

	_, _, err := c.SubmitStep(ctx, wire.Request{Handle: "x", Type: "task", Image: "i"})
	var apiErr *APIError
	require.ErrorAs(t, err, &apiErr)
	assert.ErrorIs(t, err, ErrBadRequest)
	assert.Equal(t, "run.path", apiErr.Field)

	_, err = c.Step(ctx, "", "nope")
	assert.ErrorIs(t, err, ErrNotFound)

	req := wire.Request{Handle: "x", Type: "task", Team: "main", Image: "i", Run: wire.Run{Path: "true"}}
	v, created, err := c.SubmitStep(ctx, req)
	require.NoError(t, err)
	assert.True(t, created)
	_, created, err = c.SubmitStep(ctx, req)
	require.NoError(t, err)
	assert.False(t, created, "the same handle: the existing step")

	team, err := New(Options{URL: c.base.String(), Token: tokens[1].Token})
	require.NoError(t, err)
	_, _, err = team.SubmitStep(ctx, wire.Request{Handle: "y", Type: "task", Team: "other", Image: "i", Run: wire.Run{Path: "true"}})
	assert.ErrorIs(t, err, ErrForbidden)

	// A step that waits: Follow returns when ctx ends; Abort ends it.
	fctx, fcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer fcancel()
	err = c.Follow(fctx, v.Team, v.Handle, 0, func(wire.Event) error { return nil })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	v, err = c.Abort(ctx, "main", "x")
	require.NoError(t, err)
	assert.Equal(t, wire.Aborted, v.Phase)
	_, err = c.Run(ctx, req, nil)
	var se *StepError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, wire.Aborted, se.Phase)
}

func TestNewRefusesABadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://"} {
		_, err := New(Options{URL: u})
		assert.Error(t, err, u)
	}
}

func TestResourceAnswersAreDecoded(t *testing.T) {
	st := &scripted{events: []wire.Event{{N: 0, Type: wire.EventExited, Phase: wire.Succeeded}},
		view: wire.View{Handle: "s", Phase: wire.Succeeded, Result: json.RawMessage(`{"version":{"ref":"b"},"metadata":[{"name":"a","value":"1"}]}`),
			Outputs: []wire.Volume{{Name: "resource", Target: "east", Pod: "p", Handle: "output-resource"}}}}
	c := serve(t, st, nil)
	f, err := c.GetResource(context.Background(), ResourceStep{Handle: "s", Image: "git", Source: map[string]string{"uri": "x"}})
	require.NoError(t, err)
	assert.Equal(t, Version{"ref": "b"}, f.Version)
	assert.Equal(t, []MetadataField{{Name: "a", Value: "1"}}, f.Metadata)
	assert.Equal(t, "output-resource", f.Output.Handle)

	st.view.Result = json.RawMessage(`[{"ref":"a"}]`)
	versions, err := c.CheckResource(context.Background(), ResourceStep{Handle: "s", Image: "git", Source: map[string]string{}})
	require.NoError(t, err)
	assert.Equal(t, []Version{{"ref": "a"}}, versions)

	_, err = c.CheckResource(context.Background(), ResourceStep{Handle: "s", Source: func() {}})
	assert.ErrorContains(t, err, "source", "a source JSON cannot carry is refused before any call")
}

func TestRunAbortsAStepNoTargetFits(t *testing.T) {
	why := "no target satisfies team 'main', tags 'gpu'"
	st := &scripted{events: []wire.Event{{N: 0, Type: wire.EventWaiting, Reason: wire.ReasonNoTargetFits, Message: why}},
		view: wire.View{Handle: "s", Phase: wire.Pending, Waiting: why}}
	c := serve(t, st, nil)
	_, err := c.Run(context.Background(), wire.Request{Handle: "s"}, nil)
	var nt *NoTargetError
	require.ErrorAs(t, err, &nt)
	assert.Equal(t, why, nt.Message)
	assert.Equal(t, 1, st.aborts, "the step is aborted, not left waiting")

	st = &scripted{events: []wire.Event{{N: 0, Type: wire.EventWaiting, Reason: wire.ReasonTargetsAtLimit, Message: "every compatible target is at a limit"},
		{N: 1, Type: wire.EventExited, Phase: wire.Succeeded}}, view: wire.View{Handle: "s", Phase: wire.Succeeded}}
	c = serve(t, st, nil)
	_, err = c.Run(context.Background(), wire.Request{Handle: "s"}, nil)
	require.NoError(t, err, "a step waiting for room is waited for")
	assert.Zero(t, st.aborts)
}
