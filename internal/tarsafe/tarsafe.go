// Package tarsafe holds what every tar reader of jetway checks before it
// makes a symbolic link: the client unpacking an output, the volume
// sidecar unpacking an input.
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
