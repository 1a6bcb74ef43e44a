// Package mesh connects the gateways of one installation with yamux
// sessions over mutual TLS, announces which gateway owns which target, and
// carries lifecycle calls and streams to the owner: calls on each pair's
// session, volume streams on a pool of bulk sessions beside it
// (docs/mesh.md). Its code arrives with
// the mesh work; this comment records the package's place in the layout.
package mesh
