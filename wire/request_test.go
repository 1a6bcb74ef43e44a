package wire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

func TestValidateFillsPaths(t *testing.T) {
	r := validRequest()
	r.Inputs = []Input{{Name: "src", From: InputSource{Target: "a", Pod: "p", Handle: "h"}}}
	r.Outputs = []Output{{Name: "out"}}
	require.Nil(t, r.Validate())
	assert.Equal(t, "src", r.Inputs[0].Path)
	assert.Equal(t, "out", r.Outputs[0].Path)
}

func TestResourceStepsNeedAResource(t *testing.T) {
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
}
