package tarsafe

import (
	"archive/tar"
	"os"
	"path"
	"time"

	"golang.org/x/sys/unix"
)

// mknod makes the device node or FIFO hdr says at name, mode 0600 until
// its attributes are set. os.Root has no mknod: it is made in its folder,
// opened through the root, by its base name, so it cannot leave it.
func mknod(root *os.Root, name string, hdr *tar.Header) error {
	kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
	dir, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer dir.Close()
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	return os.NewSyscallError("mknodat", unix.Mknodat(int(dir.Fd()), path.Base(name), kind|0o600, int(dev)))
}

// lchtimes sets the times of the symbolic link at name, not of what it
// points to (os.Root has no Lchtimes), through its folder as mknod.
func lchtimes(root *os.Root, name string, atime, mtime time.Time) error {
	dir, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer dir.Close()
	a, err := unix.TimeToTimespec(atime)
	if err != nil {
		return err
	}
	m, err := unix.TimeToTimespec(mtime)
	if err != nil {
		return err
	}
	return os.NewSyscallError("utimensat", unix.UtimesNanoAt(int(dir.Fd()), path.Base(name), []unix.Timespec{a, m}, unix.AT_SYMLINK_NOFOLLOW))
}
