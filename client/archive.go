package client

import (
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

// TarDir streams dir's contents as a gzip-compressed tar, the format of
// step inputs and outputs: each entry named relative to dir, a folder
// before its contents, with all a stock worker's tar carries
// (tarsafe.Writer: modes, numeric owners, times, symbolic links as
// links, hard links within dir, devices and FIFOs, which only a target
// that allows privileged steps takes). Read returns any error, naming
// the path (a missing dir, a file that changed size). Close stops the
// writer.
func TarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	s := &tarStream{PipeReader: pr, done: make(chan struct{})}
	// The trailing separator makes a dir given as a symbolic link count
	// as the folder it points to.
	root := filepath.Clean(dir) + string(filepath.Separator)
	go func() {
		defer close(s.done)
		zw := gzip.NewWriter(pw)
		tw := tarsafe.NewWriter(zw)
		err := filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
			if err != nil || file == root {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, file)
			if err != nil {
				return err
			}
			return tw.Add(tarsafe.Host{}, file, filepath.ToSlash(rel), fi)
		})
		// A failed walk must not end like a whole archive.
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	return s
}

// tarStream is TarDir's reader; done is closed once its writer returned.
type tarStream struct {
	*io.PipeReader
	done chan struct{}
}

// Close stops the writer and waits for it. Calling it again does nothing.
func (s *tarStream) Close() error {
	err := s.PipeReader.Close()
	<-s.done
	return err
}

// Untar extracts a gzip-compressed tar stream into dir, created if
// missing, and returns how many regular files it wrote (hard links
// included), as tarsafe.Extract does: folders, files, hard and symbolic
// links with their modes and times, owned by the caller (no setuid or
// setgid), or, run by root, as GNU tar does, by the owner the archive
// names (setuid and setgid kept). A device or FIFO, or an entry that would land
// outside dir (an absolute name, "..", a link pointing out or a path
// through one), is an error naming it.
func Untar(r io.Reader, dir string) (int, error) {
	return UntarLimited(r, dir, Limits{})
}

// Limits bound what one archive may write: Bytes of file contents and
// Entries (files, folders and links). A zero field is its default: 32 GiB,
// 1,048,576 entries.
type Limits struct {
	Bytes   int64
	Entries int
}

// UntarLimited is Untar within lim: an archive past a limit is an error
// naming the limit and the entry.
func UntarLimited(r io.Reader, dir string, lim Limits) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return 0, fmt.Errorf("untar into %s: %w", dir, err)
	}
	// As GNU tar: run by root, every file gets the owner the archive
	// names (and keeps setuid and setgid); otherwise the user's.
	done, err := tarsafe.Extract(zr, dir, tarsafe.Limits{Bytes: lim.Bytes, Entries: lim.Entries, Owners: os.Geteuid() == 0})
	if err == nil {
		// Read on to the gzip trailer, whose checksum covers it all.
		_, err = io.Copy(io.Discard, zr)
	}
	if err != nil {
		return done.Files, fmt.Errorf("untar into %s: %w", dir, err)
	}
	return done.Files, nil
}
