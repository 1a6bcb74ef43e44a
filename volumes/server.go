// Package volumes is jetway's volume server: a small HTTP server
// speaking the subset of Concourse's baggageclaim volume API that jetway
// needs, over volumes kept as folders under a root folder. It makes a
// volume (empty, a copy of another, or an import that records what it
// names and reads nothing), lists, looks up and removes volumes, keeps
// their properties and privilege on disk, streams a tar of a volume out
// and into it (raw, gzip, zstd or s2), and pushes a stream straight to
// another server (stream-p2p-out). It serves only the holder of its
// token. With a Capacity it refuses a write that would take its volumes
// past it, before it writes a byte of it. A copy that fails for what a
// volume or an archive holds answers a status that says it is final, and
// the entry and why (failure.go), also once a stream-out began.
//
// It also serves a volume's folder (a rootfs Concourse built) as a
// one-layer OCI image to a node's container runtime (image.go): the
// token's holder registers a pull ticket for it (POST
// /volumes/{handle}/image), and a second listener (ServeImages; a
// volume holder's --images-listen, stepagent.ImagePort 7789) serves the
// OCI distribution API's pull by digest, read-only, to pulls that bring
// a ticket, and nothing else. The layer's digest is read once per
// folder and kept until its volume is written; each pull tars the
// folder again (registry.go).
//
// The step agent serves it on port 7788 of every step pod, over the
// pod's volumes; the local test clusters run it in-process behind each
// step pod's port-forward. A per-target volume holder pod serves it over
// the volumes of a Concourse web node, and the gateway answers the web
// node's baggageclaim API by calling it.
package volumes

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

// Server serves volumes kept as folders under a root folder.
type Server struct {
	root string
	srv  *http.Server
	ln   net.Listener
	// Client is used by stream-p2p-out; tests point its dialer at loopback.
	Client *http.Client
	rate   atomic.Int64 // bytes per second of a new stream-out; 0: no limit
	// linkCopies: a copy of a volume shares its files by hard links
	// (SetLinkCopies).
	linkCopies atomic.Bool

	served   chan struct{} // closed when Serve returned
	stop     chan struct{} // closed by Kill: long work (an image's walk) ends
	mu       sync.Mutex
	killed   bool
	limits   tarsafe.Limits // what one stream-in may write; zero: tarsafe's defaults
	handlers sync.WaitGroup
	space    *space // what the volumes take of the capacity; nil: no capacity

	// vols serializes changes of volumes (made, removed, metadata
	// written); making holds the handles being made, not yet in place.
	vols   sync.Mutex
	making map[string]bool

	// images are the volumes' folders served as images (image.go), on
	// the listeners of imageServers.
	images        *images
	imageServers  []*http.Server
	imagesServing sync.WaitGroup

	tokenHash [sha256.Size]byte
	tickets   map[[sha256.Size]byte]ticket // by the ticket's SHA-256
	// now is the clock of tickets' expiry (tests set it).
	now func() time.Time
}

// ticket allows one stream-in into one volume path until it expires.
type ticket struct {
	handle, path string
	expires      time.Time
}

// Tickets: how long one is good for, and how many may wait at once (a
// gateway registers one per direct stream and uses it at once).
const (
	TicketTTL  = 5 * time.Minute
	maxTickets = 1024
)

// Header names. StreamInAuthorization carries, on a stream-p2p-out, the
// Authorization the push sends to the destination: its ticket.
const StreamInAuthorization = "Stream-In-Authorization"

// SetLimits bounds what one stream-in may write into a volume (zero
// fields: tarsafe's defaults); an archive past them is refused with a
// 400 naming the limit and the entry, the volume left as it was.
func (s *Server) SetLimits(l tarsafe.Limits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = l
}

// SetLinkCopies makes a cow volume, and an import of another volume,
// share its parent's files by hard links rather than copy them: it costs
// what the parent's folders and names take, not its bytes (copy.go).
// Only for a server that alone writes its volumes' files (a volume
// holder's sidecar): the server itself never writes a file in place,
// but a process that did (a step's, in a step pod or on an agent's
// machine) would write every volume linking it.
func (s *Server) SetLinkCopies(on bool) { s.linkCopies.Store(on) }

