//go:build !linux

package stepagent

// setSubreaper is Linux's alone.
func setSubreaper() {}
