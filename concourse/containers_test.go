package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"code.cloudfoundry.org/garden"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/steppod"
	"github.com/jetway-ci/jetway/streams"
	"github.com/jetway-ci/jetway/wire"
)

func TestDockerImages(t *testing.T) {
	for rootfs, want := range map[string]string{
		"docker:///busybox#1.36":                    "busybox:1.36",
		"docker:///busybox":                         "busybox",
		"docker:///library/busybox#latest":          "library/busybox:latest",
		"docker://registry.example:5000/team/app#v": "registry.example:5000/team/app:v",
	} {
		_, rest, _ := strings.Cut(rootfs, "://")
		got, err := dockerImage(rootfs, rest)
		require.NoError(t, err, rootfs)
		assert.Equal(t, want, got, rootfs)
	}
	_, err := dockerImage("docker:///#tag", "/#tag")
	assert.ErrorContains(t, err, "names no repository")
}

func TestContainerLimitsAreResources(t *testing.T) {
	assert.Equal(t, wire.Resources{}, resources(garden.Limits{}), "no limit: the target's defaults")
	assert.Equal(t, wire.Resources{CPU: "500m", Memory: "104857600"},
		resources(garden.Limits{CPU: garden.CPULimits{LimitInShares: 512}, Memory: garden.MemoryLimits{LimitInBytes: 100 << 20}}))
	assert.Equal(t, wire.Resources{CPU: "1000m"}, resources(garden.Limits{CPU: garden.CPULimits{Weight: 1024}}), "1024 shares: a core")
	assert.Equal(t, wire.Resources{CPU: "1m"}, resources(garden.Limits{CPU: garden.CPULimits{Weight: 1}}), "never zero")
}

func TestBindMountsAreFoldersOfThePodVolume(t *testing.T) {
	got, err := podMounts([]garden.BindMount{
		{SrcPath: "/v/a", DstPath: "/tmp/build/x", Mode: garden.BindMountModeRW},
		{SrcPath: "/v/b", DstPath: "/tmp/build/x/in/", Mode: garden.BindMountModeRO},
	})
	require.NoError(t, err)
	assert.Equal(t, []steppod.Mount{{Path: "/tmp/build/x", Volume: "m0"}, {Path: "/tmp/build/x/in", Volume: "m1", ReadOnly: true}}, got,
		"in order, so a nested mount follows its parent")
	for _, dst := range []string{"", "relative", "/", "/.."} {
		_, err := podMounts([]garden.BindMount{{SrcPath: "/v/a", DstPath: dst}})
		assert.ErrorContains(t, err, "is not an absolute path below /", dst)
	}
}

// Garden's client rebuilds an error from its type: an unknown container
// must come back as ContainerNotFoundError (the web node then makes it
// anew), wrapped or not.
func TestGardenErrorsKeepTheirType(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		typ  string
	}{
		{garden.ContainerNotFoundError{Handle: "h"}, http.StatusNotFound, "ContainerNotFoundError"},
		{errors.Join(errors.New("context"), garden.ContainerNotFoundError{Handle: "h"}), http.StatusNotFound, "ContainerNotFoundError"},
		{garden.ProcessNotFoundError{ProcessID: "task"}, http.StatusNotFound, "ProcessNotFoundError"},
		{errors.New("plain"), http.StatusInternalServerError, ""},
	} {
		rec := httptest.NewRecorder()
		gardenError(rec, tc.err)
		assert.Equal(t, tc.code, rec.Code, tc.err.Error())
		var got garden.Error
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
		var body struct{ Type string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
		assert.Equal(t, tc.typ, body.Type, tc.err.Error())
	}
}

func TestGardenRefusesBadRequests(t *testing.T) {
	h := gardenAPI("t", none{}, &Containers{}, nil)
	for _, tc := range []struct{ method, path, body, want string }{
		{http.MethodPost, "/containers", "{not json", "is not the JSON of Garden's POST /containers"},
		{http.MethodPost, "/containers", `{"handle":"` + strings.Repeat("a", maxContainerSpec) + `"}`, "is over 1048576 bytes"},
		{http.MethodPut, "/containers/h/net/in", "{}", "jetway's workers do not serve Garden's PUT /containers/h/net/in"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
		var body struct{ Message string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
		assert.Contains(t, body.Message, tc.want)
	}
	// Without a state namespace: the list answers, the rest is refused.
	h = gardenAPI("t", none{}, nil, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/containers", nil))
	assert.JSONEq(t, `{"Handles":[]}`, rec.Body.String())
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/containers", strings.NewReader("{}")))
	assert.Contains(t, rec.Body.String(), "without a state namespace")
}

// TestDrainWaitsForFollowedProcesses: Drain returns once no process the
// web node follows is left, or when its context ends, saying how many
// are left then.
func TestDrainWaitsForFollowedProcesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Containers
		assert.Equal(t, 0, c.Drain(t.Context()), "none followed: at once")
		doneA, doneB := c.following(), c.following()
		assert.Equal(t, 2, c.Following())
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		assert.Equal(t, 2, c.Drain(ctx), "bounded by its context")
		cancel()

		left := make(chan int, 1)
		go func() { left <- c.Drain(t.Context()) }()
		doneA()
		doneA() // once only
		synctest.Wait()
		assert.Empty(t, left, "one is still followed")
		doneB()
		assert.Equal(t, 0, <-left)
	})
}

