//go:build !linux

package pty

import "os"

func open() (master, slave *os.File, err error) { return nil, nil, ErrUnsupported }

// Resize sets the window size of the terminal of f.
func Resize(f *os.File, size Size) error { return ErrUnsupported }
