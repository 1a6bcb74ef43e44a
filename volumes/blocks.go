package volumes

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
)

// diskBytes is what a file takes on disk, as the kubelet counts an
// emptyDir (du): its blocks of 512 bytes. A file with other links counts
// once in seen, and not at all without seen: removing it frees nothing.
func diskBytes(info fs.FileInfo, seen map[uint64]bool) int64 {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return roundUp(info.Size(), defaultBlock)
	}
	if !info.IsDir() && uint64(st.Nlink) > 1 {
		if seen == nil || seen[uint64(st.Ino)] {
			return 0
		}
		seen[uint64(st.Ino)] = true
	}
	return int64(st.Blocks) * 512
}

// defaultBlock is the block size of a filesystem that does not say.
const defaultBlock = 4096

// blockSize is the block size of the filesystem holding dir: what it
// allocates a file's contents in. A size past 64 KiB is a network
// filesystem's transfer size, not its blocks.
func blockSize(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Bsize < 512 || st.Bsize > 64<<10 {
		return defaultBlock
	}
	return int64(st.Bsize)
}

// inode identifies a file on the host: its device and inode numbers.
type inode struct{ dev, ino uint64 }

// linksOf is the file's inode and how many links it has (none where the
// system does not say).
func linksOf(info fs.FileInfo) (inode, uint64) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return inode{}, 0
	}
	return inode{dev: uint64(st.Dev), ino: uint64(st.Ino)}, uint64(st.Nlink)
}

// ownerOf is the file's numeric owner and group.
func ownerOf(info fs.FileInfo) (uid, gid int) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return os.Getuid(), os.Getgid()
	}
	return int(st.Uid), int(st.Gid)
}

// removeAll removes name of root and all it holds, following no link,
// and measures what goes: n, the blocks of its folders and links;
// contents, those of the files whose last link it removed (only those
// free their blocks: a cow volume's files are links to its parent's).
// What it removed before an error is counted.
func (sp *space) removeAll(root *os.Root, name string) (n, contents int64, err error) {
	info, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	if !info.IsDir() {
		return sp.unlink(root, name)
	}
	d, err := root.Open(name)
	if err != nil {
		return 0, 0, err
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	for _, e := range entries {
		if err != nil {
			break
		}
		var en, ec int64
		en, ec, err = sp.removeAll(root, path.Join(name, e.Name()))
		n, contents = n+en, contents+ec
	}
	if err == nil {
		err = root.Remove(name)
	}
	if err == nil {
		n += diskBytes(info, nil)
	}
	return n, contents, err
}

// unlink removes the file or link name of root, and measures what goes
// (removeAll). Its links are counted, and one removed, under sp.links,
// which a new link takes too (link): two removals of a file's last two
// links each see the other's, and a removal that sees the last link
// sees no link made after it.
func (sp *space) unlink(root *os.Root, name string) (n, contents int64, err error) {
	sp.links.Lock()
	defer sp.links.Unlock()
	info, err := root.Lstat(name)
	if err == nil {
		err = root.Remove(name)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	if _, links := linksOf(info); !info.Mode().IsRegular() || links > 1 {
		return diskBytes(info, nil), 0, nil
	}
	return 0, sp.contentBytes(info), nil
}

// link runs add, which links a file that other volumes may link, under
// the lock under which unlink counts links. Without a space, at once.
func (sp *space) link(add func() error) error {
	if sp == nil {
		return add()
	}
	sp.links.Lock()
	defer sp.links.Unlock()
	return add()
}

// contentBytes is what a file's contents were charged when written (its
// size in whole blocks), or its blocks if fewer: what removing its last
// link gives back. The fewer, so that the account never counts less than
// the disk holds.
func (sp *space) contentBytes(info fs.FileInfo) int64 {
	n := roundUp(info.Size(), sp.block)
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		n = min(n, int64(st.Blocks)*512)
	}
	return n
}

// removeFolder removes the folder dir and all it holds, as os.RemoveAll,
// and measures what goes (removeAll); without a space, nothing.
func (sp *space) removeFolder(dir string) (n, contents int64, err error) {
	if sp == nil {
		return 0, 0, os.RemoveAll(dir)
	}
	root, err := os.OpenRoot(filepath.Dir(dir))
	if err != nil {
		return 0, 0, err
	}
	defer root.Close()
	return sp.removeAll(root, filepath.Base(dir))
}
