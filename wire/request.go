package wire

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"
)

// Step types, as Concourse names its container types (and as
// selection.Step* names them).
const (
	stepTask  = "task"
	stepGet   = "get"
	stepPut   = "put"
	stepCheck = "check"
)

// Request is the body of POST /api/v1/steps: one step to run.
type Request struct {
	// Handle is the caller's name for the step, unique within its team:
	// the same handle again returns the existing step.
	Handle string `json:"handle"`
	// Type is task, check, get or put.
	Type string `json:"type"`
	// Team runs the step; a team token may name only its own (or none).
	Team     string   `json:"team,omitempty"`
	Tags     []string `json:"tags,omitempty"`
	Platform string   `json:"platform,omitempty"`
	// Image is the step container's image.
	Image string `json:"image"`
	Run   Run    `json:"run"`
	// Stdin is given to the process, which then reads end of file.
	Stdin     string    `json:"stdin,omitempty"`
	Inputs    []Input   `json:"inputs,omitempty"`
	Outputs   []Output  `json:"outputs,omitempty"`
	Resources Resources `json:"resources,omitzero"`
	// Timeout bounds the process's run, from its start ("1h30m"); waiting
	// for a target or the scheduler does not count. Empty: none.
	Timeout string `json:"timeout,omitempty"`
	// Resource, for check, get and put steps, runs the resource's script
	// in place of run (see Resource).
	Resource *Resource `json:"resource,omitempty"`
	// ReuseKey, for a check step, runs it in a warm sandbox pod kept for
	// the checks of the same team, image and key (see steps.SandboxLabel).
	ReuseKey string `json:"reuse_key,omitempty"`
	// Privileged runs the step in a privileged container (Concourse's
	// `privileged: true`): only a target whose target.yaml allows it
	// (steps.allowPrivileged) takes the step; elsewhere it waits, saying
	// which targets' policy refuses it.
	Privileged bool `json:"privileged,omitempty"`
}

// Resource makes a check, get or put step run Concourse's resource
// protocol: the resource image's scripts (check, in, out under the
// gateway's resource-dir, /opt/resource by default) with this JSON on
// stdin. The script's stdout is the step's result, its stderr the log.
type Resource struct {
	Source  json.RawMessage `json:"source"`
	Version json.RawMessage `json:"version,omitempty"` // check and get
	Params  json.RawMessage `json:"params,omitempty"`  // get and put
}

// Run is the process.
type Run struct {
	Path string   `json:"path"`
	Args []string `json:"args,omitempty"`
	// Dir is the working directory, relative to the build dir where the
	// inputs and outputs are.
	Dir string            `json:"dir,omitempty"`
	Env map[string]string `json:"env,omitempty"`
	// User is a uid[:gid] or a user name of the image.
	User string `json:"user,omitempty"`
}

// Input is a volume brought into the step before it starts: a path of a
// volume of a pod, or an output of an earlier step of the team.
type Input struct {
	Name string `json:"name"`
	// Path is where it appears, relative to the build dir; default Name.
	Path string      `json:"path,omitempty"`
	From InputSource `json:"from"`
}

// InputSource names where an input comes from: Target, Pod and Handle
// (and Path inside the volume), Step and Output, or Upload: the caller
// sends it with PUT /api/v1/steps/{handle}/inputs/{name} once the step's
// pod is ready (gateway execute's local directories).
type InputSource struct {
	Upload bool   `json:"upload,omitempty"`
	Target string `json:"target,omitempty"`
	Pod    string `json:"pod,omitempty"`
	Handle string `json:"handle,omitempty"`
	Path   string `json:"path,omitempty"`
	Step   string `json:"step,omitempty"`
	Output string `json:"output,omitempty"`
}

// Output is a folder of the build dir kept as a volume after the step.
type Output struct {
	Name string `json:"name"`
	Path string `json:"path,omitempty"` // default Name
}

