// Package pty opens pseudo-terminals: the step agent gives one to a
// process that asks for a TTY (a Concourse task, `fly intercept`), and
// tests give one to a real fly.
package pty

import (
	"errors"
	"os"
)

// Size is a terminal's window size in characters.
type Size struct {
	Columns uint16 `json:"columns"`
	Rows    uint16 `json:"rows"`
}

// ErrUnsupported: this system has no pseudo-terminals jetway can open.
var ErrUnsupported = errors.New("pseudo-terminals are not supported on this system")

// Open opens a new pseudo-terminal of size: its master, read and written
// by whoever drives the terminal, and its slave, the process's terminal
// (its stdin, stdout and stderr, and its controlling terminal).
func Open(size Size) (master, slave *os.File, err error) {
	master, slave, err = open()
	if err != nil {
		return nil, nil, err
	}
	if err := Resize(master, size); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}
