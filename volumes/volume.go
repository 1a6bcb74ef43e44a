package volumes

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
)

// Volume is a volume as the server answers it: baggageclaim's
// VolumeResponse, and what an import volume imports.
type Volume struct {
	Handle     string            `json:"handle"`
	Path       string            `json:"path"`
	Properties map[string]string `json:"properties"`
	Privileged bool              `json:"privileged"`
	// ImportPath is an import volume's strategy path, as the request
	// named it (an image reference such as k8s-image://docker.io/x:1),
	// or its parent's for a cow: the server records it and reads nothing
	// there.
	ImportPath string `json:"import_path,omitempty"`
	// Held: the volume's files are in a step pod's mount, not yet copied
	// back (held.go).
	Held *Held `json:"held,omitempty"`
}

// CreateRequest is the body of POST /volumes: baggageclaim's
// VolumeRequest. Without a Strategy it only makes the volume's folder if
// it is missing, as the step pods' callers always asked.
type CreateRequest struct {
	Handle     string            `json:"handle"`
	Strategy   *Strategy         `json:"strategy,omitempty"`
	Properties map[string]string `json:"properties,omitempty"`
	Privileged bool              `json:"privileged,omitempty"`
}

// Strategy says what a new volume holds: nothing (StrategyEmpty), a copy
// of Volume's files (StrategyCOW), or nothing yet, with Path recorded as
// what it imports (StrategyImport).
type Strategy struct {
	Type   string `json:"type"`
	Volume string `json:"volume,omitempty"`
	Path   string `json:"path,omitempty"`
}

// The strategies' types.
const (
	StrategyEmpty  = "empty"
	StrategyCOW    = "cow"
	StrategyImport = "import"
)

// Headers of the answer to a create that copies a volume (a cow, an
// import of another volume): the bytes of the files it copied, and the
// entries it shared with the parent by hard links (SetLinkCopies), which
// it did not copy.
const (
	CopiedBytesHeader   = "X-Jetway-Copied-Bytes"
	LinkedEntriesHeader = "X-Jetway-Linked-Entries"
)

// exists reports whether handle is a volume: a folder or a link to one
// under root/volumes. Names starting with a dot are the server's own.
func (s *Server) exists(handle string) bool {
	if !validHandle(handle) {
		return false
	}
	fi, err := os.Lstat(s.Path(handle))
	return err == nil && (fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0)
}

func (s *Server) describe(handle string, m meta) Volume {
	return Volume{Handle: handle, Path: s.Path(handle), Properties: m.Properties,
		Privileged: m.Privileged, ImportPath: m.ImportPath, Held: m.Held}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := decode(w, r, &req); err != nil {
		fail(w, http.StatusBadRequest, `body must be {"handle": "...", "strategy": {"type": "..."}, "properties": {...}, "privileged": false}: %v`, err)
		return
	}
	if !validHandle(req.Handle) {
		fail(w, http.StatusBadRequest, "handle %q is not a volume's name", req.Handle)
		return
	}
	if err := checkProperties(req.Properties); err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	if req.Strategy == nil {
		s.ensure(w, req)
		return
	}
	switch st := req.Strategy; {
	case st.Type != StrategyEmpty && st.Type != StrategyCOW && st.Type != StrategyImport:
		fail(w, http.StatusUnprocessableEntity, "unknown strategy type %q (%s, %s, %s)", st.Type, StrategyEmpty, StrategyCOW, StrategyImport)
	case st.Type == StrategyCOW && st.Volume == "":
		fail(w, http.StatusBadRequest, "a cow strategy names its parent volume")
	case st.Type == StrategyImport && st.Path == "":
		fail(w, http.StatusBadRequest, "an import strategy names its path")
	default:
		s.makeVolume(w, r, req)
	}
}

