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
// bytes of the files it copied, and stops when ctx ends.
func copyTree(ctx context.Context, from, to string) (int64, error) {
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
			return dst.Mkdir(name, 0o700)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := src.Readlink(name)
			if err != nil {
				return err
			}
			return dst.Symlink(target, name)
		case d.Type().IsRegular():
			n, err := copyFile(src, dst, name, info.Mode())
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

// copyFile copies one regular file with its mode; on Linux, io.Copy
// between two files asks the kernel to copy (copy_file_range), which
// some filesystems do by sharing blocks.
func copyFile(src, dst *os.Root, name string, mode fs.FileMode) (int64, error) {
	in, err := src.Open(name)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if err == nil {
		err = out.Chmod(modeBits(mode)) // not narrowed by the umask
	}
	return n, errors.Join(err, out.Close())
}

// modeBits is what chmod sets of a mode.
func modeBits(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}
