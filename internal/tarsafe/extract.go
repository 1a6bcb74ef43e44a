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
	"syscall"
	"time"
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
	// Owners gives each entry the numeric owner and group its header
	// names (lchown: a link's own), and keeps files' setuid and setgid
	// bits. It takes CAP_CHOWN, and CAP_FOWNER to set the mode and time
	// of, and hard-link to, a file another user then owns. Off, what is
	// written belongs to the extractor, and files lose setuid and setgid:
	// they would run as the extractor's user, not the writer's. So does
	// an entry whose owner the extractor's user namespace does not map.
	Owners bool
	// Devices writes device nodes and FIFOs (devices take CAP_MKNOD), for
	// a folder only privileged steps use. Off, such an entry is an error.
	Devices bool
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

// Extracted is what an archive wrote: Files counts regular files, hard
// links to them included; Bytes their contents.
type Extracted struct {
	Files, Entries int
	Bytes          int64
}

// Extract writes the tar stream r into dir, which exists, as a stock
// Concourse worker's GNU tar does: folders (empty ones too), regular
// files, hard links, symbolic links as written (that resolve inside dir,
// or any with lim.ForeignLinks), and with lim.Devices device nodes and
// FIFOs; each with its mode bits (setuid, setgid and sticky included,
// but see Limits.Owners), its modification time (a link's own) and, with
// lim.Owners, its numeric owner and group. A folder's mode and time are
// set once the archive ended, so a 0500 folder can still be filled and
// its time is not changed by what goes in it; the folder dir itself (the
// entry ".") is the caller's and keeps its own. A hard link must name a
// regular file this archive wrote before it, by its name in the archive;
// it is made as a link, not a copy.
//
// Everything is written through an os.Root of dir, so nothing leaves it,
// even by a link made earlier in the stream; a file or link replaces
// whatever was at its name, so nothing is written through a link, and a
// file is written without setuid and setgid until its content and owner
// are final. A name that leaves dir, a link pointing out of it, a hard
// link to anything else, a type it does not take or an archive past lim
// is an error naming the entry and why, and what it wrote so far stays
// (its folders writable by their owner): callers extract into a folder
// of their own and drop it on error.
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
	x := &extractor{root: root, lim: lim, files: map[string]bool{}, dirAt: map[string]*folder{}}
	var done Extracted
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return done, x.finishFolders()
		}
		if err != nil {
			return done, err
		}
		done.Entries++
		if err := lim.admit(hdr, done.Entries, done.Bytes); err != nil {
			return done, err
		}
		if lim.Reserve != nil {
			if err := lim.Reserve(hdr); err != nil {
				return done, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
		}
		if err := x.entry(tr, hdr); err != nil {
			return done, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeLink {
			done.Files++
			done.Bytes += hdr.Size
		}
	}
}

// Admit refuses what Extract under l refuses of the entry hdr by its
// header alone, as the n-th entry of its archive after bytes bytes of
// files' contents: an archive past a limit, a device node or FIFO without
// Devices. It needs no folder (a sender checks what it would send);
// Extract refuses more, from the archive's other entries and the folder.
func (l Limits) Admit(hdr *tar.Header, n int, bytes int64) error {
	h := *hdr
	return l.withDefaults().admit(&h, n, bytes)
}

// admit is Admit with l's defaults set; it zeroes the size of what is no
// regular file, whatever its header says.
func (l Limits) admit(hdr *tar.Header, n int, bytes int64) error {
	if n > l.Entries {
		return &LimitError{Limit: "entries", Max: int64(l.Entries), Entry: hdr.Name}
	}
	if hdr.Typeflag != tar.TypeReg {
		hdr.Size = 0 // only a regular file has content
	}
	if hdr.Size > l.Bytes-bytes {
		return &LimitError{Limit: "bytes", Max: l.Bytes, Entry: hdr.Name}
	}
	if err := l.refuseNode(hdr.Typeflag); err != nil {
		return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
	}
	return nil
}

// refuseNode refuses a device node or FIFO without Devices.
func (l Limits) refuseNode(typeflag byte) error {
	kind := map[byte]string{tar.TypeChar: "a character device", tar.TypeBlock: "a block device", tar.TypeFifo: "a FIFO"}[typeflag]
	if kind == "" || l.Devices {
		return nil
	}
	return fmt.Errorf("%s, and this folder takes no devices or FIFOs", kind)
}

// extractor is one archive's extraction into root.
type extractor struct {
	root *os.Root
	lim  Limits
	// files are the regular files written so far, by clean name: what a
	// hard link may name.
	files map[string]bool
	// dirs are the folders whose attributes are set at the end, in the
	// order first written (a folder before its entries); dirAt finds
	// them by name.
	dirs  []*folder
	dirAt map[string]*folder
}

type folder struct {
	name string
	attrs
	gone bool // replaced by a later entry
}

// attrs is what an entry's header says of it besides its name and type.
type attrs struct {
	mode         fs.FileMode // permission, setuid, setgid and sticky bits
	uid, gid     int
	atime, mtime time.Time
}

func (x *extractor) attrsOf(hdr *tar.Header) attrs {
	a := attrs{
		mode:  hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky),
		uid:   hdr.Uid,
		gid:   hdr.Gid,
		atime: hdr.AccessTime,
		mtime: hdr.ModTime,
	}
	if !x.lim.Owners && hdr.Typeflag != tar.TypeDir {
		a.mode &^= fs.ModeSetuid | fs.ModeSetgid
	}
	if a.atime.IsZero() {
		a.atime = a.mtime
	}
	return a
}

