package volumes

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/jetway-ci/jetway/internal/tarsafe"
)

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
