package tarsafe

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

// Limits bound what one archive may write into a folder: the bytes of its
// files' contents and its entries (files, folders and links). A zero
// field is its default.
type Limits struct {
	Bytes   int64
	Entries int
	// ForeignLinks keeps symbolic links whose target leaves the folder
	// (an image's rootfs links /bin/sh to /bin/busybox), for a folder
	// whose links only a container resolves, in its own root: the volume
	// sidecar's. Extract still writes nothing through them (os.Root
	// refuses), and whoever reads the folder on the host must read it
	// through an os.Root too. Off, such a link is an error.
	ForeignLinks bool
	// Reserve, if set, is asked before each entry is written, with its
	// header: an error stops the archive there, as a limit does, wrapped
	// with the entry's name. The volume server reserves the room the
	// entry takes on its disk (volumes.Capacity).
	Reserve func(*tar.Header) error
}

// The default limits: far beyond any build's artifact, near enough to
// stop an archive that would fill a disk (a few MiB of gzip can say
// 10 GiB of zeros).
const (
	DefaultMaxBytes   = 32 << 30
	DefaultMaxEntries = 1 << 20
)

func (l Limits) withDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = DefaultMaxBytes
	}
	if l.Entries <= 0 {
		l.Entries = DefaultMaxEntries
	}
	return l
}

// LimitError is an archive that goes past a limit: Entry is the entry at
// which it did.
type LimitError struct {
	Limit string // "bytes" or "entries"
	Max   int64
	Entry string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("tar entry %q goes past the limit of %d %s an archive may write", e.Entry, e.Max, e.Limit)
}

// Extracted is what an archive wrote.
type Extracted struct {
	Files, Entries int
	Bytes          int64
}

// Extract writes the tar stream r into dir, which exists: folders,
// regular files and symbolic links that resolve inside dir (any link,
// with lim.ForeignLinks). Everything
// is written through an os.Root of dir, so nothing leaves it, even by a
// link made earlier in the stream; a file or link replaces whatever was
// at its name, so nothing is written through a link. A name that leaves
// dir, a link pointing out of it, any other type (hard links, devices,
// FIFOs) or an archive past lim is an error naming the entry, and what it
// wrote so far stays: callers extract into a folder of their own and
// drop it on error.
//
// A tar cut at an entry boundary reads as a whole one: the framing
// around it (gzip's trailer, the HTTP body's length) must catch that.
func Extract(r io.Reader, dir string, lim Limits) (Extracted, error) {
	lim = lim.withDefaults()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Extracted{}, err
	}
	defer root.Close()
	var done Extracted
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return done, nil
		}
		if err != nil {
			return done, err
		}
		if done.Entries++; done.Entries > lim.Entries {
			return done, &LimitError{Limit: "entries", Max: int64(lim.Entries), Entry: hdr.Name}
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > lim.Bytes-done.Bytes {
			return done, &LimitError{Limit: "bytes", Max: lim.Bytes, Entry: hdr.Name}
		}
		if lim.Reserve != nil {
			if err := lim.Reserve(hdr); err != nil {
				return done, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
		}
		if err := extractEntry(root, tr, hdr, lim.ForeignLinks); err != nil {
			return done, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			done.Files++
			done.Bytes += hdr.Size
		}
	}
}

func extractEntry(root *os.Root, r io.Reader, hdr *tar.Header, foreignLinks bool) error {
	if !filepath.IsLocal(filepath.FromSlash(hdr.Name)) {
		return errors.New("the name leaves the folder")
	}
	name := path.Clean(hdr.Name)
	perm := fs.FileMode(hdr.Mode).Perm()
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name == "." {
			return nil // the folder itself keeps its mode
		}
		if err := root.MkdirAll(name, 0o755); err != nil {
			return err
		}
		// The owner keeps write access: the folder's entries come next.
		return root.Chmod(name, perm|0o700)
	case tar.TypeReg:
		if err := replace(root, name); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return err
		}
		// The header's size bounds the copy: tar's reader ends the entry
		// there.
		_, err = io.Copy(f, r)
		if err == nil {
			err = f.Chmod(perm) // not narrowed by the umask
		}
		return errors.Join(err, f.Close())
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return errors.New("symbolic link without a target")
		}
		if !foreignLinks && !LinkInside(name, hdr.Linkname) {
			return fmt.Errorf("symbolic link to %q leaves the folder", hdr.Linkname)
		}
		if err := replace(root, name); err != nil {
			return err
		}
		return root.Symlink(hdr.Linkname, name)
	}
	return fmt.Errorf("type %q is not a regular file, folder or symbolic link", hdr.Typeflag)
}

// replace makes way for a new file or link at name: its folder exists and
// nothing is at name, so the new one is never written through a link.
func replace(root *os.Root, name string) error {
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
