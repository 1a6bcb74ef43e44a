// Package tarsafe is jetway's archive of a volume: the one extractor every
// tar reader uses (the volume sidecar unpacking an input, the agent, the
// client unpacking an output), with the checks it makes before it writes
// anything, and the writer that walks a tree into a tar carrying what the
// extractor writes: what a stock Concourse worker's GNU tar carries.
package tarsafe

import (
	"path"
	"strings"
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
