package volumes

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

// copied is what a copy of a volume did: the bytes of the files it
// copied, and the entries it shared with its parent by hard links.
type copied struct {
	bytes  int64
	linked int
}

// copyVolume makes the empty folder to a copy of the volume folder from:
// of hard links with SetLinkCopies (linkTree), else of copies
// (copyTree).
func (s *Server) copyVolume(ctx context.Context, from, to string, c *claim) (copied, error) {
	if s.linkCopies.Load() {
		return s.linkTree(ctx, from, to, c)
	}
	n, err := s.copyTree(ctx, from, to, c)
	return copied{bytes: n}, err
}

// copyTree copies the files of the folder from into the folder to, which
// exists and is empty, as a stream-out of from into a stream-in of to
// would, with the same archive and the same extractor (tarsafe) under
// the server's limits: every file as written (type, mode bits, owner
// with the server's Owners, hard links as links, symbolic links as
// written, times, device nodes and FIFOs with its Devices, refused
// naming the entry without). It reads through an os.Root of from, so it
// reads nothing outside from even if a folder of it turns into a link
// meanwhile. to takes from's own mode (and owner). It returns the bytes
// of the files it copied, and stops when ctx ends. Each entry is claimed
// of c before it is written.
func (s *Server) copyTree(ctx context.Context, from, to string, c *claim) (int64, error) {
	src, err := os.OpenRoot(from)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	top, err := src.Lstat(".")
	if err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() { pw.CloseWithError(writeTar(pw, src, ".")) })
	limits := s.extractLimits(c)
	got, err := tarsafe.Extract(ctxReader{ctx, pr}, to, limits)
	pr.CloseWithError(errCopied) // the writer may still be writing the archive's end
	wg.Wait()
	if err != nil {
		return got.Bytes, err
	}
	if limits.Owners {
		hdr, err := tar.FileInfoHeader(top, "")
		if err == nil {
			err = os.Lchown(to, hdr.Uid, hdr.Gid)
		}
		if err != nil {
			return got.Bytes, err
		}
	}
	return got.Bytes, os.Chmod(to, modeBits(top.Mode()))
}

// errCopied ends a copy's archive once its extractor is done with it.
var errCopied = errors.New("copied")

// ctxReader reads r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// modeBits is what chmod sets of a mode.
func modeBits(m os.FileMode) os.FileMode {
	return m & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
}

// linkTree makes the folder to, which exists and is empty, what copyTree
// would make of from, at the cost of from's entries, not of its bytes:
// each folder a new folder, given its parent's mode, owner and times
// once its entries are in; each symbolic link a new link, as written,
// with its owner and times; each file, device node and FIFO a hard link
// to the parent's. The two volumes stay apart because the server never
// writes a file in place (a stream-in unlinks what it replaces; see
// SetLinkCopies for who else must not). An entry the extractor would
// not take as it is goes through it, as copyTree's would: copied, or
// refused naming it; so does a file that cannot be linked (on another
// filesystem, or with too many links), copied with its attributes. It
// reads and writes through os.Roots and folders opened in them, so no
// link leads it out of either folder, and links what it found a file,
// never what a link points to. Each entry is claimed of c before it is
// written, and counts against the server's limits (what it copies
// against its bytes).
func (s *Server) linkTree(ctx context.Context, from, to string, c *claim) (copied, error) {
	src, err := os.OpenRoot(from)
	if err != nil {
		return copied{}, err
	}
	defer src.Close()
	dst, err := os.OpenRoot(to)
	if err != nil {
		return copied{}, err
	}
	defer dst.Close()
	l := &linker{ctx: ctx, sp: s.space, src: src, dst: dst, to: to, c: c, lim: s.extractLimits(c), copies: map[inode]string{}}
	return l.done, l.folder(".")
}

// linkat is unix.Linkat (tests make it fail as for a file of too many
// links).
var linkat = unix.Linkat

// linker is one linkTree.
type linker struct {
	ctx      context.Context
	sp       *space
	src, dst *os.Root
	to       string // dst's path, for the extractor
	c        *claim
	lim      tarsafe.Limits
	done     copied
	entries  int
	// copies are the files with more links copied so far, by the
	// parent's inode: the name of the copy, which another name of the
	// same file links to, as an archive's hard link would.
	copies map[inode]string
}

// folder fills the new folder name with what the parent's holds, then
// gives it the parent's attributes.
func (l *linker) folder(name string) error {
	sd, err := l.src.Open(name)
	if err != nil {
		return entryError(name, err)
	}
	defer sd.Close()
	dd, err := l.dst.Open(name)
	if err != nil {
		return entryError(name, err)
	}
	defer dd.Close()
	entries, err := sd.ReadDir(-1)
	if err != nil {
		return entryError(name, err)
	}
	for _, e := range entries {
		if err := l.ctx.Err(); err != nil {
			return err
		}
		if err := l.entry(sd, dd, path.Join(name, e.Name())); err != nil {
			return err
		}
	}
	info, err := l.src.Lstat(name)
	if err == nil {
		err = l.setAttrs(name, info)
	}
	if err != nil {
		return entryError(name, err)
	}
	return nil
}

