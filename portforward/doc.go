// Package portforward dials a pod's port through the Kubernetes API server
// (WebSocket, with SPDY fallback) without a local listener, reusing one
// supervised connection per pod. Its code arrives with the streams work
// (issue 5); this comment records the package's place in the layout.
package portforward
