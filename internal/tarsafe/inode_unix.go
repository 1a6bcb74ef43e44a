//go:build unix

package tarsafe

import (
	"io/fs"
	"syscall"
)

// inodeOf is the file's device and inode, and how many links it has.
func inodeOf(info fs.FileInfo) (inode, uint64, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return inode{}, 0, false
	}
	return inode{dev: uint64(st.Dev), ino: uint64(st.Ino)}, uint64(st.Nlink), true
}
