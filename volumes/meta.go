package volumes

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jetway-ci/jetway/internal/atomicfile"
)

// A volume's metadata (its properties, whether it is privileged, what it
// imports) is kept apart from its files, in root/meta/<handle>.json, so
// the volume's folder holds its files alone and a server restarted over
// the same root answers the same. A volume without a meta file (a step
// pod's, which the step agent links into the build dir) has no
// properties and is not privileged.

// meta is what root/meta/<handle>.json holds.
type meta struct {
	Properties map[string]string `json:"properties"`
	Privileged bool              `json:"privileged,omitempty"`
	ImportPath string            `json:"import_path,omitempty"`
	// Held: the volume's files are in a step pod's mount (held.go).
	Held *Held `json:"held,omitempty"`
	// Lost: the volume's files went with the pod that held them, and why
	// (held.go); the volume is no more, its metadata says so a while.
	Lost string `json:"lost,omitempty"`
}

// Bounds of what one request may ask to keep, so that a request cannot
// fill the server's memory or its disk with metadata. Concourse's own
// properties are a handful of short strings per volume.
const (
	maxBody          = 1 << 20
	maxProperties    = 64
	maxPropertyName  = 256
	maxPropertyBytes = 64 << 10 // all of a volume's values together
)

// Prefixes of the server's temporary names: a volume being made, a
// volume being removed. Names starting with a dot are never volumes, nor
// metadata (atomicfile's temporary files start with one).
const (
	creating = ".create-"
	deleting = ".delete-"
)

func (s *Server) metaPath(handle string) string {
	return filepath.Join(s.root, "meta", handle+".json")
}

// readMeta reads a volume's metadata; a volume without any has none.
func (s *Server) readMeta(handle string) (meta, error) {
	var m meta
	b, err := os.ReadFile(s.metaPath(handle))
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return meta{}, fmt.Errorf("read volume %q's metadata: %w", handle, err)
	}
	if m.Properties == nil {
		m.Properties = map[string]string{}
	}
	return m, nil
}

// writeMeta replaces a volume's metadata in one step (atomicfile): a
// reader, or a server restarted after a kill, finds the old file or the
// new one, never a part of one.
func (s *Server) writeMeta(handle string, m meta) error {
	dir := filepath.Join(s.root, "meta")
	b, err := json.Marshal(m)
	if err == nil {
		err = s.space.setMeta(handle, int64(len(b)))
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = atomicfile.Write(s.metaPath(handle), b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write volume %q's metadata: %w", handle, err)
	}
	return nil
}

func (s *Server) removeMeta(handle string) error {
	if err := os.Remove(s.metaPath(handle)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove volume %q's metadata: %w", handle, err)
	}
	return nil
}

// checkProperties says which bound properties go past, if one.
func checkProperties(p map[string]string) error {
	if len(p) > maxProperties {
		return fmt.Errorf("%d properties are past the limit of %d a volume may have", len(p), maxProperties)
	}
	total := 0
	for name, value := range p {
		if len(name) > maxPropertyName {
			return fmt.Errorf("a property name of %d bytes is past the limit of %d bytes", len(name), maxPropertyName)
		}
		total += len(value)
	}
	if total > maxPropertyBytes {
		return fmt.Errorf("property values of %d bytes in all are past the limit of %d bytes", total, maxPropertyBytes)
	}
	return nil
}

// sweep removes what a server killed mid-change left behind: volumes
// half made or half removed, metadata half written. It runs before the
// server serves: one server serves a root at a time. What it cannot
// remove stays, as garbage that no answer shows.
func sweep(root string) {
	for dir, prefixes := range map[string][]string{
		filepath.Join(root, "volumes"): {creating, deleting},
		filepath.Join(root, "meta"):    {"."},
	} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			for _, p := range prefixes {
				if strings.HasPrefix(e.Name(), p) {
					_ = os.RemoveAll(filepath.Join(dir, e.Name()))
				}
			}
		}
	}
}