func (x *extractor) entry(r io.Reader, hdr *tar.Header) error {
	if !filepath.IsLocal(filepath.FromSlash(hdr.Name)) {
		return errors.New("the name leaves the folder")
	}
	name := path.Clean(hdr.Name)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.folder(name, hdr)
	case tar.TypeReg:
		return x.file(name, r, hdr)
	case tar.TypeLink:
		return x.hardLink(name, hdr)
	case tar.TypeSymlink:
		return x.symlink(name, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return x.node(name, hdr)
	}
	return fmt.Errorf("type %q is not a folder, file, link, device or FIFO", hdr.Typeflag)
}

func (x *extractor) folder(name string, hdr *tar.Header) error {
	if name == "." {
		return nil // the folder itself is the caller's
	}
	if fi, err := x.root.Lstat(name); err == nil && !fi.IsDir() {
		if err := x.replace(name); err != nil {
			return err
		}
	}
	if err := x.root.MkdirAll(name, 0o700); err != nil {
		return err
	}
	a := x.attrsOf(hdr)
	// Until the archive ends, the owner may write the folder's entries.
	if err := x.root.Chmod(name, a.mode.Perm()|0o700); err != nil {
		return err
	}
	if d := x.dirAt[name]; d != nil {
		d.attrs = a
		return nil
	}
	d := &folder{name: name, attrs: a}
	x.dirs = append(x.dirs, d)
	x.dirAt[name] = d
	return nil
}

// finishFolders gives each folder its owner, mode and time, entries
// before their folders.
func (x *extractor) finishFolders() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if d.gone {
			continue
		}
		if err := x.setAttrs(d.name, d.attrs, false); err != nil {
			return fmt.Errorf("tar entry %q: %w", d.name+"/", err)
		}
	}
	return nil
}

func (x *extractor) file(name string, r io.Reader, hdr *tar.Header) error {
	if err := x.replace(name); err != nil {
		return err
	}
	// Only its writer may read it until it is whole and its owner's.
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// The header's size bounds the copy: tar's reader ends the entry
	// there.
	_, err = copyContents(f, r)
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	x.files[name] = true
	return x.setAttrs(name, x.attrsOf(hdr), false)
}

func (x *extractor) hardLink(name string, hdr *tar.Header) error {
	target := hdr.Linkname
	if target == "" {
		return errors.New("hard link without a target")
	}
	if !filepath.IsLocal(filepath.FromSlash(target)) {
		return fmt.Errorf("hard link to %q leaves the folder", target)
	}
	target = path.Clean(target)
	notFile := fmt.Errorf("hard link to %q: not a regular file written before it in this archive", hdr.Linkname)
	if !x.files[target] {
		return notFile
	}
	if target == name {
		return nil // the file itself
	}
	if fi, err := x.root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
		return notFile
	}
	if err := x.replace(name); err != nil {
		return err
	}
	if err := x.root.Link(target, name); err != nil {
		return err
	}
	x.files[name] = true
	return nil
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	if hdr.Linkname == "" {
		return errors.New("symbolic link without a target")
	}
	if !x.lim.ForeignLinks && !LinkInside(name, hdr.Linkname) {
		return fmt.Errorf("symbolic link to %q leaves the folder", hdr.Linkname)
	}
	if err := x.replace(name); err != nil {
		return err
	}
	if err := x.root.Symlink(hdr.Linkname, name); err != nil {
		return err
	}
	return x.setAttrs(name, x.attrsOf(hdr), true)
}

func (x *extractor) node(name string, hdr *tar.Header) error {
	if err := x.lim.refuseNode(hdr.Typeflag); err != nil {
		return err
	}
	if err := x.replace(name); err != nil {
		return err
	}
	if err := mknod(x.root, name, hdr); err != nil {
		return err
	}
	return x.setAttrs(name, x.attrsOf(hdr), false)
}

// setAttrs gives what is at name its owner (with Owners), then its mode
// (a change of owner clears setuid and setgid), then its times; a
// symbolic link its own owner and times.
func (x *extractor) setAttrs(name string, a attrs, symlink bool) error {
	if x.lim.Owners {
		err := x.root.Lchown(name, a.uid, a.gid)
		switch {
		case errors.Is(err, syscall.EINVAL):
			// An owner the extractor's user namespace does not map (a
			// pod with hostUsers false maps 0 to 65535): the entry
			// stays the extractor's, as GNU tar leaves what it cannot
			// chown, and loses setuid and setgid, which would run it as
			// the extractor.
			a.mode &^= fs.ModeSetuid | fs.ModeSetgid
		case err != nil:
			return err
		}
	}
	if !symlink {
		if err := x.root.Chmod(name, a.mode); err != nil {
			return err
		}
	}
	if a.mtime.IsZero() {
		return nil
	}
	if symlink {
		return lchtimes(x.root, name, a.atime, a.mtime)
	}
	return x.root.Chtimes(name, a.atime, a.mtime)
}

// replace makes way for a new file or link at name: its folder exists and
// nothing is at name, so the new one is never written through a link.
func (x *extractor) replace(name string) error {
	if err := x.root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	if err := x.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	delete(x.files, name)
	if d := x.dirAt[name]; d != nil {
		d.gone = true
		delete(x.dirAt, name)
	}
	return nil
}
