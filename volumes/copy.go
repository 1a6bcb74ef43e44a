package volumes

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
)

// copyTree copies the files of the folder from into the folder to, which
// exists and is empty: folders and regular files with their modes,
// symbolic links as links to the same target, never followed. It reads
// through an os.Root of from, so it reads nothing outside from even if a
// folder of it turns into a link meanwhile. Other files (devices, pipes,
// sockets) are left out, as a stream-in leaves them out. It returns the
// bytes of the files it copied, and stops when ctx ends. Each entry is
// claimed of c before it is written; a file is copied as large as it was
// when claimed.
func copyTree(ctx context.Context, from, to string, c *claim) (int64, error) {
	src, err := os.OpenRoot(from)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	dst, err := os.OpenRoot(to)
	if err != nil {
		return 0, err
	}
	defer dst.Close()
	type folder struct {
		name string
		mode fs.FileMode
	}
	var folders []folder
	var copied int64
	err = fs.WalkDir(src.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			folders = append(folders, folder{name, info.Mode()})
			if name == "." {
				return nil
			}
			if err := c.entry(name, info.Mode(), 0, ""); err != nil {
				return err
			}
			return dst.Mkdir(name, 0o700)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := src.Readlink(name)
			if err == nil {
				err = c.entry(name, info.Mode(), 0, target)
			}
			if err != nil {
				return err
			}
			return dst.Symlink(target, name)
		case d.Type().IsRegular():
			if err := c.entry(name, info.Mode(), info.Size(), ""); err != nil {
				return err
			}
			n, err := copyFile(src, dst, name, info.Mode(), info.Size())
			copied += n
			return err
		}
		return nil
	})
	// Folders take their modes last, deepest first: a read-only folder
	// is written into before.
	for i := len(folders) - 1; i >= 0 && err == nil; i-- {
		err = dst.Chmod(folders[i].name, modeBits(folders[i].mode))
	}
	return copied, err
}

// copyFile copies one regular file with its mode, at most size bytes of
// it; on Linux, io.Copy between two files asks the kernel to copy
// (copy_file_range, also through a LimitedReader), which some
// filesystems do by sharing blocks.
func copyFile(src, dst *os.Root, name string, mode fs.FileMode, size int64) (int64, error) {
	in, err := src.Open(name)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, io.LimitReader(in, size))
	if err == nil {
		err = out.Chmod(modeBits(mode)) // not narrowed by the umask
	}
	return n, errors.Join(err, out.Close())
}

// modeBits is what chmod sets of a mode.
func modeBits(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}
