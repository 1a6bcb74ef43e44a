// Package jetway is the web-side gateway of a Concourse-style CI that runs
// steps as pods on many Kubernetes clusters. This file is a map; the code
// lives in the packages below, listed in the order data flows through them.
//
// # Organization
//
//   - cmd/gateway: the thin main and the CLI. Parses configuration, builds
//     the components and runs them until SIGTERM (`gateway run`, `gateway
//     agent`, and the commands that call a gateway's API: workers, land,
//     place, execute, ...).
//   - config: flags, JETWAY_* environment variables and an optional YAML
//     file become one validated Config; viper stays inside.
//   - targets: the kubeconfig directory becomes a live, permission-checked
//     set of targets (Concourse workers), each with a watch of its step
//     pods and its lifecycle record.
//   - lifecycle: land, retire, prune, resume and garbage collection,
//     recorded in the target cluster so restarts and replicas agree.
//   - selection: pure placement of steps on targets by team, tags,
//     platform and strategy, with a reason for every target that falls
//     out; imports no Kubernetes client. The API's placements and the
//     step engine's queue (a selection.Pool) decide with it.
//   - steps: the step engine. Every step is a record in the
//     installation's state namespace; one gateway (a Lease) places the
//     waiting ones, first come, first served, within the limits; each step
//     has one owner (gateway Leases), which makes its pod and drives its
//     process through the step agent; its events are positions in its
//     record and its agent's log. steps/stepstest has fakes for tests of
//     its users.
//   - steppod: the step pod every user of a step agent shares (the
//     engine, the Concourse containers, the agent): its spec, exec
//     through the API server, the one follower of the agent's process,
//     and the agent's log as events. concourse and agent import it and
//     wire, never steps.
//   - agentmount: with step-agent-mount auto, chooses per target whether
//     its step pods get the agent as an image volume or by an init
//     container, from the runtime and kubelet its nodes report.
//   - stepagent, cmd/step-agent: what runs inside a step pod (and under a
//     `gateway agent`): the supervisor, the log, its tail by position.
//   - volumes: a step pod's volume sidecar (the baggageclaim subset).
//   - portforward: dials a pod's port through the API server, no local
//     listener: one supervised upgraded connection per pod (WebSocket, SPDY
//     fallback) shared by its streams, and an http.RoundTripper over it.
//   - streams: copies volumes between step pods (stream-out piped into
//     stream-in) through portforward, on any clusters.
//   - mesh: authenticated yamux sessions between the gateways of one
//     installation and its agents: route announcements, relayed calls and
//     streams (docs/mesh.md).
//   - agent: `gateway agent`, a machine without Kubernetes as one target,
//     running tasks as local processes under the step agent's supervisor,
//     and a Concourse web node's worker (its LocalWorker).
//   - concourse: targets and agents as an unmodified Concourse web node's
//     workers: registration, lifecycle both ways, the garbage-collection
//     rounds, and the workers' Garden and volume APIs, on pods or, for an
//     agent, through the mesh to its LocalWorker.
//   - api: HTTP. The Concourse worker API fly reads, jetway's own API
//     (targets, placements, steps, streams), /metrics and the probes.
//   - wire: the shapes on the HTTP API (a step's request, view and events,
//     errors, a stream's request and result, the one Concourse worker
//     JSON, the calls on an agent's local worker), importing only the
//     standard library; api, steps, agent, concourse, streams,
//     stepagent and the client share them.
//   - client: a Go client of the API and the Orchestrator a CI core calls;
//     of jetway it imports only wire (and internal/tarsafe), so no
//     Kubernetes, Garden, yamux or Prometheus package.
//   - internal/...: small, narrowly named helpers (buildinfo, ownership,
//     tarsafe, watchcache, atomicfile, provision, meshtest), and delayproxy,
//     a loopback TCP proxy that adds a fixed delay each way for tests and
//     benchmarks at a real round-trip time.
//   - integration: tests against real local clusters and real gateway
//     processes; integration/cluster starts them (etcd, kube-apiserver,
//     kube-scheduler, kube-controller-manager built from source, kwok for
//     kubelets); integration/bench the benchmarks.
//   - tools: pinned versions of those control-plane binaries, built into
//     bin/ by `make tools`; tools/mkimage writes the images.
//   - deploy/helm: the Helm chart (deploy/helm/jetway), and a package that
//     renders it with Helm's own library for the tests that lint it, check
//     its objects and apply them to a real API server.
package jetway
