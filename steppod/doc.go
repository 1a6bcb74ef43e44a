// Package steppod is what every user of a step agent shares: the step
// engine's runner (package steps), the Concourse containers' processes
// and the agent on a machine without Kubernetes.
//
// Today it holds the one Follower of a step agent's process: it runs an
// agent command (a pod's exec, or the agent in process), reads the
// frames of the process's log to its status, and attaches again from the
// last complete frame whenever the exec breaks, with a jittered backoff,
// until nothing has come for LostAfter. Each user says what to run next
// (a start, or a tail from the cursor) and what a frame means to it.
//
// The step pod's spec, exec and failures still live in package steps
// (planned: they move here, issue 40).
package steppod
