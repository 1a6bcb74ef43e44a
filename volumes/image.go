package volumes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
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
// until the volume is written (stream-in, settle, lose, a create over
// it) or destroyed, and each pull tars the folder again, so no second
// copy is kept on disk. A cow volume made of hard links to its parent's
// files (a holder's, which the web node makes for each container of an
// image) has its parent's image without a pass of its own. A folder
// changed between the digest and a pull makes a layer of other bytes:
// the runtime checks the digest and refuses the pull, so a changed
// rootfs never runs as the image it was.
//
// The image API (ServeImages, registry.go) listens apart from the volume
// API: a NodePort exposes it and nothing else. It serves a pull that
// brings a ticket (ImageRequest) as its Basic password: a secret the
// token's holder registered, by its SHA-256, for one image of one
// volume and until a time.

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

// imageTries is how often a request makes an image whose volume is
// written meanwhile before it gives up (409).
const imageTries = 3

var (
	// errWritten: the volume was written while its image was made.
	errWritten = errors.New("the volume was written while its image was made: ask again")
	// errStopping: the server was killed during a walk.
	errStopping = errors.New("the volume server is stopping")
)

// image is a volume folder's image, as served.
type image struct {
	path           string // the folder, in the volume
	layer          string // its tar's digest
	size           int64
	config         []byte
	configDigest   string
	manifest       []byte
	manifestDigest string
}

// imageTicket opens one image of one volume until it expires.
type imageTicket struct {
	handle  string
	img     *image
	expires time.Time
}

// images are the images the server made and the tickets that open them.
type images struct {
	mu      sync.Mutex
	vols    map[string]*volImages // by volume handle
	tickets map[[sha256.Size]byte]imageTicket
	making  singleflight.Group
	made    uint64 // volImages made, to name each
	// walks counts the layer digests made; walked, if set, runs after
	// each, before its image is kept (tests).
	walks  int
	walked func()
}

// volImages are the images of one volume's files as they are now.
type volImages struct {
	id     uint64 // names its walks: one begun before a write is not joined after it
	byPath map[string]*image
	// written: the volume was written since (forget), and this is no
	// longer its: a walk that ends now keeps nothing.
	written bool
}

func newImages() *images {
	return &images{vols: map[string]*volImages{}, tickets: map[[sha256.Size]byte]imageTicket{}}
}

// of is volume handle's images, made if it has none; im.mu is held.
func (im *images) of(handle string) *volImages {
	v := im.vols[handle]
	if v == nil {
		im.made++
		v = &volImages{id: im.made, byPath: map[string]*image{}}
		im.vols[handle] = v
	}
	return v
}

// forget drops what was made of volume handle's files, and the tickets
// that open it: they changed, or the volume is gone.
func (im *images) forget(handle string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if v := im.vols[handle]; v != nil {
		v.written = true
		delete(im.vols, handle)
	}
	for k, t := range im.tickets {
		if t.handle == handle {
			delete(im.tickets, k)
		}
	}
}

// current is volume handle's images as they are now (nil: none), for
// inherit.
func (im *images) current(handle string) *volImages {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.vols[handle]
}

// inherit gives volume child, a copy of a parent whose images were
// parent (current) as the copy began, the parent's images if the parent
// was not written since: the copy's tar is the parent's, byte for byte
// (copiesExactly), so a container of each cow of an image's volume
// costs no reading pass.
func (im *images) inherit(child string, parent *volImages) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if parent == nil || parent.written || len(parent.byPath) == 0 {
		return
	}
	im.made++
	im.vols[child] = &volImages{id: im.made, byPath: maps.Clone(parent.byPath)}
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
		fail(w, http.StatusBadRequest, `body must be {"path": "...", "ticket_sha256": "<hex>", "expires": "<RFC 3339 time>"}: %v`, err)
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
	var img *image
	for range imageTries {
		if img, err = s.image(handle, base, sub); err == nil {
			err = s.images.admit([sha256.Size]byte(sum), imageTicket{handle: handle, img: img, expires: req.Expires}, s.now())
		}
		if !errors.Is(err, errWritten) {
			break
		}
	}
	if err != nil {
		fail(w, imageStatus(err), "volume %s, %s: %v", handle, req.Path, err)
		return
	}
	answer(w, http.StatusOK, ImageAnswer{Manifest: img.manifestDigest, Size: img.size})
}

