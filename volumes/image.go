package volumes

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// A volume's folder as an OCI image: a rootfs a Concourse task built (or
// a get mirrored) served to a node's container runtime, which pulls it by
// digest, so that a pod runs it as its image. The image is one
// uncompressed layer, the folder's tar as writeTar makes it (names in
// walk order, numeric owners, modes, times in seconds, hard links within
// it: the same bytes each time for the same files), a config whose env
// is the volume's metadata.json's, as Concourse writes it beside rootfs/
// (its user is the web node's to give each process), and a manifest
// naming both.
//
// The layer's digest takes one reading pass of the folder; it is kept
// until the volume is written (stream-in, settle, lose) or destroyed, and
// each pull tars the folder again, so no second copy is kept on disk. A
// cow volume made of hard links to its parent's files (a holder's, which
// the web node makes for each container of an image) has its parent's
// image without a pass of its own. A
// folder changed between the digest and a pull makes a layer of other
// bytes: the runtime checks the digest and refuses the pull, so a changed
// rootfs never runs as the image it was.
//
// The image API (ServeImages) listens apart from the volume API: a
// NodePort exposes it and nothing else. It serves a pull that brings a
// ticket (ImageRequest) as its Basic password: a secret the token's holder
// registered, by its SHA-256, for one volume and until a time.

// Media types of the image's parts.
const (
	ManifestType = "application/vnd.oci.image.manifest.v1+json"
	ConfigType   = "application/vnd.oci.image.config.v1+json"
	LayerType    = "application/vnd.oci.image.layer.v1.tar"
)

// ImageRequest asks the volume server to serve the folder Path of a
// volume as an image, to whoever brings the secret whose SHA-256 (hex)
// TicketSHA256 is, until Expires.
type ImageRequest struct {
	Path         string    `json:"path"`
	TicketSHA256 string    `json:"ticket_sha256"`
	Expires      time.Time `json:"expires"`
}

// ImageAnswer is the image's manifest digest and its layer's size.
type ImageAnswer struct {
	Manifest string `json:"manifest"`
	Size     int64  `json:"size"`
}

// maxImageTickets bounds the pull tickets waiting at once (one per
// container whose image is a volume's, each good for hours).
const maxImageTickets = 4096

// maxImageMetadata bounds the metadata.json read for an image's config.
const maxImageMetadata = 1 << 20

// image is a volume folder's image, as served.
type image struct {
	path           string // the folder, in the volume
	layer          string // its tar's digest
	size           int64
	config         []byte
	manifest       []byte
	manifestDigest string
}

// imageTicket opens one volume's image until it expires.
type imageTicket struct {
	handle  string
	expires time.Time
}

// images are the images the server made and the tickets that open them.
type images struct {
	mu      sync.Mutex
	byVol   map[string]*image // by volume handle
	tickets map[[sha256.Size]byte]imageTicket
	epoch   uint64 // counts forgets: a digest made across one is not kept
	making  singleflight.Group
	// walks counts the layer digests made (tests).
	walks int
}

func newImages() *images {
	return &images{byVol: map[string]*image{}, tickets: map[[sha256.Size]byte]imageTicket{}}
}

// forget drops what was made of volume handle's files: they changed, or
// the volume is gone.
func (im *images) forget(handle string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	delete(im.byVol, handle)
	im.epoch++
	for k, t := range im.tickets {
		if t.handle == handle {
			delete(im.tickets, k)
		}
	}
}

// current is the count of forgets so far, for inherit.
func (im *images) current() uint64 {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.epoch
}

// inherit gives volume child, a copy of parent made since epoch, parent's
// image, if it has one and nothing was forgotten since: the copy's tar
// is the parent's, byte for byte (copiesExactly), so a container of each
// cow of an image's volume costs no reading pass.
func (im *images) inherit(parent, child string, epoch uint64) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if img := im.byVol[parent]; img != nil && im.epoch == epoch {
		im.byVol[child] = img
	}
}

// copiesExactly reports whether a cow volume's files are its parent's
// as a layer's tar carries them: hard links to them (SetLinkCopies),
// with owners and setuid kept (the Owners limit), as a volume holder's
// sidecar makes them.
func (s *Server) copiesExactly() bool {
	s.mu.Lock()
	owners := s.limits.Owners
	s.mu.Unlock()
	return owners && s.linkCopies.Load()
}

