package pty

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

func open() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	var n uint32
	err = control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN)
		return err
	})
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	slave, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	return master, slave, nil
}

// Resize sets the window size of the terminal of f (its master or its
// slave); the terminal's foreground processes get SIGWINCH.
func Resize(f *os.File, size Size) error {
	err := control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Columns})
	})
	if err != nil {
		return fmt.Errorf("set the terminal's size to %dx%d: %w", size.Columns, size.Rows, err)
	}
	return nil
}

// control runs fn on f's descriptor without f.Fd, which would take f out
// of the runtime's poller (its reads could then no longer be ended by
// Close).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
