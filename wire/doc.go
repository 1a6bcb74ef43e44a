// Package wire holds the shapes that cross jetway's HTTP API: a step's
// request and its validation, a step's view and events, the reasons and
// errors the API answers with, a stream's request and result, an
// input's digest, the one Concourse worker shape that both `fly
// workers` (GET /api/v1/workers) and the web node (the TSA's
// forward-worker) read, and the calls a gateway makes on an agent's
// local worker (LocalWorkerPath: concourse calls, agent serves).
//
// The gateway's API (api), its step engine (steps), the agent (agent),
// the Concourse worker (concourse), the step agent (stepagent), the
// streams (streams), `jetway execute` (cmd/gateway) and the Go client
// (client) all use these types. wire is a leaf: it imports only the
// standard library, so the client, which imports only wire of jetway's
// API, brings no Kubernetes, Garden or yamux package into a program
// (client's deps_test.go and wire's deps_test.go check it).
package wire
