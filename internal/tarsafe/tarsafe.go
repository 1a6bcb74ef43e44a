// Package tarsafe is jetway's archive of a volume: the one extractor every
// tar reader uses (the volume sidecar unpacking an input, the agent, the
// client unpacking an output), with the checks it makes before it writes
// anything, and the writer that walks a tree into a tar carrying what the
// extractor writes: what a stock Concourse worker's GNU tar carries.
package tarsafe

import (
	"io"
	"path"
	"strings"
	"sync"
)

// LinkInside reports whether a link at name (clean, relative) to target
// resolves inside the folder. Cleaning the target is not enough: in
// "b/..", b may itself be a link, so ".." may only lead the target.
func LinkInside(name, target string) bool {
	if path.IsAbs(target) {
		return false
	}
	depth := strings.Count(name, "/") // folders between the folder and the link
	named := false
	for _, part := range strings.Split(target, "/") {
		switch part {
		case "", ".":
		case "..":
			if named || depth == 0 {
				return false
			}
			depth--
		default:
			named = true
		}
	}
	return true
}

// copyBufferSize is the buffer a file's contents are copied through, to
// or from an archive: 1 MiB reads and writes, where io.Copy's 32 KiB
// made 32 times the syscalls, and as many HTTP chunks of a stream
// (volumes' BenchmarkMove).
const copyBufferSize = 1 << 20

// copyBuffers are the buffers of the copies running, so that a volume
// copied file by file (an archive of each) allocates none per file.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// copyContents copies r into w through a buffer of copyBufferSize, never
// by w's ReadFrom (an *os.File's would copy through 32 KiB again).
func copyContents(w io.Writer, r io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, r, *buf)
}
