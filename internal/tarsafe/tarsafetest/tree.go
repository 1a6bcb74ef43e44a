package tarsafetest

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// When is the time of every entry WriteTree writes but one (whole
// seconds: a tar's).
var When = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// WriteTree writes into dir what a task may leave in a volume: root-only
// and read-only folders, files owned by uid 1000, setuid, setgid and
// sticky modes, a file with two names, symbolic links inside and out
// (one owned by uid 1000), empty folders, a FIFO, each dated When but
// d700/f600, an hour older. It takes root.
func WriteTree(t testing.TB, dir string) {
	t.Helper()
	at := func(name string) string { return filepath.Join(dir, filepath.FromSlash(name)) }
	mkdir := func(name string, mode fs.FileMode) {
		check(t, os.Mkdir(at(name), 0o700))
		check(t, os.Chmod(at(name), mode))
	}
	file := func(name string, mode fs.FileMode) {
		check(t, os.WriteFile(at(name), []byte("content of "+name), 0o600))
		check(t, os.Chmod(at(name), mode))
	}
	mkdir("d700", 0o700)
	file("d700/f600", 0o600)
	file("owned", 0o644)
	check(t, os.Chown(at("owned"), 1000, 1000))
	file("suid", 0o755|fs.ModeSetuid)
	file("sgid", 0o755|fs.ModeSetgid)
	file("suid-1000", 0o750)
	check(t, os.Chown(at("suid-1000"), 1000, 1000))
	check(t, os.Chmod(at("suid-1000"), 0o750|fs.ModeSetuid|fs.ModeSetgid))
	mkdir("sticky", 0o777|fs.ModeSticky)
	mkdir("setgid-dir", 0o775|fs.ModeSetgid)
	mkdir("hard", 0o755)
	file("hard/a", 0o640)
	check(t, os.Link(at("hard/a"), at("hard/b")))
	check(t, os.Symlink("d700/f600", at("inside")))
	check(t, os.Symlink("/etc/passwd", at("outside")))
	check(t, os.Symlink("owned", at("link-owned")))
	check(t, os.Lchown(at("link-owned"), 1000, 1000))
	mkdir("empty", 0o755)
	mkdir("nested", 0o750)
	mkdir("nested/empty", 0o711)
	check(t, unix.Mkfifo(at("fifo"), 0o640))
	mkdir("ro", 0o700)
	file("ro/file", 0o444)
	check(t, os.Chmod(at("ro"), 0o500))
	// Times last, entries before their folders.
	var names []string
	check(t, filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		names = append(names, p)
		return err
	}))
	for i := len(names) - 1; i > 0; i-- {
		when := When
		if names[i] == at("d700/f600") {
			when = When.Add(-time.Hour)
		}
		ts := unix.NsecToTimespec(when.UnixNano())
		check(t, unix.UtimesNanoAt(unix.AT_FDCWD, names[i], []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}