// entry makes the entry p of the folder sd (the parent's) in the folder
// dd (the new volume's).
func (l *linker) entry(sd, dd *os.File, p string) error {
	info, err := l.src.Lstat(p)
	if err != nil {
		return entryError(p, err)
	}
	mode := info.Mode()
	l.entries++
	if err := l.lim.Admit(&tar.Header{Name: p, Typeflag: typeflagOf(mode)}, l.entries, 0); err != nil {
		return err
	}
	switch {
	case mode&fs.ModeSocket != 0:
		return nil // no file to carry: a stream leaves it out too
	case mode.IsDir():
		err = l.c.entry(p, mode, 0, "")
		if err == nil {
			err = l.dst.Mkdir(p, 0o700)
		}
		if err != nil {
			return entryError(p, err)
		}
		return l.folder(p)
	case mode&fs.ModeSymlink != 0:
		return l.symlink(dd, p, info)
	case !l.lim.Owners:
		// The extractor gives a file to the server, without setuid and
		// setgid: a link would keep its owner and bits.
		return l.copy(p, info)
	}
	// A file shares its inode, whose contents are charged already: only
	// its name is new.
	if err := l.c.entry(p, mode, 0, ""); err != nil {
		return entryError(p, err)
	}
	base := path.Base(p)
	err = l.sp.link(func() error {
		return linkat(int(sd.Fd()), base, int(dd.Fd()), base, 0)
	})
	switch {
	case errors.Is(err, syscall.EXDEV), errors.Is(err, syscall.EMLINK), errors.Is(err, syscall.EPERM):
		// Another filesystem, too many links, or a file this server may
		// not link (protected_hardlinks without CAP_FOWNER): a copy.
		return l.copy(p, info)
	case err != nil:
		return entryError(p, &fs.PathError{Op: "linkat", Path: p, Err: err})
	}
	l.done.linked++
	return nil
}

// symlink makes the symbolic link p, as the parent's is written, with
// its owner and times.
func (l *linker) symlink(dd *os.File, p string, info fs.FileInfo) error {
	target, err := l.src.Readlink(p)
	if err == nil {
		err = l.c.entry(p, info.Mode(), 0, target)
	}
	if err == nil {
		err = l.dst.Symlink(target, p)
	}
	if err == nil && l.lim.Owners {
		uid, gid := ownerOf(info)
		err = l.dst.Lchown(p, uid, gid)
	}
	if err == nil {
		t := unix.NsecToTimespec(info.ModTime().UnixNano())
		err = unix.UtimesNanoAt(int(dd.Fd()), path.Base(p), []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return entryError(p, err)
	}
	return nil
}

// setAttrs gives the new folder name the parent's owner (with Owners),
// mode and modification time (its access time too).
func (l *linker) setAttrs(name string, info fs.FileInfo) error {
	if l.lim.Owners {
		uid, gid := ownerOf(info)
		if err := l.dst.Lchown(name, uid, gid); err != nil {
			return err
		}
	}
	if err := l.dst.Chmod(name, modeBits(info.Mode())); err != nil {
		return err
	}
	return l.dst.Chtimes(name, info.ModTime(), info.ModTime())
}

// copy writes the entry p through the extractor, alone in an archive, as
// copyTree would: a file with its contents and attributes, or the entry
// refused, named. Another name of a file with more links it copied
// before is a link to that copy.
func (l *linker) copy(p string, info fs.FileInfo) error {
	id, links := linksOf(info)
	if first, ok := l.copies[id]; ok && links > 1 {
		err := l.c.entry(p, info.Mode(), 0, "")
		if err == nil {
			err = l.dst.Link(first, p)
		}
		if err != nil {
			return entryError(p, err)
		}
		return nil
	}
	hdr := &tar.Header{Name: p, Typeflag: typeflagOf(info.Mode()), Size: info.Size()}
	if err := l.lim.Admit(hdr, l.entries, l.done.bytes); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() {
		tw := tarsafe.NewWriter(pw)
		err := tw.Add(l.src, p, p, info)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	})
	got, err := tarsafe.Extract(ctxReader{l.ctx, pr}, l.to, l.lim)
	pr.CloseWithError(errCopied)
	wg.Wait()
	l.done.bytes += got.Bytes
	if err != nil {
		return err
	}
	if links > 1 { // bounded, as every copy is an entry
		l.copies[id] = p
	}
	return nil
}
