// Package jetway is the web-side gateway of a Concourse-style CI that runs
// steps as pods on many Kubernetes clusters. This file is a map; the code
// lives in the packages below, listed in the order data flows through them.
//
// # Organization
//
//   - cmd/gateway: the thin main. Parses configuration, builds the
//     components and runs them until SIGTERM (`gateway run`, `gateway
//     version`).
//   - config: flags, JETWAY_* environment variables and an optional YAML
//     file become one validated Config; viper stays inside.
//   - targets: the kubeconfig directory becomes a live, permission-checked
//     set of targets (Concourse workers).
//   - lifecycle: land, retire, prune, resume and garbage collection,
//     recorded in the target cluster so restarts and replicas agree.
//   - selection: pure placement of steps on targets by team, tags and
//     strategy, with a reason for every target that falls out; imports no
//     Kubernetes client. Nothing calls it yet (the placement API is
//     coming).
//   - portforward: dials a pod's port through the API server, no local
//     listener: one supervised upgraded connection per pod (WebSocket, SPDY
//     fallback) shared by its streams, and an http.RoundTripper over it.
//   - streams: copies volumes between step pods (stream-out piped into
//     stream-in) through portforward, on any clusters.
//   - mesh (coming: only its package comment today): authenticated yamux
//     sessions between the gateways of one installation.
//   - api: HTTP. The Concourse worker API fly reads, jetway's own API,
//     /metrics and the probes.
//   - internal/...: small, narrowly named helpers (buildinfo, ownership,
//     tarsafe), and delayproxy, a loopback TCP proxy that adds a fixed
//     delay each way for tests and benchmarks at a real round-trip time.
//   - integration: tests against real local clusters; integration/cluster
//     starts them (etcd, kube-apiserver, kube-scheduler,
//     kube-controller-manager built from source, kwok for kubelets).
//   - tools: pinned versions of those control-plane binaries, built into
//     bin/ by `make tools`.
//   - deploy/helm: the Helm chart (deploy/helm/jetway), and a package that
//     renders it with Helm's own library for the tests that lint it, check
//     its objects and apply them to a real API server.
package jetway
