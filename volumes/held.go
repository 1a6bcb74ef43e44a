package volumes

import (
	"archive/tar"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A volume a step pod's process wrote is not copied back into the server
// after the process: its files stay in the pod's mount, and the server
// keeps, beside the copy it had when they were copied in, where they are
// now (Held). Whoever reads the volume first (a stream-out, a copy of it,
// a container that mounts it) copies them in once, into a new volume,
// and settles: that volume's files become the held volume's, in one
// step, and it is held no more. A volume destroyed while held is never
// copied at all: a copy of a task's input, which nobody reads after the
// task, costs nothing more than its copy into the pod.

// Held is where a held volume's files are: mount Mount of the pod Pod
// whose UID is UID, the pod of container Container.
type Held struct {
	Pod       string `json:"pod"`
	UID       string `json:"uid"`
	Mount     string `json:"mount"`
	Container string `json:"container,omitempty"`
}

// HeldHeader, on the answer to a destroy, says the volume was held: its
// files, in a pod, were never copied back.
const HeldHeader = "X-Jetway-Held"

// SettleRequest is the body of POST /volumes/{handle}/settle: the
// volume From, a copy of the files of the pod that holds the volume
// handle (UID), becomes handle's files.
type SettleRequest struct {
	From string `json:"from"`
	UID  string `json:"uid"`
}

// hold records where the request's volume's files are now.
func (s *Server) hold(w http.ResponseWriter, r *http.Request) {
	var h Held
	if err := decode(w, r, &h); err != nil || h.Pod == "" || h.UID == "" || h.Mount == "" {
		fail(w, http.StatusBadRequest, `body must be {"pod": "...", "uid": "...", "mount": "...", "container": "..."}: %v`, err)
		return
	}
	s.change(w, r, func(m *meta) error {
		m.Held = &h
		return nil
	})
}

// settle makes the volume req.From's files those of the request's
// volume, held by the pod req.UID, and takes req.From away: 409 if the
// volume is not held by that pod (another caller settled it first, or
// another pod holds it now), and the caller removes its copy.
func (s *Server) settle(w http.ResponseWriter, r *http.Request) {
	var req SettleRequest
	if err := decode(w, r, &req); err != nil || !validHandle(req.From) || req.UID == "" {
		fail(w, http.StatusBadRequest, `body must be {"from": "<volume>", "uid": "<pod UID>"}: %v`, err)
		return
	}
	h := r.PathValue("handle")
	gone, charged, err := s.swap(h, req.From, req.UID)
	if gone != "" {
		_ = s.removeGone(gone, charged)
	}
	var code int
	switch {
	case errors.Is(err, errNoVolume):
		code = http.StatusNotFound
	case errors.Is(err, errNotHeld):
		code = http.StatusConflict
	case err != nil:
		code = http.StatusInternalServerError
	default:
		w.WriteHeader(http.StatusNoContent)
		return
	}
	fail(w, code, "settle volume %q: %v", h, err)
}

var errNotHeld = errors.New("not held by that pod")

// swap puts from's folder in place of handle's, which it returns for the
// caller to remove, with the bytes its files are charged; handle keeps
// its metadata, held no more, and from goes, with its own.
func (s *Server) swap(handle, from, uid string) (string, int64, error) {
	s.vols.Lock()
	defer s.vols.Unlock()
	if !s.exists(handle) || !s.exists(from) {
		return "", 0, fmt.Errorf("%w: %q or %q", errNoVolume, handle, from)
	}
	m, err := s.readMeta(handle)
	if err != nil {
		return "", 0, err
	}
	if m.Held == nil || m.Held.UID != uid {
		return "", 0, errNotHeld
	}
	for _, h := range []string{handle, from} {
		if fi, err := os.Lstat(s.Path(h)); err != nil || !fi.IsDir() {
			return "", 0, fmt.Errorf("volume %q is not a folder of the server's", h)
		}
	}
	gone, err := os.MkdirTemp(filepath.Join(s.root, "volumes"), deleting)
	if err != nil {
		return "", 0, err
	}
	if err := os.Rename(s.Path(handle), filepath.Join(gone, "volume")); err != nil {
		return gone, 0, err
	}
	if err := os.Rename(s.Path(from), s.Path(handle)); err != nil {
		// handle's old files go back: it stays as it was, but settled.
		return gone, 0, errors.Join(err, os.Rename(filepath.Join(gone, "volume"), s.Path(handle)))
	}
	charged := s.space.swap(handle, from)
	s.images.forget(handle)
	// Held still, if this fails: a later settle copies the pod's files
	// again, which costs a copy and loses nothing.
	m.Held = nil
	if err := s.writeMeta(handle, m); err != nil {
		return gone, charged, err
	}
	if err := s.removeMeta(from); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return gone, charged, err
	}
	return gone, charged, nil
}

// LoseRequest is the body of POST /volumes/{handle}/lose: why the
// volume's files are gone.
type LoseRequest struct {
	Why string `json:"why"`
}

