// Package mesh connects the gateways and agents of one installation with
// yamux sessions over mutual TLS, announces which member owns which
// target, and carries lifecycle calls and streams to the owner: calls on
// each pair's session, volume streams on a pool of bulk sessions beside it
// (docs/mesh.md). A member's identity is its certificate from the mesh
// CA, read from files and re-read when they change (Identity), whose role
// URI says whether it is a gateway's or an agent's; Issue makes one for a
// member from the CA, as `gateway mesh issue` does. A handler of the calls
// peers make learns who made them, also through a relaying gateway (Peer,
// PeerKind).
package mesh
