package stepagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Errors the commands exit with their own codes for.
var (
	ErrSpecDiffers = errors.New("a different spec is already prepared")
	ErrNotPrepared = errors.New("no spec prepared")
	ErrNotStarted  = errors.New("prepared, but the process was never started")
)

// RootDir is where the agent keeps everything: $JETWAY_STEP_ROOT, else Root.
func RootDir() string {
	if r := os.Getenv(RootEnv); r != "" {
		return r
	}
	return Root
}

// ReadStdin reads n bytes of stdin: a kwok node never closes an exec's
// stdin, so the agent never waits for its end.
func ReadStdin(n int) ([]byte, error) { return readExactly(os.Stdin, n) }

func readExactly(r io.Reader, n int) ([]byte, error) {
	if n < 0 || n > 64<<20 {
		return nil, fmt.Errorf("%d bytes is not a sensible size", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read %d bytes of stdin: %w", n, err)
	}
	return b, nil
}

// Prepare writes the spec once and lays out the build dir and the
// volumes: build/<path> for each volume, and volumes/<handle> linking to
// it, for the sidecar. The same spec again changes nothing.
func Prepare(root string, raw []byte) error {
	var sp Spec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sp); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if err := sp.validate(); err != nil {
		return err
	}
	canon, _ := json.Marshal(sp)
	for _, dir := range []string{"run", BuildDir, VolumesDir, path.Join(BuildDir, sp.Dir)} {
		if err := mkdirOpen(Path(root, dir)); err != nil {
			return err
		}
	}
	if err := writeOnce(Path(root, SpecFile), canon); err != nil {
		return err
	}
	for _, v := range sp.Volumes {
		if err := mkdirOpen(Path(root, path.Join(BuildDir, v.Path))); err != nil {
			return err
		}
		link, target := Path(root, path.Join(VolumesDir, v.Handle)), filepath.Join("..", BuildDir, filepath.FromSlash(v.Path))
		if err := os.Symlink(target, link); err != nil {
			if have, rerr := os.Readlink(link); rerr != nil || have != target {
				return fmt.Errorf("volume %s: %w", v.Handle, err)
			}
		}
	}
	return nil
}

// mkdirOpen makes a folder anyone may write: the sidecar runs as its own
// user, the step as the image's.
func mkdirOpen(dir string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	return os.Chmod(dir, 0o777)
}

// writeOnce creates file with b, atomically; if it exists it must hold b.
func writeOnce(file string, b []byte) error {
	tmp := fmt.Sprintf("%s.%d.tmp", file, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	defer os.Remove(tmp)
	err := os.Link(tmp, file)
	if errors.Is(err, os.ErrExist) {
		have, rerr := os.ReadFile(file)
		if rerr != nil {
			return rerr
		}
		if !bytes.Equal(have, b) {
			return ErrSpecDiffers
		}
		return nil
	}
	return err
}

func (sp *Spec) validate() error {
	if sp.Path == "" {
		return errors.New("spec: path is required")
	}
	if sp.Dir != "" && !inside(sp.Dir, true) && !(path.IsAbs(sp.Dir) && path.Clean(sp.Dir) == sp.Dir) {
		return fmt.Errorf("spec: dir %q must be a clean path inside the build dir, or an absolute one", sp.Dir)
	}
	seen := map[string]bool{}
	for _, v := range sp.Volumes {
		if v.Handle == "" || strings.ContainsAny(v.Handle, `/\`) || v.Handle == "." || v.Handle == ".." || seen[v.Handle] {
			return fmt.Errorf("spec: volume handle %q is empty, repeated or not a file name", v.Handle)
		}
		if !inside(v.Path, false) {
			return fmt.Errorf("spec: volume path %q must be a clean path inside the build dir", v.Path)
		}
		seen[v.Handle] = true
	}
	return nil
}

func inside(p string, dotOK bool) bool {
	return !path.IsAbs(p) && path.Clean(p) == p && p != ".." && !strings.HasPrefix(p, "../") && (dotOK || p != ".")
}

// ReadSpec reads the prepared spec.
func ReadSpec(root string) (Spec, error) {
	var sp Spec
	b, err := os.ReadFile(Path(root, SpecFile))
	if errors.Is(err, os.ErrNotExist) {
		return sp, ErrNotPrepared
	}
	if err != nil {
		return sp, err
	}
	return sp, json.Unmarshal(b, &sp)
}

// ReadStatus reads status.json; false when the step has not ended.
func ReadStatus(root string) (Status, bool, error) {
	var st Status
	b, err := os.ReadFile(Path(root, StatusFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	return st, true, json.Unmarshal(b, &st)
}

// writeAtomic replaces file with b: a reader sees the old file or the
// whole new one. There is no fsync: the files live in the pod's emptyDir,
// which a node crash takes with the pod (the step then ends "node lost"),
// and an fsync costs milliseconds on the path of every step's start and
// end (measured with make bench-steps).
func writeAtomic(file string, b []byte) error {
	tmp := fmt.Sprintf("%s.%d.tmp", file, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

func exists(file string) bool {
	_, err := os.Stat(file)
	return err == nil
}
