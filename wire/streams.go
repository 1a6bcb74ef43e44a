package wire

// Endpoint is one side of a stream: a path in a volume of a pod.
type Endpoint struct {
	Target string `json:"target"`
	Pod    string `json:"pod"`
	Handle string `json:"handle"`
	Path   string `json:"path"`
}

// StreamRequest is the body of POST /api/v1/streams: one volume path to
// be copied.
type StreamRequest struct {
	From     Endpoint `json:"from"`
	To       Endpoint `json:"to"`
	Encoding string   `json:"encoding"`
	// Limit, if set, bounds what the destination takes, in MB as
	// baggageclaim's stream-in limit (a Concourse web node's
	// --streaming-size-limitation): past it the stream fails.
	Limit string `json:"limit,omitempty"`
}

// StreamResult is what a finished stream carried: the encoded bytes and
// their SHA-256 as the destination accepted them. jetway hashes a
// relayed stream as it passes; a direct (p2p) one is hashed by the
// source's sidecar (another baggageclaim reports neither).
type StreamResult struct {
	Mode    string  `json:"mode"` // "relay" or "p2p"
	Bytes   int64   `json:"bytes,omitempty"`
	SHA256  string  `json:"sha256,omitempty"`
	Seconds float64 `json:"seconds"`
}

// InputDigest records one input brought into a step before its process
// started: the answer to PUT /api/v1/steps/{handle}/inputs/{name}, and
// the payload of the step agent's input frame (so the log alone tells
// the step's story).
type InputDigest struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}
