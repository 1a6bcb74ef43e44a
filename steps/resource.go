package steps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"

	"github.com/jetway-ci/jetway/selection"
)

// Resource makes a check, get or put step run Concourse's resource
// protocol: the resource image's scripts (check, in, out under the
// gateway's resource-dir, /opt/resource by default) with this JSON on
// stdin. The script's stdout is the step's result, its stderr the log.
type Resource struct {
	Source  json.RawMessage `json:"source"`
	Version json.RawMessage `json:"version,omitempty"` // check and get
	Params  json.RawMessage `json:"params,omitempty"`  // get and put
}

// DefaultResourceDir is where resource images keep their scripts.
const DefaultResourceDir = "/opt/resource"

// resourceOutput is the output a get step's script fills, unless the
// step names one.
const resourceOutput = "resource"

// resultLimit bounds a resource script's stdout, its answer.
const resultLimit = 4 << 20

// checkResource validates the resource of a check, get or put step, which
// runs the resource's script instead of run.
func (r *Request) checkResource() *FieldError {
	isResource := r.Type == selection.StepCheck || r.Type == selection.StepGet || r.Type == selection.StepPut
	switch {
	case r.Resource == nil && isResource:
		return fieldErr("resource", "required for a %s step: {source, version, params}", r.Type)
	case r.Resource == nil:
		return nil
	case !isResource:
		return fieldErr("resource", "only check, get and put steps run a resource")
	case r.Run.Path != "" || len(r.Run.Args) > 0:
		return fieldErr("run", "a %s step runs its resource's script; give no run.path or run.args", r.Type)
	case r.Stdin != "":
		return fieldErr("stdin", "a %s step's stdin is its resource's JSON", r.Type)
	case len(bytes.TrimSpace(r.Resource.Source)) == 0 || !json.Valid(r.Resource.Source) || r.Resource.Source[0] != '{':
		return fieldErr("resource.source", "required: a JSON object")
	case r.Type == selection.StepGet && len(r.Outputs) > 1:
		return fieldErr("outputs", "a get step fills one output, the resource's")
	}
	return nil
}

// resourceRun sets the script, its arguments and its stdin: check with
// {source, version}; in DIR with {source, version, params}, DIR the get's
// output; out DIR with {source, params}, DIR the build dir holding the
// inputs.
func (r *Request) resourceRun(dir string) {
	res := r.Resource
	stdin := map[string]json.RawMessage{"source": res.Source}
	switch r.Type {
	case selection.StepCheck:
		r.Run.Path = path.Join(dir, "check")
		stdin["version"] = orNull(res.Version)
	case selection.StepGet:
		if len(r.Outputs) == 0 {
			r.Outputs = []Output{{Name: resourceOutput, Path: resourceOutput}}
		}
		r.Run.Path, r.Run.Args = path.Join(dir, "in"), []string{r.Outputs[0].Path}
		stdin["version"], stdin["params"] = orNull(res.Version), orEmpty(res.Params)
	case selection.StepPut:
		r.Run.Path, r.Run.Args = path.Join(dir, "out"), []string{"."}
		stdin["params"] = orEmpty(res.Params)
	}
	b, _ := json.Marshal(stdin)
	r.Stdin = string(b)
}

func orNull(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func orEmpty(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("{}")
	}
	return m
}

// resourceResult checks a resource script's answer: a JSON array of
// versions from check, {version, metadata} from in and out.
func resourceResult(typ string, out []byte) (json.RawMessage, error) {
	script := map[string]string{selection.StepCheck: "check", selection.StepGet: "in", selection.StepPut: "out"}[typ]
	bad := func(want string) error {
		quote := out
		if len(quote) > 200 {
			quote = quote[:200]
		}
		return fmt.Errorf("%s printed %q, not %s", script, quote, want)
	}
	trimmed := bytes.TrimSpace(out)
	if typ == selection.StepCheck {
		var versions []map[string]any
		if err := json.Unmarshal(trimmed, &versions); err != nil {
			return nil, bad("a JSON array of versions")
		}
		return json.RawMessage(trimmed), nil
	}
	var answer struct {
		Version  map[string]any `json:"version"`
		Metadata []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(trimmed, &answer); err != nil || answer.Version == nil {
		return nil, bad(`{"version": {...}, "metadata": [...]}`)
	}
	return json.RawMessage(trimmed), nil
}

// resourceOutcome reads a resource script's answer: the step succeeds
// with it as its result, or errors saying what the script printed.
func (r *runner) resourceOutcome(exited Event) (Event, bool) {
	result, err := resourceResult(r.sum.Type, r.answer)
	if err != nil {
		return Event{Type: EventFailed, Phase: Errored, ExitStatus: exited.ExitStatus, Reason: "ResourceAnswerInvalid",
			Message: err.Error()}, true
	}
	r.result = result
	return exited, true
}
