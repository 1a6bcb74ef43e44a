// Package steppod is what every user of a step agent shares: the step
// engine's runner (package steps), the Concourse containers' processes
// and the agent on a machine without Kubernetes.
//
// It holds:
//   - the one Follower of a step agent's process: it runs an agent
//     command (a pod's exec, or the agent in process), reads the frames
//     of the process's log to its status, and attaches again from the
//     last complete frame whenever the exec breaks, with a jittered
//     backoff, until nothing has come for LostAfter. Each user says what
//     to run next (a start, or a tail from the cursor) and what a frame
//     means to it;
//   - RunIn, a process in a pod's run folder (a Concourse container's,
//     a check's in its sandbox), followed by it;
//   - the exec through the API server's pods/exec (WebSocket, with the
//     SPDY fallback), and TrustedExec, which sends a command only to the
//     pod jetway made under the name (ownership.Key.Bound);
//   - what a step pod's state says of its end (PodFailure).
//
// The step pod's spec is still built in package steps (planned: it moves
// here, issue 40).
package steppod