// imageStatus is the status that answers a request for an image that
// failed with err.
func imageStatus(err error) int {
	var nf notFolder
	switch {
	case errors.As(err, &nf) || errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, errWritten):
		return http.StatusConflict
	case errors.Is(err, errTooManyTickets) || errors.Is(err, errStopping):
		return http.StatusServiceUnavailable
	default: // metadata.json, or an entry that cannot be read
		return http.StatusUnprocessableEntity
	}
}

var errTooManyTickets = fmt.Errorf("%d image tickets wait already: try again once some expire", maxImageTickets)

// admit registers ticket t for its image, if that is still its volume's
// (errWritten if not), dropping the expired tickets when full.
func (im *images) admit(sum [sha256.Size]byte, t imageTicket, now time.Time) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	if v := im.vols[t.handle]; v == nil || v.byPath[t.img.path] != t.img {
		return errWritten
	}
	if len(im.tickets) >= maxImageTickets {
		for k, old := range im.tickets {
			if !old.expires.After(now) {
				delete(im.tickets, k)
			}
		}
	}
	if len(im.tickets) >= maxImageTickets {
		return errTooManyTickets
	}
	im.tickets[sum] = t
	return nil
}

// image is the image of folder sub of the volume handle at base, made
// once while the volume is not written: concurrent first requests share
// one walk. errWritten if the volume was written during the walk.
func (s *Server) image(handle, base, sub string) (*image, error) {
	im := s.images
	im.mu.Lock()
	v := im.of(handle)
	img := v.byPath[sub]
	im.mu.Unlock()
	if img != nil {
		return img, nil
	}
	made, err, _ := im.making.Do(strconv.FormatUint(v.id, 10)+"\x00"+sub, func() (any, error) {
		img, err := makeImage(base, sub, s.stop)
		if err != nil {
			return nil, err
		}
		im.mu.Lock()
		im.walks++
		walked := im.walked
		im.mu.Unlock()
		if walked != nil {
			walked()
		}
		im.mu.Lock()
		defer im.mu.Unlock()
		if v.written {
			return nil, errWritten
		}
		v.byPath[sub] = img
		return img, nil
	})
	if err != nil {
		return nil, err
	}
	return made.(*image), nil
}

// notFolder: the path to serve is no folder.
type notFolder string

func (e notFolder) Error() string { return string(e) + " is no folder: an image's rootfs is one" }

// makeImage reads the folder sub of the volume at base once, for its
// layer's digest and size, and makes the config and manifest; it stops
// when stop closes.
func makeImage(base, sub string, stop <-chan struct{}) (*image, error) {
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
	// One pass, through the hash alone: the layer is never held.
	h := sha256.New()
	n := &countingWriter{w: h, stop: stop}
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
	img.configDigest = ociDigest(img.config)
	img.manifest, _ = json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": ManifestType,
		"config": descriptor{MediaType: ConfigType, Digest: img.configDigest, Size: int64(len(img.config))},
		"layers": []descriptor{{MediaType: LayerType, Digest: img.layer, Size: img.size}},
	})
	img.manifestDigest = ociDigest(img.manifest)
	return img, nil
}

// ociDigest is b's OCI digest.
func ociDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
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

// countingWriter counts what it writes to w, and fails once stop is
// closed: a walk of a large rootfs ends with its server.
type countingWriter struct {
	w    io.Writer
	n    int64
	stop <-chan struct{}
}

func (c *countingWriter) Write(p []byte) (int, error) {
	select {
	case <-c.stop:
		return 0, errStopping
	default:
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
