package steps

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func validRequest() Request {
	return Request{Handle: "build-1", Type: "task", Image: "busybox", Run: Run{Path: "sh", Args: []string{"-c", "true"}}}
}

func TestValidateNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		change func(r *Request)
		field  string
	}{
		{"no handle", func(r *Request) { r.Handle = "" }, "handle"},
		{"handle with capitals", func(r *Request) { r.Handle = "Build" }, "handle"},
		{"handle too long", func(r *Request) { r.Handle = strings.Repeat("a", 64) }, "handle"},
		{"no type", func(r *Request) { r.Type = "" }, "type"},
		{"unknown type", func(r *Request) { r.Type = "deploy" }, "type"},
		{"empty tag", func(r *Request) { r.Tags = []string{"a", " "} }, "tags[1]"},
		{"no image", func(r *Request) { r.Image = "" }, "image"},
		{"no image for linux", func(r *Request) { r.Image, r.Platform = "", "linux" }, "image"},
		{"a get without image, for darwin", func(r *Request) { r.Image, r.Platform, r.Type = "", "darwin", "get" }, "image"},
		{"no path", func(r *Request) { r.Run.Path = "" }, "run.path"},
		{"absolute dir", func(r *Request) { r.Run.Dir = "/src" }, "run.dir"},
		{"dir escapes", func(r *Request) { r.Run.Dir = "../x" }, "run.dir"},
		{"bad env name", func(r *Request) { r.Run.Env = map[string]string{"A-B": "1"} }, "run.env"},
		{"input without source", func(r *Request) { r.Inputs = []Input{{Name: "src"}} }, "inputs[0].from"},
		{"input with both sources", func(r *Request) {
			r.Inputs = []Input{{Name: "src", From: InputSource{Target: "a", Pod: "p", Handle: "h", Step: "s", Output: "o"}}}
		}, "inputs[0].from"},
		{"input step without output", func(r *Request) { r.Inputs = []Input{{Name: "src", From: InputSource{Step: "s"}}} }, "inputs[0].from"},
		{"bad input name", func(r *Request) {
			r.Inputs = []Input{{Name: "Src", From: InputSource{Step: "s", Output: "o"}}}
		}, "inputs[0].name"},
		{"output path escapes", func(r *Request) { r.Outputs = []Output{{Name: "out", Path: "../out"}} }, "outputs[0].path"},
		{"output is the build dir", func(r *Request) { r.Outputs = []Output{{Name: "out", Path: "."}} }, "outputs[0].path"},
		{"duplicate name", func(r *Request) {
			r.Inputs = []Input{{Name: "x", From: InputSource{Step: "s", Output: "o"}}}
			r.Outputs = []Output{{Name: "x", Path: "y"}}
		}, "outputs[0].name"},
		{"overlapping paths", func(r *Request) {
			r.Inputs = []Input{{Name: "src", From: InputSource{Step: "s", Output: "o"}}}
			r.Outputs = []Output{{Name: "out", Path: "src/out"}}
		}, "outputs[0].path"},
		{"bad cpu", func(r *Request) { r.Resources.CPU = "lots" }, "resources.cpu"},
		{"zero memory", func(r *Request) { r.Resources.Memory = "0" }, "resources.memory"},
		{"bad timeout", func(r *Request) { r.Timeout = "soon" }, "timeout"},
		{"negative timeout", func(r *Request) { r.Timeout = "-1s" }, "timeout"},
		{"a privileged check in a sandbox", func(r *Request) { r.Type, r.ReuseKey, r.Privileged = "check", "k", true }, "reuse_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRequest()
			tt.change(&r)
			err := r.Validate()
			require.NotNil(t, err)
			assert.Equal(t, tt.field, err.Field, err.Error())
		})
	}
}

// A task for a platform other than linux runs on an agent, as a process
// on its machine: it needs no image.
func TestATaskForAnotherPlatformNeedsNoImage(t *testing.T) {
	r := validRequest()
	r.Image, r.Platform = "", "darwin"
	assert.Nil(t, r.Validate())
}

