// Package buildinfo holds the version stamped into the gateway binary.
package buildinfo

import "runtime/debug"

// Version is set at link time by `make build`
// (-X github.com/jetway-ci/jetway/internal/buildinfo.Version=...).
var Version = ""

// String returns the stamped version, else the module version go install
// recorded, else "dev".
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