// ensure makes the volume's folder if it is missing, and keeps the
// properties and privilege if the request has any: POST /volumes
// without a strategy, as the step pods' callers always used it.
func (s *Server) ensure(w http.ResponseWriter, req CreateRequest) {
	s.vols.Lock()
	defer s.vols.Unlock()
	c := s.space.claim(req.Handle)
	defer c.drop()
	if !s.exists(req.Handle) {
		if err := c.folders(1); err != nil {
			fail(w, writeStatus(err), "create volume: %v", err)
			return
		}
	}
	if err := os.MkdirAll(s.Path(req.Handle), 0o755); err != nil {
		fail(w, http.StatusInternalServerError, "create volume: %v", err)
		return
	}
	c.keep(0)
	m, err := s.readMeta(req.Handle)
	if err == nil && (req.Properties != nil || req.Privileged) {
		m.Properties, m.Privileged = orEmpty(req.Properties), req.Privileged
		err = s.writeMeta(req.Handle, m)
	}
	if err != nil {
		fail(w, writeStatus(err), "%v", err)
		return
	}
	answer(w, http.StatusCreated, s.describe(req.Handle, m))
}

// makeVolume makes a new volume as its strategy says. It fills a temporary
// folder of root/volumes and renames it into place, so a half-made
// volume never shows; the lock is held only around that rename, not
// while a copy runs.
func (s *Server) makeVolume(w http.ResponseWriter, r *http.Request, req CreateRequest) {
	h, st := req.Handle, req.Strategy
	if !s.reserve(h) {
		fail(w, http.StatusConflict, "volume %q exists", h)
		return
	}
	defer s.release(h)
	if err := os.MkdirAll(filepath.Join(s.root, "volumes"), 0o755); err != nil {
		fail(w, http.StatusInternalServerError, "create volume: %v", err)
		return
	}
	// What the new volume takes is claimed as it is written, and kept
	// once it is in place.
	c := s.space.claim(h)
	defer c.drop()
	if err := c.folders(1); err != nil {
		fail(w, writeStatus(err), "create volume: %v", err)
		return
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "volumes"), creating)
	if err != nil {
		fail(w, http.StatusInternalServerError, "create volume: %v", err)
		return
	}
	committed := false
	defer func() {
		if !committed {
			_ = os.RemoveAll(tmp)
		}
	}()
	var done copied
	// A copy-on-write copies its parent; so does an import of another
	// volume's path (a web node keeps a task's cache so: an import of
	// the cache the task wrote).
	parentHandle := st.Volume
	if st.Type == StrategyImport {
		parentHandle = s.volumeAt(st.Path)
	}
	// The parent's images as the copy begins: a cow inherits them if
	// the parent is not written meanwhile.
	parentImages := s.images.current(parentHandle)
	if parentHandle != "" {
		parent, ok := s.resolve(parentHandle)
		if !ok {
			s.notFound(w, parentHandle, "parent volume")
			return
		}
		if done, err = s.copyVolume(r.Context(), parent, tmp, c); err != nil {
			fail(w, writeStatus(err), "copy volume %q: %v", parentHandle, err)
			return
		}
	} else if err := os.Chmod(tmp, 0o777); err != nil { // steps run as any user
		fail(w, http.StatusInternalServerError, "create volume: %v", err)
		return
	}
	// A parent's properties stay its own, as in baggageclaim; what it
	// imports is what its copy imports (a base type's image, copied for
	// each container that runs it).
	m := meta{Properties: orEmpty(req.Properties), Privileged: req.Privileged}
	switch {
	case st.Type == StrategyImport && parentHandle == "":
		m.ImportPath = st.Path
	case st.Type == StrategyCOW:
		if pm, err := s.readMeta(st.Volume); err == nil {
			m.ImportPath = pm.ImportPath
		}
	}
	if err := s.commit(h, tmp, m, c); err != nil {
		fail(w, writeStatus(err), "create volume: %v", err)
		return
	}
	committed = true
	// Whatever was made of a volume of this handle before was of other
	// files.
	s.images.forget(h)
	if st.Type == StrategyCOW && s.copiesExactly() {
		s.images.inherit(h, parentImages)
	}
	if parentHandle != "" {
		w.Header().Set(CopiedBytesHeader, strconv.FormatInt(done.bytes, 10))
		w.Header().Set(LinkedEntriesHeader, strconv.Itoa(done.linked))
	}
	answer(w, http.StatusCreated, s.describe(h, m))
}

