// Package tarsafetest holds the hostile archives every user of
// tarsafe.Extract (the volume sidecar, the agent's volumes, the client)
// must refuse the same way, and writers of archives for their tests.
package tarsafetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Hostile is an archive an extractor must refuse, writing nothing
// outside the folder it extracts into.
type Hostile struct {
	Name string
	// Before prepares the folder extracted into, given a folder outside it.
	Before  func(t testing.TB, dir, outside string)
	Entries func(outside string) []*tar.Header
	// Want is in the error: the entry, and why.
	Want string
	// ForeignLink is an archive whose only fault is a link out of the
	// folder: tarsafe.Limits.ForeignLinks keeps it, as a link.
	ForeignLink bool
	// ForeignWant, when set, is in the error with ForeignLinks: the
	// archive writes through the link it made.
	ForeignWant string
}

func file(name string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}
}
func link(name, to string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to}
}
func hard(name, to string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: to}
}
func dir(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }
func entries(hs ...*tar.Header) func(string) []*tar.Header {
	return func(string) []*tar.Header { return hs }
}

// Hostiles are the hostile archives.
var Hostiles = []Hostile{
	{Name: "dotdot", Entries: entries(file("../x")), Want: `tar entry "../x": the name leaves the folder`},
	{Name: "dotdot inside", Entries: entries(file("a/../../x")), Want: `tar entry "a/../../x": the name leaves the folder`},
	{Name: "absolute", Entries: func(out string) []*tar.Header { return []*tar.Header{file(filepath.Join(out, "x"))} },
		Want: `: the name leaves the folder`},
	{Name: "link up", Entries: entries(link("a/l", "../../x")), Want: `tar entry "a/l": symbolic link to "../../x" leaves the folder`,
		ForeignLink: true},
	{Name: "link absolute", Entries: func(out string) []*tar.Header { return []*tar.Header{link("l", out)} },
		Want: `tar entry "l": symbolic link to "/`, ForeignLink: true},
	{Name: "link through link", Entries: entries(link("d/up", ".."), link("d/l", "up/..")),
		Want: `tar entry "d/l": symbolic link to "up/.." leaves the folder`, ForeignLink: true},
	{Name: "link without target", Entries: entries(link("l", "")), Want: `tar entry "l": symbolic link without a target`},
	{Name: "link then file", Entries: func(out string) []*tar.Header { return []*tar.Header{link("a", out), file("a/passwd")} },
		Want: `tar entry "a": symbolic link to "/`, ForeignWant: `tar entry "a/passwd": `},
	{Name: "relative link then file", Entries: entries(link("a", "../.."), file("a/passwd")),
		Want: `tar entry "a": symbolic link to "../.." leaves the folder`, ForeignWant: `tar entry "a/passwd": `},
	{
		Name:    "file through a link already there",
		Before:  func(t testing.TB, dir, out string) { check(t, os.Symlink(out, filepath.Join(dir, "a"))) },
		Entries: entries(file("a/passwd")),
		Want:    `tar entry "a/passwd": `,
	},
	{Name: "hard link to a name not yet written", Entries: entries(hard("h", "x"), file("x")),
		Want: `tar entry "h": hard link to "x": not a regular file written before it in this archive`},
	{Name: "hard link up", Entries: entries(file("x"), hard("h", "../x")), Want: `tar entry "h": hard link to "../x" leaves the folder`},
	{Name: "hard link absolute", Entries: func(out string) []*tar.Header { return []*tar.Header{hard("h", filepath.Join(out, "x"))} },
		Want: `tar entry "h": hard link to "/`},
	{Name: "hard link to a folder", Entries: entries(dir("d/"), hard("h", "d")),
		Want: `tar entry "h": hard link to "d": not a regular file written before it in this archive`},
	{Name: "hard link through a link", Entries: entries(file("f/x"), link("l", "f"), hard("h", "l/x")),
		Want: `tar entry "h": hard link to "l/x": not a regular file written before it in this archive`},
	{Name: "hard link to a link", Entries: entries(file("x"), link("x", "y"), hard("h", "x")),
		Want: `tar entry "h": hard link to "x": not a regular file written before it in this archive`},
	{
		Name:    "hard link to a file already there",
		Before:  func(t testing.TB, dir, out string) { check(t, os.WriteFile(filepath.Join(dir, "x"), nil, 0o644)) },
		Entries: entries(hard("h", "x")),
		Want:    `tar entry "h": hard link to "x": not a regular file written before it in this archive`,
	},
	{Name: "device", Entries: entries(&tar.Header{Name: "dev", Typeflag: tar.TypeChar}),
		Want: `tar entry "dev": a character device, and this folder takes no devices or FIFOs`},
	{Name: "fifo", Entries: entries(&tar.Header{Name: "p", Typeflag: tar.TypeFifo}),
		Want: `tar entry "p": a FIFO, and this folder takes no devices or FIFOs`},
	{Name: "contiguous file", Entries: entries(&tar.Header{Name: "s", Typeflag: tar.TypeCont}),
		Want: `tar entry "s": type '7' is not a folder, file, link, device or FIFO`},
}

// RefuseAll runs each hostile archive (a tar of it, made by archive:
// Tar or GzipTar) through extract into a new folder, and checks that it is
// refused naming its entry, and that nothing was written outside.
func RefuseAll(t *testing.T, archive func(testing.TB, ...*tar.Header) []byte, extract func(archive []byte, dir string) error) {
	for _, h := range Hostiles {
		t.Run(h.Name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			if h.Before != nil {
				h.Before(t, dir, outside)
			}
			err := extract(archive(t, h.Entries(outside)...), dir)
			if err == nil || !strings.Contains(err.Error(), h.Want) {
				t.Errorf("got %v, want an error with %q", err, h.Want)
			}
			if entries, _ := os.ReadDir(outside); len(entries) > 0 {
				t.Errorf("%d entries written outside the folder", len(entries))
			}
		})
	}
}

// Tar is a tar of hdrs; each regular file holds "x".
func Tar(t testing.TB, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	check(t, writeTar(&buf, hdrs))
	return buf.Bytes()
}

// GzipTar is Tar, gzip-compressed.
func GzipTar(t testing.TB, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	check(t, writeTar(zw, hdrs))
	check(t, zw.Close())
	return buf.Bytes()
}

func writeTar(w io.Writer, hdrs []*tar.Header) error {
	tw := tar.NewWriter(w)
	for _, h := range hdrs {
		h := *h
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte("x")); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// Bomb streams a gzip-compressed tar of files files of size bytes of
// zeros each (a few MiB say 10 GiB), made as it is read: what is not
// read is never made. Close it when done.
func Bomb(files int, size int64) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		zw, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		tw := tar.NewWriter(zw)
		zeros := make([]byte, 1<<20)
		var err error
		for i := 0; i < files && err == nil; i++ {
			if err = tw.WriteHeader(&tar.Header{Name: "zeros/" + itoa(i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
				break
			}
			for left := size; left > 0 && err == nil; left -= int64(len(zeros)) {
				_, err = tw.Write(zeros[:min(left, int64(len(zeros)))])
			}
		}
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

func itoa(i int) string { return strconv.Itoa(i) }

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
