package volumes

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// The image API: the subset of the OCI distribution spec a container
// runtime's pull by digest takes, read-only, to pulls with a ticket.
//
//	GET /v2/                                     200 with a ticket, else 401
//	GET|HEAD /v2/jetway/{handle}/manifests/{digest}  the manifest
//	GET|HEAD /v2/jetway/{handle}/blobs/{digest}      the config, or the layer
//
// Anything else, tags included, is a 404 in the spec's error JSON.

// Limits of the image listener, which a NodePort opens to the cluster:
// a pull sends a few headers and no body.
const (
	imageHeaderTimeout = 30 * time.Second
	imageIdleTimeout   = 2 * time.Minute
	imageMaxHeader     = 64 << 10
)

// ServeImages serves the image API alone on addr (for a NodePort: no
// other route is there) until the server is killed, and is where it
// listens.
func (s *Server) ServeImages(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/{$}", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.puller(w, r, ""); ok {
			answer(w, http.StatusOK, struct{}{})
		}
	})
	mux.HandleFunc("GET /v2/jetway/{handle}/manifests/{digest}", s.imageManifest)
	mux.HandleFunc("GET /v2/jetway/{handle}/blobs/{digest}", s.imageBlob)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		registryError(w, http.StatusNotFound, "UNSUPPORTED", "this registry serves jetway's volumes by digest, read-only")
	})
	srv := &http.Server{Handler: s.track(mux), ReadHeaderTimeout: imageHeaderTimeout,
		IdleTimeout: imageIdleTimeout, MaxHeaderBytes: imageMaxHeader}
	s.mu.Lock()
	if s.killed {
		s.mu.Unlock()
		ln.Close()
		return nil, errors.New("images: the volume server is killed")
	}
	s.imageServers = append(s.imageServers, srv)
	s.mu.Unlock()
	s.imagesServing.Go(func() { _ = srv.Serve(ln) })
	return ln.Addr(), nil
}

// puller is the image a request's ticket opens, if it brings one for
// volume handle ("": any), unexpired; else it answers 401.
func (s *Server) puller(w http.ResponseWriter, r *http.Request, handle string) (*image, bool) {
	if _, secret, ok := r.BasicAuth(); ok {
		// By the secret's SHA-256: a lookup's time tells nothing of the
		// secret.
		im := s.images
		im.mu.Lock()
		t, found := im.tickets[sha256.Sum256([]byte(secret))]
		im.mu.Unlock()
		if found && t.expires.After(s.now()) && (handle == "" || handle == t.handle) {
			return t.img, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="jetway images"`)
	registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "a pull needs the ticket jetway gave its pod, for this volume, unexpired")
	return nil, false
}

// imageManifest answers a manifest, by its digest alone.
func (s *Server) imageManifest(w http.ResponseWriter, r *http.Request) {
	img, ok := s.puller(w, r, r.PathValue("handle"))
	if !ok {
		return
	}
	if r.PathValue("digest") != img.manifestDigest {
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "this volume's image has no manifest "+r.PathValue("digest")+": it is served by digest only")
		return
	}
	serveBytes(w, r, ManifestType, img.manifestDigest, img.manifest)
}

// imageBlob answers the config, or the layer, tarred again.
func (s *Server) imageBlob(w http.ResponseWriter, r *http.Request) {
	handle := r.PathValue("handle")
	img, ok := s.puller(w, r, handle)
	if !ok {
		return
	}
	switch digest := r.PathValue("digest"); digest {
	case img.layer:
	case img.configDigest:
		serveBytes(w, r, ConfigType, digest, img.config)
		return
	default:
		registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", "this volume's image has no blob "+digest)
		return
	}
	vol, err := os.OpenRoot(s.Path(handle))
	if err != nil {
		registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", "the volume is gone")
		return
	}
	defer vol.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", img.layer)
	w.Header().Set("Content-Length", strconv.FormatInt(img.size, 10))
	if r.Method == http.MethodHead {
		return
	}
	// Never more than the digest's size, and a tar of files changed
	// since the digest is of other bytes: the runtime, which checks the
	// digest of what it pulls, refuses the pull. That is the safe
	// failure: a changed rootfs never runs as the image it was.
	_ = writeTar(&capped{w: w, left: img.size}, vol, img.path)
}

// capped writes at most left bytes, then fails.
type capped struct {
	w    io.Writer
	left int64
}

func (c *capped) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, errors.New("the layer is larger than its digest says: its folder changed")
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

func serveBytes(w http.ResponseWriter, r *http.Request, mediaType, digest string, b []byte) {
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", digest)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	if r.Method != http.MethodHead {
		_, _ = io.Copy(w, bytes.NewReader(b))
	}
}

// registryError answers as the OCI distribution spec says errors are.
func registryError(w http.ResponseWriter, code int, errCode, msg string) {
	b, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": errCode, "message": msg}}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
