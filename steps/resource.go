package steps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"

	"github.com/jetway-ci/jetway/selection"
	"github.com/jetway-ci/jetway/wire"
)

// DefaultResourceDir is where resource images keep their scripts.
const DefaultResourceDir = "/opt/resource"

// resourceOutput is the output a get step's script fills, unless the
// step names one.
const resourceOutput = "resource"

// resultLimit bounds a resource script's stdout, its answer.
const resultLimit = 4 << 20

// resourceRun sets the script of r, a resource step (see wire.Resource),
// its arguments and its stdin: check with {source, version}; in DIR with
// {source, version, params}, DIR the get's output; out DIR with {source,
// params}, DIR the build dir holding the inputs.
func resourceRun(r *wire.Request, dir string) {
	res := r.Resource
	stdin := map[string]json.RawMessage{"source": res.Source}
	switch r.Type {
	case selection.StepCheck:
		r.Run.Path = path.Join(dir, "check")
		stdin["version"] = orNull(res.Version)
	case selection.StepGet:
		if len(r.Outputs) == 0 {
			r.Outputs = []wire.Output{{Name: resourceOutput, Path: resourceOutput}}
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
func (r *runner) resourceOutcome(exited wire.Event) (wire.Event, bool) {
	result, err := resourceResult(r.sum.Type, r.answer)
	if err != nil {
		return wire.Event{Type: wire.EventFailed, Phase: wire.Errored, ExitStatus: exited.ExitStatus, Reason: "ResourceAnswerInvalid",
			Message: err.Error()}, true
	}
	r.result = result
	return exited, true
}
