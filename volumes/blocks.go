package volumes

import (
	"io/fs"
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
