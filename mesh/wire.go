package mesh

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the mesh wire version this gateway speaks (docs/mesh.md).
const Version = 1

// MaxMessage caps a control message: a route table of thousands of
// targets fits; a length beyond it is a malformed frame, which closes the
// session that sent it.
const MaxMessage = 1 << 20

// ErrMalformed is a control frame that cannot be read: too long, cut
// short, or not the JSON its type needs.
var ErrMalformed = errors.New("malformed mesh frame")

// writeMessage writes v as one control frame: a 4-byte big-endian length,
// then v as JSON.
func writeMessage(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("mesh message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	frame := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(frame, uint32(len(b)))
	copy(frame[4:], b)
	_, err = w.Write(frame)
	return err
}

// readMessage reads one control frame into v. io.EOF means the stream
// ended between frames.
func readMessage(r io.Reader, v any) error {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n > MaxMessage {
		return fmt.Errorf("%w: length %d exceeds %d", ErrMalformed, n, MaxMessage)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("%w: cut short: %v", ErrMalformed, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// Kinds of mesh member.
const (
	KindGateway = "gateway"
	KindAgent   = "agent"
)

// hello is the first message each side sends on the control stream.
type hello struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	// Session is the id the sender gives the session, on a session's
	// hello (not a bulk connection's).
	Session string `json:"session,omitempty"`
	// Bulk, on the hello of a bulk connection's dialer, is the id the
	// accepting side gave the session the bulk connection belongs to.
	Bulk string `json:"bulk,omitempty"`
}

// ErrVersion is a peer speaking another mesh version.
var ErrVersion = errors.New("mesh version mismatch")

// ErrWrongKind is a peer whose hello says another kind than its
// certificate, or an agent meeting an agent: agents hold no session with
// each other.
var ErrWrongKind = errors.New("mesh peer of the wrong kind")

// greet sends our hello and reads the peer's, which must speak our version
// and name itself and its kind as its certificate does (peer). Both sides
// write first, so the write runs aside; on an error the caller closes rw
// (with a deadline set, the session's), which ends it.
func greet(rw io.ReadWriter, ours hello, peer peerCert) (hello, error) {
	errc := make(chan error, 1)
	go func() { errc <- writeMessage(rw, ours) }()
	var theirs hello
	err := readMessage(rw, &theirs)
	if err == nil {
		err = <-errc
	}
	switch {
	case err != nil:
		return theirs, fmt.Errorf("mesh hello: %w", err)
	case theirs.Version != Version:
		return theirs, fmt.Errorf("%w: peer %q speaks mesh version %d, this gateway %d; run the same jetway version on both",
			ErrVersion, theirs.Name, theirs.Version, Version)
	case theirs.Name != peer.name:
		return theirs, fmt.Errorf("mesh hello: peer calls itself %q, its certificate %q", theirs.Name, peer.name)
	case theirs.Kind != KindGateway && theirs.Kind != KindAgent:
		return theirs, fmt.Errorf("mesh hello: peer %q is of unknown kind %q", theirs.Name, theirs.Kind)
	case theirs.Kind != peer.kind:
		return theirs, fmt.Errorf("%w: peer %q calls itself %s, its certificate is %s's",
			ErrWrongKind, theirs.Name, aKind(theirs.Kind), aKind(peer.kind))
	case theirs.Kind == KindAgent && ours.Kind == KindAgent:
		return theirs, fmt.Errorf("%w: peer %q is an agent, as this member is; agents hold no session with each other",
			ErrWrongKind, theirs.Name)
	}
	return theirs, nil
}

// helloFailure is the handshake failure reason of a hello greet refused.
func helloFailure(err error) string {
	switch {
	case errors.Is(err, ErrVersion):
		return "version"
	case errors.Is(err, ErrWrongKind):
		return "wrong-kind"
	}
	return "hello"
}
