package tarsafe

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"
)

// Writer writes a tree as a tar stream carrying what Extract writes, as
// GNU tar's `--numeric-owner -cpf` does: each entry's type, mode bits
// (setuid, setgid and sticky included), numeric owner and group (no
// names), modification time (in seconds, truncated), symbolic links as
// written, device nodes and FIFOs (whoever extracts decides whether it
// takes them), and a regular file with more than one link as a hard link
// to the name it was first written by (by device and inode): its content
// the first time the archive meets it, a link after, whatever links it
// has outside the tree (a volume holder's cow volumes share every file
// with their parent). A socket is no file to carry: it is left out, as
// GNU tar does.
//
// It remembers the name of at most maxLinked such files: past them, a
// file with more links is written whole each time it is met, a right
// archive, only larger. A name and an inode take about 100 bytes, and
// no extractor with the default limits takes an archive of more
// entries, so the bound holds the Writer to what Extract itself keeps
// of such an archive (its record of the files it wrote).
type Writer struct {
	tw    *tar.Writer
	first map[inode]string // each file with more links: the name first written
}

// maxLinked is how many files with more links a Writer remembers: the
// entries an extractor takes by default.
var maxLinked = DefaultMaxEntries

// NewWriter writes to w; Close ends the archive (not w).
func NewWriter(w io.Writer) *Writer {
	return &Writer{tw: tar.NewWriter(w), first: map[inode]string{}}
}

// A Tree is where a Writer reads contents and link targets: an os.Root,
// or Host.
type Tree interface {
	Open(name string) (*os.File, error)
	Readlink(name string) (string, error)
}

// Host is the host's file system, by path.
type Host struct{}

func (Host) Open(name string) (*os.File, error)   { return os.Open(name) }
func (Host) Readlink(name string) (string, error) { return os.Readlink(name) }

// Add writes the entry at p in t, whose Lstat is info, by name (a
// folder's with a trailing slash). A folder goes before its entries, as
// a walk gives them. A regular file's content is exactly the size info
// says: one that changes size meanwhile is an error naming p.
func (w *Writer) Add(t Tree, p, name string, info fs.FileInfo) error {
	mode := info.Mode()
	if mode&fs.ModeSocket != 0 {
		return nil
	}
	link := ""
	if mode&fs.ModeSymlink != 0 {
		var err error
		if link, err = t.Readlink(p); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(numericOwner{info}, link)
	if err != nil {
		return fmt.Errorf("tar %s: %w", p, err)
	}
	hdr.Name = name
	if info.IsDir() && !strings.HasSuffix(name, "/") {
		hdr.Name += "/"
	}
	// GNU tar's seconds; tar.Writer would round, and drops the others.
	hdr.ModTime = info.ModTime().Truncate(time.Second)
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if mode.IsRegular() {
		if id, links, ok := inodeOf(info); ok && links > 1 {
			if first, ok := w.first[id]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				return w.tw.WriteHeader(hdr)
			}
			if len(w.first) < maxLinked {
				w.first[id] = hdr.Name
			}
		}
	}
	if err := w.tw.WriteHeader(hdr); err != nil || !mode.IsRegular() {
		return err
	}
	f, err := t.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := copyContents(w.tw, io.LimitReader(f, hdr.Size))
	if err == nil && n < hdr.Size {
		err = fmt.Errorf("%w: %d bytes of %d", io.ErrUnexpectedEOF, n, hdr.Size)
	}
	if err != nil {
		return fmt.Errorf("tar %s: %w", p, err)
	}
	return nil
}

// Close writes the archive's end.
func (w *Writer) Close() error { return w.tw.Close() }

// numericOwner gives tar.FileInfoHeader no names, so it looks none up.
type numericOwner struct{ fs.FileInfo }

func (numericOwner) Uname() (string, error) { return "", nil }
func (numericOwner) Gname() (string, error) { return "", nil }

// inode identifies a file on the host: its device and inode numbers.
type inode struct{ dev, ino uint64 }
