// Package steppod is the step pod, as every user of a step agent shares
// it: the step engine (package steps), the Concourse containers (package
// concourse) and the agent on a machine without Kubernetes (package
// agent). None of them reaches into another for it.
//
// It holds:
//   - the pod's spec (Build, from a Spec of its own: a step's, a check
//     sandbox's or a Concourse container's): the step container whose
//     pid 1 is the agent, the volume sidecar, the agent as an image
//     volume or copied by an init container (AgentMount), security,
//     resources and the emptyDir's limit from the gateway's Defaults and
//     the target's policy, placement, and jetway's seal; the Concourse
//     volume holder (HolderPod); whether a pod's sidecar listens;
//   - the one Follower of a step agent's process: it runs an agent
//     command (a pod's exec, or the agent in process), reads the frames
//     of the process's log to its status, and attaches again from the
//     last complete frame whenever the exec breaks, with a jittered
//     backoff, until nothing has come for LostAfter. Each user says what
//     to run next (a start, or a tail from the cursor) and what a frame
//     means to it;
//   - RunIn, a process in a pod's run folder (a Concourse container's,
//     a check's in its sandbox), followed by it;
//   - what the agent's log means as a step's events (FrameEvent,
//     StatusEvent, ReadEvents) and how a follower reads them from a
//     Journal to the end (FollowJournal); the request as the agent runs
//     it (AgentSpec) and its volumes;
//   - the exec through the API server's pods/exec (WebSocket, with the
//     SPDY fallback), and TrustedExec, which sends a command only to the
//     pod jetway made under the name (ownership.Key.Bound);
//   - what a step pod's state says of its end (PodFailure).
package steppod
