// Package atomicfile replaces files whole, so that a reader watching one
// (the gateway's targets directory, the mesh's certificate files) sees the
// old content or the new, never half of it.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Write replaces path with data: a temporary file beside it, given mode
// before anything is written, synced, then renamed over path.
func Write(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, there is nothing to remove
	err = errors.Join(f.Chmod(mode), writeAll(f, data), f.Sync(), f.Close())
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func writeAll(f *os.File, data []byte) error {
	_, err := f.Write(data)
	return err
}
