package steps

import (
	"slices"
	"time"

	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/wire"
)

// Spec is the step r as the step agent runs it (r validated). Inputs and
// outputs are volumes named after them.
func Spec(r *wire.Request) stepagent.Spec {
	timeout, _ := time.ParseDuration(r.Timeout) // validated: empty or positive
	sp := stepagent.Spec{
		Handle: r.Handle, Path: r.Run.Path, Args: r.Run.Args, Dir: r.Run.Dir, User: r.Run.User,
		Stdin: []byte(r.Stdin), Timeout: stepagent.Duration(timeout),
	}
	for name, v := range r.Run.Env {
		sp.Env = append(sp.Env, name+"="+v)
	}
	slices.Sort(sp.Env)
	for _, in := range r.Inputs {
		sp.Volumes = append(sp.Volumes, stepagent.Volume{Handle: InputVolume(in.Name), Path: in.Path})
	}
	for _, out := range r.Outputs {
		sp.Volumes = append(sp.Volumes, stepagent.Volume{Handle: OutputVolume(out.Name), Path: out.Path})
	}
	return sp
}

// InputVolume and OutputVolume are the handles of a step's volumes in its
// pod's sidecar (or on an agent).
func InputVolume(name string) string  { return "input-" + name }
func OutputVolume(name string) string { return "output-" + name }
