package client

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

// TarDir streams dir's contents as a gzip-compressed tar, the format of
// step inputs and outputs: directories (each before its contents), files
// and symbolic links (kept as links), named relative to dir, with their
// modes and modification times. Read returns any error, naming the path:
// a missing dir, a device, socket or pipe. Close stops the writer.
func TarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	s := &tarStream{PipeReader: pr, done: make(chan struct{})}
	// The trailing separator makes a dir given as a symbolic link count
	// as the folder it points to.
	root := filepath.Clean(dir) + string(filepath.Separator)
	go func() {
		defer close(s.done)
		zw := gzip.NewWriter(pw)
		tw := tar.NewWriter(zw)
		err := filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
			if err != nil || file == root {
				return err
			}
			return tarEntry(tw, root, file, d)
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

func tarEntry(tw *tar.Writer, root, file string, d fs.DirEntry) error {
	fi, err := d.Info()
	if err != nil {
		return err
	}
	link := ""
	switch mode := fi.Mode(); {
	case mode.IsRegular(), mode.IsDir():
	case mode&fs.ModeSymlink != 0:
		if link, err = os.Readlink(file); err != nil {
			return err
		}
	default:
		return fmt.Errorf("tar %s: not a regular file, directory or symbolic link (mode %s)", file, mode)
	}
	rel, err := filepath.Rel(root, file)
	if err != nil {
		return err
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = filepath.ToSlash(rel)
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Mode = int64(fi.Mode().Perm()) // no setuid, setgid or sticky bit
	if err := tw.WriteHeader(hdr); err != nil || !fi.Mode().IsRegular() {
		return err
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	// Exactly the size in the header, even if the file grows meanwhile.
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("tar %s: %w", file, err)
	}
	return nil
}

// Untar extracts a gzip-compressed tar stream into dir, created if
// missing, and returns how many regular files it wrote. It takes regular
// files, directories and symbolic links, with their permission bits; an
// entry of any other type, or that would land outside dir (an absolute
// name, "..", a link pointing out or a path through one), is an error
// naming it.
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
	done, err := tarsafe.Extract(zr, dir, tarsafe.Limits{Bytes: lim.Bytes, Entries: lim.Entries})
	if err == nil {
		// Read on to the gzip trailer, whose checksum covers it all.
		_, err = io.Copy(io.Discard, zr)
	}
	if err != nil {
		return done.Files, fmt.Errorf("untar into %s: %w", dir, err)
	}
	return done.Files, nil
}
