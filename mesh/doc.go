// Package mesh connects the gateways of one installation with yamux
// sessions over mutual TLS, announces which gateway owns which target, and
// carries lifecycle calls and streams to the owner: calls on each pair's
// session, volume streams on a pool of bulk sessions beside it
// (docs/mesh.md). A member's identity is its certificate from the mesh
// CA, read from files and re-read when they change (Identity); Issue makes
// one for a member from the CA, as `gateway mesh issue` does.
package mesh