func TestValidateFillsPathsAndBuildsTheSpec(t *testing.T) {
	r := validRequest()
	r.Run.Env = map[string]string{"B": "2", "A": "1"}
	r.Timeout = "90s"
	r.Stdin = "hello"
	r.Inputs = []Input{{Name: "src", From: InputSource{Target: "a", Pod: "p", Handle: "h"}}}
	r.Outputs = []Output{{Name: "out", Path: "build/out"}}
	require.Nil(t, r.Validate())
	assert.Equal(t, "src", r.Inputs[0].Path)
	sp := r.Spec()
	assert.Equal(t, []string{"A=1", "B=2"}, sp.Env, "sorted, so the same request gives the same spec")
	assert.Equal(t, 90*time.Second, time.Duration(sp.Timeout))
	assert.Equal(t, []byte("hello"), sp.Stdin)
	require.Len(t, sp.Volumes, 2)
	assert.Equal(t, "input-src", sp.Volumes[0].Handle)
	assert.Equal(t, "src", sp.Volumes[0].Path)
	assert.Equal(t, "output-out", sp.Volumes[1].Handle)
	assert.Equal(t, "build/out", sp.Volumes[1].Path)
}

func TestResourceStepsRunTheScripts(t *testing.T) {
	res := func(typ string) Request {
		return Request{Handle: "r", Type: typ, Image: "git-resource", Resource: &Resource{Source: json.RawMessage(`{"uri":"x"}`)}}
	}
	for _, tt := range []struct {
		name   string
		req    Request
		change func(r *Request)
		field  string
	}{
		{"get without resource", Request{Handle: "r", Type: "get", Image: "i"}, func(*Request) {}, "resource"},
		{"task with resource", res("task"), func(r *Request) { r.Run.Path = "p" }, "resource"},
		{"resource and run", res("check"), func(r *Request) { r.Run.Path = "/bin/sh" }, "run"},
		{"resource and stdin", res("check"), func(r *Request) { r.Stdin = "x" }, "stdin"},
		{"source not an object", res("check"), func(r *Request) { r.Resource.Source = json.RawMessage(`"x"`) }, "resource.source"},
		{"get with two outputs", res("get"), func(r *Request) { r.Outputs = []Output{{Name: "a"}, {Name: "b"}} }, "outputs"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.change(&tt.req)
			err := tt.req.Validate()
			require.NotNil(t, err)
			assert.Equal(t, tt.field, err.Field, err.Error())
		})
	}

	get := res("get")
	get.Resource.Version = json.RawMessage(`{"ref":"b"}`)
	require.Nil(t, get.Validate())
	get.resourceRun("/opt/resource")
	assert.Equal(t, "/opt/resource/in", get.Run.Path)
	assert.Equal(t, []string{"resource"}, get.Run.Args)
	assert.Equal(t, []Output{{Name: "resource", Path: "resource"}}, get.Outputs)
	assert.JSONEq(t, `{"source":{"uri":"x"},"version":{"ref":"b"},"params":{}}`, get.Stdin)
	put := res("put")
	put.resourceRun("/opt/resource")
	assert.Equal(t, []string{"."}, put.Run.Args, "out gets the build dir holding the inputs")
	assert.JSONEq(t, `{"source":{"uri":"x"},"params":{}}`, put.Stdin)
}

func TestResourceAnswers(t *testing.T) {
	for _, tt := range []struct {
		typ, out, err string
	}{
		{"check", `[{"ref":"a"}]`, ""},
		{"check", `[]`, ""},
		{"check", `{"ref":"a"}`, `check printed "{\"ref\":\"a\"}", not a JSON array of versions`},
		{"get", `{"version":{"ref":"a"},"metadata":[{"name":"n","value":"v"}]}`, ""},
		{"get", `{"metadata":[]}`, `in printed "{\"metadata\":[]}", not {"version": {...}, "metadata": [...]}`},
		{"put", "", `out printed "", not {"version": {...}, "metadata": [...]}`},
		{"put", strings.Repeat("x", 300), `out printed "` + strings.Repeat("x", 200) + `", not {"version": {...}, "metadata": [...]}`},
	} {
		_, err := resourceResult(tt.typ, []byte(tt.out))
		if tt.err == "" {
			assert.NoError(t, err, tt.out)
		} else {
			assert.EqualError(t, err, tt.err)
		}
	}
}