// A move the volume server refused for good (a holder past its capacity:
// 507; an entry its extractor refuses: 400; a file the sidecar may not
// read: 422) fails at once, naming why, logged once as a warning; one
// that found no server yet (a pod's sidecar a moment before it listens)
// is tried again.
func TestMovesStopAtAFinalAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		final := func(code int, status, msg string) error {
			return &streams.Error{Side: streams.SideDestination, Err: fmt.Errorf("stream-in holder/v: %w",
				&streams.RemoteError{Code: code, Status: status, Message: msg})}
		}
		for name, tt := range map[string]struct {
			errs  []error
			calls int
			err   string
		}{
			"full":               {[]error{final(http.StatusInsufficientStorage, "507 Insufficient Storage", "the volumes are past their capacity"), nil}, 1, "507 Insufficient Storage: the volumes are past their capacity"},
			"refused":            {[]error{final(http.StatusBadRequest, "400 Bad Request", `stream-in: tar entry "f": a FIFO, and this folder takes no devices or FIFOs`), nil}, 1, `tar entry "f": a FIFO`},
			"unreadable":         {[]error{final(http.StatusUnprocessableEntity, "422 Unprocessable Entity", `volume m0: tar entry "d700": openat: permission denied`), nil}, 1, `tar entry "d700": openat: permission denied`},
			"not listening yet":  {[]error{errors.New("connection refused"), errors.New("connection refused"), nil}, 3, ""},
			"no such volume yet": {[]error{&streams.RemoteError{Code: http.StatusNotFound, Status: "404 Not Found"}, nil}, 2, ""},
		} {
			calls := 0
			var logs bytes.Buffer
			c := &Holder{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				Stream: func(context.Context, streams.Request) (wire.StreamResult, error) {
					calls++
					return wire.StreamResult{}, tt.errs[calls-1]
				}}
			_, err := c.streamRetrying(context.Background(), streams.Request{})
			assert.Equal(t, tt.calls, calls, name)
			failed := strings.Count(logs.String(), `"msg":"volume move failed"`)
			assert.Equal(t, tt.calls-1+min(len(tt.err), 1), failed, "%s: each failure logged: %s", name, logs.String())
			if tt.err == "" {
				assert.NoError(t, err, name)
				assert.NotContains(t, logs.String(), `"level":"WARN"`, name)
			} else {
				assert.ErrorContains(t, err, tt.err, name)
				assert.Contains(t, logs.String(), `"level":"WARN","msg":"volume move failed"`, name)
			}
		}
	})
}

// A check's container is told by what the web node mounts in it: its
// scratch volume and, on a worker with certificates, those, where a
// get's, a put's and a task's have a working directory too.
func TestIsCheck(t *testing.T) {
	mounts := func(dst ...string) garden.ContainerSpec {
		var spec garden.ContainerSpec
		for _, d := range dst {
			spec.BindMounts = append(spec.BindMounts, garden.BindMount{DstPath: d})
		}
		return spec
	}
	assert.True(t, isCheck(mounts("/scratch")))
	assert.True(t, isCheck(mounts("/scratch/", "/etc/ssl/certs")))
	assert.False(t, isCheck(mounts("/scratch", "/tmp/build/get")))
	assert.False(t, isCheck(mounts("/scratch", "/etc/ssl/certs", "/tmp/build/get")))
	assert.False(t, isCheck(mounts("/scratch", "/tmp/build/put", "/tmp/build/put/src")))
	assert.False(t, isCheck(mounts("/scratch", "/tmp/build/5a3c1e2f", "/tmp/build/5a3c1e2f/check")))
	assert.False(t, isCheck(mounts()))
}
