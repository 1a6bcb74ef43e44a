package client

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/jetway-ci/jetway/stepagent"
)

// UploadInput sends dir's contents as the input name of a step that
// declared it {from: {upload: true}}; the gateway holds the call until
// the step's pod is ready for it. It answers the bytes and SHA-256 of the
// stream (a gzip-compressed tar) as the pod took them.
func (c *Client) UploadInput(ctx context.Context, team, handle, name, dir string) (stepagent.Input, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return stepagent.Input{}, fmt.Errorf("jetway: input %s: %s is not a directory", name, dir)
	}
	body := packDir(dir)
	defer body.Close()
	var got stepagent.Input
	query := teamQuery(team)
	if query == nil {
		query = url.Values{}
	}
	query.Set("encoding", "gzip")
	err := c.call(ctx, http.MethodPut, "/api/v1/steps/"+url.PathEscape(handle)+"/inputs/"+url.PathEscape(name), query, io.Reader(body), &got)
	return got, err
}

// DownloadOutput writes the output name of an ended step into dir
// (created if missing) and returns how many files it wrote.
func (c *Client) DownloadOutput(ctx context.Context, team, handle, name, dir string) (int, error) {
	query := teamQuery(team)
	if query == nil {
		query = url.Values{}
	}
	query.Set("encoding", "gzip")
	resp, err := c.do(ctx, http.MethodGet, "/api/v1/steps/"+url.PathEscape(handle)+"/outputs/"+url.PathEscape(name), query, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := unpack(resp.Body, dir)
	if err != nil {
		return n, fmt.Errorf("jetway: output %s: %w", name, err)
	}
	return n, nil
}

// packDir streams dir's contents as a gzip-compressed tar: directories,
// regular files and symbolic links (kept as links), with their modes.
// Anything else is an error naming it. Closing the reader stops it.
func packDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		zw := gzip.NewWriter(pw)
		tw := tar.NewWriter(zw)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil || rel == "." {
				return err
			}
			return addEntry(tw, p, filepath.ToSlash(rel), d)
		})
		err = errors.Join(err, tw.Close(), zw.Close())
		pw.CloseWithError(err)
	}()
	return pr
}

func addEntry(tw *tar.Writer, file, name string, d fs.DirEntry) error {
	fi, err := d.Info()
	if err != nil {
		return err
	}
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if link, err = os.Readlink(file); err != nil {
			return err
		}
	case !fi.Mode().IsRegular() && !fi.IsDir():
		return fmt.Errorf("%s: %s cannot be uploaded (only files, directories and symbolic links)", file, kind(fi.Mode()))
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// unpack writes a gzip-compressed tar into dir. An entry that would land
// outside dir (an absolute name, "..", a path through a symbolic link, a
// link pointing out) is an error naming it, and so is any entry other than
// a file, a directory or a symbolic link.
func unpack(r io.Reader, dir string) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return 0, err
	}
	tr := tar.NewReader(zr)
	files := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return files, err
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." {
			continue
		}
		if !filepath.IsLocal(name) {
			return files, fmt.Errorf("entry %q would land outside %s", hdr.Name, dir)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		if err := noLinkOnTheWay(dir, name); err != nil {
			return files, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, mode|0o700)
		case tar.TypeReg:
			_ = os.Remove(target) // never write through a link there
			err = writeFile(target, tr, mode)
			files++
		case tar.TypeSymlink:
			if !filepath.IsLocal(path.Join(path.Dir(name), hdr.Linkname)) || path.IsAbs(hdr.Linkname) {
				return files, fmt.Errorf("entry %q links to %q, outside %s", hdr.Name, hdr.Linkname, dir)
			}
			_ = os.Remove(target)
			err = os.Symlink(hdr.Linkname, target)
		default:
			return files, fmt.Errorf("entry %q: type %q is not a file, a directory or a symbolic link", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return files, err
		}
	}
}

// noLinkOnTheWay checks that no folder on name's way under dir is a link.
func noLinkOnTheWay(dir, name string) error {
	p := dir
	parts := strings.Split(name, "/")
	for _, part := range parts[:len(parts)-1] {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symbolic link", p)
		}
	}
	return nil
}

func writeFile(file string, r io.Reader, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}