// serveImage answers POST /volumes/{handle}/image: the image of the
// folder asked for, made once, and a ticket for it.
func (s *Server) serveImage(w http.ResponseWriter, r *http.Request) {
	var req ImageRequest
	if err := decode(w, r, &req); err != nil {
		return
	}
	sum, err := hex.DecodeString(req.TicketSHA256)
	if err != nil || len(sum) != sha256.Size {
		fail(w, http.StatusBadRequest, "ticket_sha256 must be a SHA-256 in hex (64 characters)")
		return
	}
	if !req.Expires.After(s.now()) {
		fail(w, http.StatusBadRequest, "the ticket expires at %s, which has passed", req.Expires.Format(time.RFC3339))
		return
	}
	q := r.URL.Query()
	q.Set("path", req.Path)
	r.URL.RawQuery = q.Encode()
	base, sub, ok := s.volume(w, r)
	if !ok {
		return
	}
	handle := r.PathValue("handle")
	img, code, err := s.image(handle, base, sub)
	if err != nil {
		fail(w, code, "volume %s, %s: %v", handle, req.Path, err)
		return
	}
	if err := s.images.admit([sha256.Size]byte(sum), imageTicket{handle: handle, expires: req.Expires}, s.now()); err != nil {
		fail(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	answer(w, http.StatusOK, ImageAnswer{Manifest: img.manifestDigest, Size: img.size})
}

// admit registers a ticket, dropping the expired ones when full.
func (im *images) admit(sum [sha256.Size]byte, t imageTicket, now time.Time) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	if len(im.tickets) >= maxImageTickets {
		for k, old := range im.tickets {
			if !old.expires.After(now) {
				delete(im.tickets, k)
			}
		}
	}
	if len(im.tickets) >= maxImageTickets {
		return fmt.Errorf("%d image tickets wait already: try again once some expire", maxImageTickets)
	}
	im.tickets[sum] = t
	return nil
}

// image is the image of folder sub of the volume at base, made once
// while the volume is not written; code is the status of its error.
func (s *Server) image(handle, base, sub string) (*image, int, error) {
	im := s.images
	im.mu.Lock()
	img, epoch := im.byVol[handle], im.epoch
	im.mu.Unlock()
	if img != nil && img.path == sub {
		return img, 0, nil
	}
	v, err, _ := im.making.Do(handle+"\x00"+sub, func() (any, error) {
		img, err := makeImage(base, sub)
		if err != nil {
			return nil, err
		}
		im.mu.Lock()
		defer im.mu.Unlock()
		im.walks++
		if im.epoch == epoch {
			im.byVol[handle] = img
		}
		return img, nil
	})
	if err != nil {
		code := http.StatusUnprocessableEntity
		var nf notFolder
		if errors.As(err, &nf) || errors.Is(err, fs.ErrNotExist) {
			code = http.StatusNotFound
		}
		return nil, code, err
	}
	return v.(*image), 0, nil
}

// notFolder: the path to serve is no folder.
type notFolder string

func (e notFolder) Error() string { return string(e) + " is no folder: an image's rootfs is one" }

// makeImage reads the folder sub of the volume at base once, for its
// layer's digest and size, and makes the config and manifest.
func makeImage(base, sub string) (*image, error) {
	vol, err := os.OpenRoot(base)
	if err != nil {
		return nil, err
	}
	defer vol.Close()
	info, err := vol.Lstat(sub)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, notFolder(filepath.ToSlash(sub))
	}
	meta, err := imageMetadata(vol, filepath.Dir(sub))
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	n := &countingWriter{w: h}
	if err := writeTar(n, vol, sub); err != nil {
		return nil, err
	}
	img := &image{path: sub, layer: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: n.n}
	img.config, _ = json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		// No User: it would be the container's, its pid 1 (jetway's agent)
		// included; the web node runs each process as metadata.json's
		// user itself, as on a stock worker.
		"config": map[string]any{"Env": meta.Env},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{img.layer}},
	})
	configSum := sha256.Sum256(img.config)
	img.manifest, _ = json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": ManifestType,
		"config": descriptor{MediaType: ConfigType, Digest: "sha256:" + hex.EncodeToString(configSum[:]), Size: int64(len(img.config))},
		"layers": []descriptor{{MediaType: LayerType, Digest: img.layer, Size: img.size}},
	})
	manifestSum := sha256.Sum256(img.manifest)
	img.manifestDigest = "sha256:" + hex.EncodeToString(manifestSum[:])
	return img, nil
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// imageMeta is what Concourse's metadata.json says of an image that an
// image's config carries.
type imageMeta struct {
	Env []string `json:"env"`
}

// imageMetadata reads metadata.json in folder dir of vol: none is no env
// and no user.
func imageMetadata(vol *os.Root, dir string) (imageMeta, error) {
	var m imageMeta
	name := filepath.Join(dir, "metadata.json")
	f, err := vol.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxImageMetadata+1))
	if err != nil {
		return m, err
	}
	if len(b) > maxImageMetadata {
		return m, fmt.Errorf("%s is past %d bytes", filepath.ToSlash(name), maxImageMetadata)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", filepath.ToSlash(name), err)
	}
	return m, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

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
	srv := &http.Server{Handler: s.track(mux), ReadHeaderTimeout: 30 * time.Second}
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
		img := im.byVol[t.handle]
		im.mu.Unlock()
		switch {
		case !found || !t.expires.After(s.now()):
		case handle == "":
			return img, true
		case handle == t.handle && img != nil:
			return img, true
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
	digest := r.PathValue("digest")
	switch digest {
	case img.layer:
	case configDigest(img):
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
	// Never more than the digest's size: a folder changed since makes a
	// layer the runtime refuses by its digest.
	_ = writeTar(&capped{w: w, left: img.size}, vol, img.path)
}

func configDigest(img *image) string {
	sum := sha256.Sum256(img.config)
	return "sha256:" + hex.EncodeToString(sum[:])
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