// orEmpty is p, or no properties for nil: a Volume's properties are an
// object, never null.
func orEmpty(p map[string]string) map[string]string {
	if p == nil {
		return map[string]string{}
	}
	return p
}

// reserve takes handle for a create, if it is neither a volume nor being
// made; release gives it back.
func (s *Server) reserve(handle string) bool {
	s.vols.Lock()
	defer s.vols.Unlock()
	if s.making[handle] || s.exists(handle) {
		return false
	}
	s.making[handle] = true
	return true
}

func (s *Server) release(handle string) {
	s.vols.Lock()
	defer s.vols.Unlock()
	delete(s.making, handle)
}

// commit makes the folder tmp the volume handle, with its metadata
// written first: a volume never shows without it. What c claimed is the
// volume's, given back if it does not come to be.
func (s *Server) commit(handle, tmp string, m meta, c *claim) error {
	s.vols.Lock()
	defer s.vols.Unlock()
	c.keep(0)
	if err := s.writeMeta(handle, m); err != nil {
		s.forgetMade(handle, tmp)
		return err
	}
	if err := os.Rename(tmp, s.Path(handle)); err != nil {
		s.forgetMade(handle, tmp)
		return errors.Join(err, s.removeMeta(handle))
	}
	return nil
}

// forgetMade takes the volume handle, which did not come to be, out of
// the account, and removes tmp, its files, at once.
func (s *Server) forgetMade(handle, tmp string) {
	_ = s.removeGone(tmp, s.space.forget(handle, true))
}

// removeGone removes the folder gone, of a volume taken away, and gives
// back what it took: the contents of the files whose last link it
// removed, and what the volume was charged for its folders, names and
// links (charged) once all of it is gone; what stays is charged until a
// restart's sweep.
func (s *Server) removeGone(gone string, charged int64) error {
	_, contents, err := s.space.removeFolder(gone)
	if err == nil {
		s.space.free(charged)
	}
	s.space.free(contents)
	return err
}

// resolve is the folder holding a volume's files, through the link a
// step's volume is.
// volumeAt is the handle of the volume whose path (as answered) path is,
// or "".
func (s *Server) volumeAt(path string) string {
	dir, handle := filepath.Split(filepath.Clean(path))
	if filepath.Clean(dir) != filepath.Join(s.root, "volumes") || !validHandle(handle) {
		return ""
	}
	return handle
}

func (s *Server) resolve(handle string) (string, bool) {
	if !s.exists(handle) {
		return "", false
	}
	dir, err := filepath.EvalSymlinks(s.Path(handle))
	if err != nil {
		return "", false
	}
	fi, err := os.Stat(dir)
	return dir, err == nil && fi.IsDir()
}

// list answers the volumes whose properties include every name=value
// pair of the query, sorted by handle.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	want := r.URL.Query()
	for name, values := range want {
		if len(values) > 1 {
			fail(w, http.StatusUnprocessableEntity, "a property may only have one value: %s has %d", name, len(values))
			return
		}
	}
	entries, err := os.ReadDir(filepath.Join(s.root, "volumes"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fail(w, http.StatusInternalServerError, "list volumes: %v", err)
		return
	}
	found := []Volume{}
	for _, e := range entries { // sorted by name
		if !s.exists(e.Name()) {
			continue
		}
		m, err := s.readMeta(e.Name())
		if err != nil {
			fail(w, http.StatusInternalServerError, "%v", err)
			return
		}
		if matches(m.Properties, want) {
			found = append(found, s.describe(e.Name(), m))
		}
	}
	answer(w, http.StatusOK, found)
}

func matches(have map[string]string, want map[string][]string) bool {
	for name, values := range want {
		if v, ok := have[name]; !ok || v != values[0] {
			return false
		}
	}
	return true
}

