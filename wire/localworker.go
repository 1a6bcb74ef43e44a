package wire

import "regexp"

// An agent's local worker: what a gateway calls on an agent joined to it
// (over the mesh, the agent's name as the host) for the web node's
// worker the agent is, and the agent serves (agent.LocalWorker) to the
// gateways of its mesh alone. Below LocalWorkerPath:
//
//   - volumes, volumes/...: the web node's volume (baggageclaim) API,
//     passed to the agent's volume server as it came;
//   - GET containers: the handles of the agent's containers, a JSON array;
//   - PUT containers/{handle}: make the container (body LocalContainer),
//     anew if it is there; 204;
//   - DELETE containers/{handle}: remove it, ending what runs in it; 204,
//     also for one already gone;
//   - POST containers/{handle}/exec?arg=...: one step agent command (its
//     arguments, each a LocalExecArg; the command is run, tail or abort of
//     a process, --run ID) in the container: its stdin the request's body,
//     its stdout the answer's; its exit code and stderr are the answer's
//     trailers TrailerExitCode and TrailerExecStderr (code -1: it did not
//     run, the stderr says why).
//
// An error answer is a JSON object whose "error" says what went wrong.

// LocalWorkerPath prefixes what an agent serves a gateway for the web
// node's worker it is.
const LocalWorkerPath = "/concourse/v1/"

// LocalExecArg is the query parameter of an exec on an agent: one
// argument of the step agent's command each, in order.
const LocalExecArg = "arg"

// Trailers of an exec on an agent.
const (
	TrailerExitCode   = "Jetway-Exit-Code"
	TrailerExecStderr = "Jetway-Exec-Stderr"
)

// LocalContainer is the body of a container's make on an agent.
type LocalContainer struct {
	Mounts []LocalMount `json:"mounts"`
}

// LocalMount is a container's bind mount as the gateway sends it.
type LocalMount struct {
	// Path is where the container sees it: absolute, below /.
	Path string `json:"path"`
	// Source is the web node's source path: a volume of the agent's, or
	// anything else, which is left an empty folder.
	Source string `json:"source"`
}

// containerHandle is a Concourse container's handle jetway takes: a pod
// label's value (the web node gives UUIDs), so a folder's name too.
var containerHandle = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// IsContainerHandle reports whether h is a container handle jetway takes,
// on a cluster target (a pod's label) and on an agent (a folder).
func IsContainerHandle(h string) bool { return containerHandle.MatchString(h) }