// Resources are the step container's requests, which are also its limits.
type Resources struct {
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// FieldError is a problem with one field of a request: the API answers
// 400 naming Field.
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// handlePattern keeps handles usable as label values and in pod names.
var handlePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// envName is what a process environment variable may be called.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports the first problem of r, naming its field, and fills
// defaults (input and output paths).
func (r *Request) Validate() *FieldError {
	checks := []func() *FieldError{r.checkHead, r.checkResource, r.checkRun, r.checkVolumes, r.checkLimits}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// Imageless says the step may have no image: a task for a platform other
// than linux, which only an agent runs, as a process on its machine.
func (r *Request) Imageless() bool {
	return r.Type == stepTask && r.Platform != "" && r.Platform != "linux"
}

func (r *Request) checkHead() *FieldError {
	switch {
	case r.Handle == "":
		return fieldErr("handle", "required")
	case !handlePattern.MatchString(r.Handle):
		return fieldErr("handle", "%q must be 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit", r.Handle)
	}
	switch r.Type {
	case stepTask, stepGet, stepPut, stepCheck:
	case "":
		return fieldErr("type", "required: task, check, get or put")
	default:
		return fieldErr("type", "%q is not one of task, check, get, put", r.Type)
	}
	if r.Team != "" && !isLabelValue(r.Team) {
		return fieldErr("team", "%q cannot be a label value", r.Team)
	}
	for i, tag := range r.Tags {
		if strings.TrimSpace(tag) == "" {
			return fieldErr(fmt.Sprintf("tags[%d]", i), "empty tag")
		}
	}
	if strings.TrimSpace(r.Image) == "" && !r.Imageless() {
		return fieldErr("image", "required (only a task for a platform other than linux, which an agent runs, may omit it)")
	}
	switch {
	case r.ReuseKey != "" && r.Type != stepCheck:
		return fieldErr("reuse_key", "only check steps run in a sandbox; a %s step gets a pod of its own", r.Type)
	case len(r.ReuseKey) > 253:
		return fieldErr("reuse_key", "%d bytes is too long (at most 253)", len(r.ReuseKey))
	case r.ReuseKey != "" && len(r.Inputs)+len(r.Outputs) > 0:
		return fieldErr("reuse_key", "a check in a sandbox has no inputs or outputs")
	case r.ReuseKey != "" && r.Privileged:
		return fieldErr("reuse_key", "a privileged check runs in a pod of its own, not in a shared sandbox")
	}
	return nil
}

func (r *Request) checkRun() *FieldError {
	if r.Run.Path == "" && r.Resource == nil {
		return fieldErr("run.path", "required")
	}
	if r.Run.Dir != "" {
		if err := relative(r.Run.Dir, true); err != "" {
			return fieldErr("run.dir", "%q %s", r.Run.Dir, err)
		}
	}
	for name := range r.Run.Env {
		if !envName.MatchString(name) {
			return fieldErr("run.env", "%q is not a variable name", name)
		}
	}
	return nil
}

// relative checks a path of the build dir: relative, clean, inside.
func relative(p string, dotOK bool) string {
	switch {
	case path.IsAbs(p):
		return "must be relative to the build dir"
	case path.Clean(p) != p:
		return "must be clean (no '.', '..', '//' or trailing '/')"
	case p == "..", strings.HasPrefix(p, "../"):
		return "must stay inside the build dir"
	case p == "." && !dotOK:
		return "must not be the build dir itself"
	}
	return ""
}

func (r *Request) checkVolumes() *FieldError {
	names, paths := map[string]string{}, map[string]string{}
	claim := func(field, name, p string) *FieldError {
		if !isDNSLabel(name) {
			return fieldErr(field+".name", "%q must be a DNS-1123 label (lower-case letters, digits, '-')", name)
		}
		if other, ok := names[name]; ok {
			return fieldErr(field+".name", "%q is also %s", name, other)
		}
		if err := relative(p, false); err != "" {
			return fieldErr(field+".path", "%q %s", p, err)
		}
		for q, other := range paths {
			if q == p || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return fieldErr(field+".path", "%q overlaps %s", p, other)
			}
		}
		names[name], paths[p] = field, field
		return nil
	}
	for i := range r.Inputs {
		in := &r.Inputs[i]
		field := fmt.Sprintf("inputs[%d]", i)
		in.Path = cmp.Or(in.Path, in.Name)
		if err := claim(field, in.Name, in.Path); err != nil {
			return err
		}
		if err := in.From.check(field + ".from"); err != nil {
			return err
		}
	}
	for i := range r.Outputs {
		out := &r.Outputs[i]
		out.Path = cmp.Or(out.Path, out.Name)
		if err := claim(fmt.Sprintf("outputs[%d]", i), out.Name, out.Path); err != nil {
			return err
		}
	}
	return nil
}

func (s InputSource) check(field string) *FieldError {
	byStep := s.Step != "" || s.Output != ""
	byPod := s.Target != "" || s.Pod != "" || s.Handle != "" || s.Path != ""
	switch {
	case s.Upload && (byStep || byPod):
		return fieldErr(field, "an uploaded input names no step or pod")
	case s.Upload:
		return nil
	case byStep && byPod:
		return fieldErr(field, "either {target, pod, handle, path} or {step, output}, not both")
	case byStep && (s.Step == "" || s.Output == ""):
		return fieldErr(field, "{step, output} needs both")
	case byStep:
		return nil
	case s.Target == "" || s.Pod == "" || s.Handle == "":
		return fieldErr(field, "needs target, pod and handle (or step and output)")
	}
	if s.Path != "" {
		if err := relative(s.Path, true); err != "" {
			return fieldErr(field+".path", "%q %s", s.Path, err)
		}
	}
	return nil
}

func (r *Request) checkLimits() *FieldError {
	for field, q := range map[string]string{"resources.cpu": r.Resources.CPU, "resources.memory": r.Resources.Memory} {
		if q == "" {
			continue
		}
		if !positiveQuantity(q) {
			return fieldErr(field, "%q is not a positive quantity (say 500m or 2Gi)", q)
		}
	}
	if r.Timeout != "" {
		d, err := time.ParseDuration(r.Timeout)
		if err != nil || d <= 0 {
			return fieldErr("timeout", "%q is not a positive duration (say 90s or 1h)", r.Timeout)
		}
	}
	return nil
}

// checkResource validates the resource of a check, get or put step, which
// runs the resource's script instead of run.
func (r *Request) checkResource() *FieldError {
	isResource := r.Type == stepCheck || r.Type == stepGet || r.Type == stepPut
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
	case r.Type == stepGet && len(r.Outputs) > 1:
		return fieldErr("outputs", "a get step fills one output, the resource's")
	}
	return nil
}