// lookup reads the request's volume's metadata, or answers 404 or 500.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (string, meta, bool) {
	h := r.PathValue("handle")
	if !s.exists(h) {
		s.notFound(w, h, "volume")
		return h, meta{}, false
	}
	m, err := s.readMeta(h)
	if err != nil {
		fail(w, http.StatusInternalServerError, "%v", err)
		return h, meta{}, false
	}
	return h, m, true
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	if h, m, ok := s.lookup(w, r); ok {
		answer(w, http.StatusOK, s.describe(h, m))
	}
}

func (s *Server) getPrivileged(w http.ResponseWriter, r *http.Request) {
	if _, m, ok := s.lookup(w, r); ok {
		answer(w, http.StatusOK, m.Privileged)
	}
}

// destroy removes a volume: a step's link alone, not the folder it links
// to; a folder moved out of the way at once and removed after, so the
// lock is not held while a big volume's files go.
func (s *Server) destroy(w http.ResponseWriter, r *http.Request) {
	h := r.PathValue("handle")
	held := false
	if m, err := s.readMeta(h); err == nil && m.Held != nil {
		held = true
	}
	gone, charged, err := s.unlink(h)
	if errors.Is(err, errNoVolume) {
		if s.removeMeta(h) == nil { // a lost volume's, if it is one
			s.space.forget(h, false)
		}
		fail(w, http.StatusNotFound, "volume %q not found", h)
		return
	}
	if gone != "" {
		err = errors.Join(err, s.removeGone(gone, charged))
	}
	if err != nil {
		fail(w, http.StatusInternalServerError, "destroy volume %q: %v", h, err)
		return
	}
	if held {
		w.Header().Set(HeldHeader, "true")
	}
	w.WriteHeader(http.StatusNoContent)
}

var errNoVolume = errors.New("no such volume")

// unlink takes the volume handle away, with its metadata: a link is
// removed, a folder moved into a temporary folder, returned for the
// caller to remove even with an error, with the bytes its folders, names
// and links are charged, to free once they are gone.
func (s *Server) unlink(handle string) (string, int64, error) {
	s.vols.Lock()
	defer s.vols.Unlock()
	if !s.exists(handle) {
		return "", 0, errNoVolume
	}
	path := s.Path(handle)
	fi, err := os.Lstat(path)
	if err != nil {
		return "", 0, err
	}
	gone := ""
	link := fi.Mode()&fs.ModeSymlink != 0
	if link {
		err = os.Remove(path)
	} else if gone, err = os.MkdirTemp(filepath.Dir(path), deleting); err == nil {
		if err = os.Rename(path, filepath.Join(gone, "volume")); err != nil {
			_ = os.Remove(gone)
			gone = ""
		}
	}
	if err != nil {
		return "", 0, err
	}
	s.images.forget(handle)
	// A link's folder stays, and what it takes with it.
	charged := s.space.forget(handle, !link)
	return gone, charged, s.removeMeta(handle)
}

// change applies edit to the request's volume's metadata and keeps it,
// answering 204, or says why not.
func (s *Server) change(w http.ResponseWriter, r *http.Request, edit func(*meta) error) {
	s.vols.Lock()
	defer s.vols.Unlock()
	h, m, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if err := edit(&m); err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	if err := s.writeMeta(h, m); err != nil {
		fail(w, writeStatus(err), "%v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setProperty(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Value string `json:"value"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, http.StatusBadRequest, `body must be {"value": "..."}: %v`, err)
		return
	}
	s.change(w, r, func(m *meta) error {
		m.Properties[r.PathValue("name")] = req.Value
		return checkProperties(m.Properties)
	})
}

func (s *Server) setPrivileged(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Value bool `json:"value"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, http.StatusBadRequest, `body must be {"value": true or false}: %v`, err)
		return
	}
	s.change(w, r, func(m *meta) error {
		m.Privileged = req.Value
		return nil
	})
}