// Start serves on a new loopback port, storing volumes under root, to
// whoever holds the token whose SHA-256 tokenHash is (hex).
func Start(root, tokenHash string) (*Server, error) {
	return Listen("127.0.0.1:0", root, tokenHash, Capacity{})
}

// Listen serves on addr, storing volumes under root: root/volumes/<handle>
// is a volume, a folder or a symlink to one. It serves whoever holds the
// token whose SHA-256 tokenHash is (hex); there is no server without one.
// With a capacity it first measures what root holds.
func Listen(addr, root, tokenHash string, capacity Capacity) (*Server, error) {
	h, err := hex.DecodeString(tokenHash)
	if err != nil || len(h) != sha256.Size {
		return nil, fmt.Errorf("the volume server's token hash must be a SHA-256 in hex (64 characters), not %d characters", len(tokenHash))
	}
	sweep(root)
	sp, err := newSpace(root, capacity)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{root: root, ln: ln, Client: &http.Client{}, served: make(chan struct{}), stop: make(chan struct{}), space: sp,
		tickets: map[[sha256.Size]byte]ticket{}, making: map[string]bool{}, now: time.Now, images: newImages()}
	copy(s.tokenHash[:], h)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /volumes", s.create)
	mux.HandleFunc("GET /volumes", s.list)
	mux.HandleFunc("GET /volumes/{handle}", s.get)
	mux.HandleFunc("DELETE /volumes/{handle}", s.destroy)
	mux.HandleFunc("PUT /volumes/{handle}/properties/{name}", s.setProperty)
	mux.HandleFunc("GET /volumes/{handle}/privileged", s.getPrivileged)
	mux.HandleFunc("PUT /volumes/{handle}/privileged", s.setPrivileged)
	mux.HandleFunc("PUT /volumes/{handle}/held", s.hold)
	mux.HandleFunc("GET /volumes/{handle}/check", s.check)
	mux.HandleFunc("POST /volumes/{handle}/lose", s.lose)
	mux.HandleFunc("POST /volumes/{handle}/settle", s.settle)
	mux.HandleFunc("POST /tickets", s.ticket)
	mux.HandleFunc(streamInRoute, s.streamIn)
	mux.HandleFunc("PUT /volumes/{handle}/stream-out", s.streamOut)
	mux.HandleFunc("PUT /volumes/{handle}/stream-p2p-out", s.streamP2POut)
	mux.HandleFunc("POST /volumes/{handle}/image", s.serveImage)
	s.srv = &http.Server{Handler: s.track(s.holder(mux))}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// bearer is the SHA-256 of a request's bearer credential, and whether it
// has one.
func bearer(r *http.Request) ([sha256.Size]byte, bool) {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || v == "" {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256([]byte(v)), true
}

// holds reports whether the request carries the server's token.
func (s *Server) holds(r *http.Request) bool {
	h, ok := bearer(r)
	return ok && subtle.ConstantTimeCompare(h[:], s.tokenHash[:]) == 1
}

// streamInRoute is the one route a request may take without the token:
// a push from another pod brings a ticket instead (useTicket), which the
// route checks itself.
const streamInRoute = "PUT /volumes/{handle}/stream-in"

// holder serves mux to the token's holder alone; anyone else gets a 401
// before a byte of the request is read, whatever the method and path
// (also one mux would answer itself: a 404, a 405, a redirect), unless
// mux routes the request to streamInRoute. The route is mux's own match,
// not the path's look: PUT /volumes/H/properties/stream-in is a
// property's.
func (s *Server) holder(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, route := mux.Handler(r); route != streamInRoute && !s.holds(r) {
			unauthorized(w)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="jetway volumes"`)
	fail(w, http.StatusUnauthorized, "this volume server serves only the jetway gateway that made its pod: no valid credential")
}

// TicketRequest registers a ticket: the SHA-256 (hex) of a secret the
// token's holder made, good for one stream-in into Handle's Path.
type TicketRequest struct {
	SHA256 string `json:"sha256"`
	Handle string `json:"handle"`
	Path   string `json:"path,omitempty"`
}

func (s *Server) ticket(w http.ResponseWriter, r *http.Request) {
	var req TicketRequest
	err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req)
	h, herr := hex.DecodeString(req.SHA256)
	if err != nil || herr != nil || len(h) != sha256.Size || !validHandle(req.Handle) {
		fail(w, http.StatusBadRequest, "body must be {\"sha256\": \"<64 hex>\", \"handle\": \"...\", \"path\": \"...\"}")
		return
	}
	var key [sha256.Size]byte
	copy(key[:], h)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range s.tickets {
		if !now.Before(t.expires) {
			delete(s.tickets, k)
		}
	}
	if len(s.tickets) >= maxTickets {
		fail(w, http.StatusServiceUnavailable, "%d tickets wait already; try again", maxTickets)
		return
	}
	s.tickets[key] = ticket{handle: req.Handle, path: cleanPath(req.Path), expires: now.Add(TicketTTL)}
	w.WriteHeader(http.StatusNoContent)
}

// useTicket takes the request's ticket for its volume path, if it has one
// that is good: a ticket serves once.
func (s *Server) useTicket(r *http.Request) bool {
	h, ok := bearer(r)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tickets[h]
	if !ok || !s.now().Before(t.expires) || t.handle != r.PathValue("handle") || t.path != cleanPath(r.URL.Query().Get("path")) {
		return false
	}
	delete(s.tickets, h)
	return true
}

// cleanPath is a volume path as tickets compare them.
func cleanPath(p string) string { return filepath.ToSlash(filepath.Clean("/" + p)) }

// SetRate limits the stream-outs that start from now on to about rate
// bytes per second (0: no limit), so tests can fail a stream while it
// runs. It is safe while the server serves.
func (s *Server) SetRate(rate int64) { s.rate.Store(rate) }

// track counts running handlers, for Kill to wait on; a request arriving
// once the server is killed is dropped.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.killed {
			s.mu.Unlock()
			panic(http.ErrAbortHandler)
		}
		s.handlers.Add(1)
		s.mu.Unlock()
		defer s.handlers.Done()
		next.ServeHTTP(w, r)
	})
}

// Port is the loopback port the server listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Kill drops the listener and every open connection mid-request, as a
// killed process would, and returns once its goroutines have. Calling it
// again does nothing.
func (s *Server) Kill() error {
	s.mu.Lock()
	if !s.killed {
		close(s.stop)
	}
	s.killed = true
	servers := s.imageServers
	s.mu.Unlock()
	err := s.srv.Close()
	for _, srv := range servers {
		_ = srv.Close()
	}
	<-s.served
	s.imagesServing.Wait()
	s.handlers.Wait()
	return err
}

// Path returns the folder holding a volume's files.
func (s *Server) Path(handle string) string { return filepath.Join(s.root, "volumes", handle) }

type errorBody struct {
	Error string `json:"error"`
}

// fail answers code with {"error": the message}, and nothing more, not
// even a newline: some clients compare the body whole.
func fail(w http.ResponseWriter, code int, format string, args ...any) {
	b, _ := json.Marshal(errorBody{Error: fmt.Sprintf(format, args...)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// decode reads a request's JSON body, of at most maxBody bytes, into v.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v)
	if _, past := errors.AsType[*http.MaxBytesError](err); past {
		return fmt.Errorf("the body is past the limit of %d bytes", maxBody)
	}
	return err
}

// answer answers code with v in JSON, and nothing more.
func answer(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fail(w, http.StatusInternalServerError, "%v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// validHandle reports whether h can name a volume: one path element, not
// starting with a dot (the server's own temporary names do).
func validHandle(h string) bool {
	return h != "" && h[0] != '.' && !strings.ContainsAny(h, "/\\")
}