// lostFor is how long a lost volume's metadata says why it is gone: the
// web node, told at its next sweep that the volume is missing, stops
// using it well before.
const lostFor = time.Hour

// lose takes the request's volume away, held by a pod that is gone: its
// files go, and its metadata stays a while to say why, so that whoever
// asks for it learns (410 Gone) what became of it.
func (s *Server) lose(w http.ResponseWriter, r *http.Request) {
	var req LoseRequest
	if err := decode(w, r, &req); err != nil || req.Why == "" {
		fail(w, http.StatusBadRequest, `body must be {"why": "..."}: %v`, err)
		return
	}
	h := r.PathValue("handle")
	gone, charged, err := s.unlink(h)
	if errors.Is(err, errNoVolume) {
		fail(w, http.StatusNotFound, "volume %q not found", h)
		return
	}
	if gone != "" {
		err = errors.Join(err, s.removeGone(gone, charged))
	}
	if err == nil {
		s.forgetLost()
		err = s.writeMeta(h, meta{Lost: req.Why})
	}
	if err != nil {
		fail(w, http.StatusInternalServerError, "lose volume %q: %v", h, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forgetLost removes what lost volumes' metadata is older than lostFor.
func (s *Server) forgetLost() {
	entries, _ := os.ReadDir(filepath.Join(s.root, "meta"))
	for _, e := range entries {
		h, ok := strings.CutSuffix(e.Name(), ".json")
		if info, err := e.Info(); !ok || err != nil || time.Since(info.ModTime()) < lostFor || s.exists(h) {
			continue
		}
		if m, err := s.readMeta(h); err == nil && m.Lost != "" {
			_ = s.removeMeta(h)
			s.space.forget(h, false)
		}
	}
}

// notFound answers that what names handle is not found, or 410 Gone with
// why if it is a volume lost with its pod.
func (s *Server) notFound(w http.ResponseWriter, handle, what string) {
	if validHandle(handle) {
		if m, err := s.readMeta(handle); err == nil && m.Lost != "" {
			fail(w, http.StatusGone, "%s %q is lost: %s", what, handle, m.Lost)
			return
		}
	}
	fail(w, http.StatusNotFound, "%s %q not found", what, handle)
}

// CheckedHeader, on the answer to a check, says the bytes of the files'
// contents the volume holds; CheckedEntriesHeader its entries.
const (
	CheckedHeader        = "X-Jetway-Checked-Bytes"
	CheckedEntriesHeader = "X-Jetway-Checked-Entries"
)

// check walks the request's volume as a stream-out would send it, and
// refuses, as this server's own stream-in would (a server of the same
// target has the same limits), an entry no stream-in takes: a device or
// FIFO where privileged steps are not allowed, a volume past the limits.
// It reads no file's contents: a pod's volume is checked so when its
// process ends, before it is held (so the step fails naming the entry at
// once, not the step that reads it later).
func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	dir, ok := s.resolve(r.PathValue("handle"))
	if !ok {
		fail(w, http.StatusNotFound, "volume %q not found", r.PathValue("handle"))
		return
	}
	vol, err := os.OpenRoot(dir)
	if err != nil {
		fail(w, http.StatusInternalServerError, "check: %v", err)
		return
	}
	defer vol.Close()
	lim := s.extractLimits(nil)
	n, bytes := 0, int64(0)
	seen := map[uint64]bool{} // files of several links: their content once
	err = fs.WalkDir(vol.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return entryError(p, err)
		}
		if p == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return entryError(p, err)
		}
		hdr := &tar.Header{Name: p, Typeflag: typeflagOf(info.Mode()), Size: info.Size()}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 && hdr.Typeflag == tar.TypeReg {
			if seen[st.Ino] { // one volume: one device
				hdr.Typeflag = tar.TypeLink
			}
			seen[st.Ino] = true
		}
		n++
		if err := lim.Admit(hdr, n, bytes); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			bytes += hdr.Size
		}
		return nil
	})
	if err != nil {
		// What a stream-in would refuse is refused for good, as an entry
		// the server may not read is.
		fail(w, cmp.Or(finalStatus(err), http.StatusBadRequest), "check volume %q: %v", r.PathValue("handle"), err)
		return
	}
	w.Header().Set(CheckedHeader, strconv.FormatInt(bytes, 10))
	w.Header().Set(CheckedEntriesHeader, strconv.Itoa(n))
	w.WriteHeader(http.StatusNoContent)
}

// typeflagOf is the tar type of an entry of mode m.
func typeflagOf(m fs.FileMode) byte {
	switch {
	case m.IsDir():
		return tar.TypeDir
	case m&fs.ModeSymlink != 0:
		return tar.TypeSymlink
	case m&fs.ModeNamedPipe != 0:
		return tar.TypeFifo
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		return tar.TypeChar
	case m&fs.ModeDevice != 0:
		return tar.TypeBlock
	}
	return tar.TypeReg
}
