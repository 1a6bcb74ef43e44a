// Command mkimage packs one static binary into an OCI image and writes it
// as a `docker save`-style tarball (what `docker load`, `ctr images
// import`, `kind load image-archive` and `crane push` read). It needs no
// Docker daemon and no base image: the image is the binary alone, built up
// from an empty image. Every timestamp is fixed, so the same binary gives
// the same image digest (give -created a fixed time too, such as the
// commit's). With -rootfs, a root filesystem made elsewhere is the image's
// first layer, as it is (the test node's image of Concourse's mock
// resource type).
//
//	mkimage -binary bin/step-agent-linux-amd64 -path /step-agent \
//	    -ref ghcr.io/jetway-ci/step-agent:v1 -version v1 -o bin/step-agent-image.tar
//	mkimage -binary bin/gateway-linux-amd64 -path /gateway -cmd run \
//	    -ref ghcr.io/jetway-ci/gateway:v1 -version v1 -title "jetway gateway" \
//	    -created 2026-01-02T03:04:05Z -revision 0123abc -o bin/gateway-image.tar
//	mkimage -rootfs rootfs.tgz -user 0:0 -ref jetway.test/mock-resource:1 -o bin/mock-image.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is the time of the layer's file, and the image's created time
// unless -created sets one. A fixed value keeps the digest reproducible.
var epoch = time.Unix(0, 0).UTC()

type options struct {
	binary, path, ref, version, source, title, description, revision, user, arch, out string
	// rootfs is a tarball (plain or gzip) of a whole root filesystem,
	// the image's first layer as it is, below the binary's if there is
	// one: an image of a rootfs made elsewhere (Concourse's mock
	// resource type's).
	rootfs string
	// cmd is the image's default arguments to the entrypoint (Cmd).
	cmd []string
	// created is the config's created time and the created label.
	created time.Time
	// links are absolute paths of symbolic links to the binary (a
	// multi-call binary's commands: /bin/sh for busybox).
	links []string
	// dirs are absolute paths of empty folders, writable by everyone with
	// the sticky bit (/tmp).
	dirs []string
	// files are more files: SRC:DEST, read-only and executable for all.
	files []string
	// entries are folders, files and hard links with the modes and
	// owners given (-mkdir, -write, -hardlink), after everything else,
	// in their order: what real images hold (a root-only /root, a
	// setuid binary, hard links).
	entries []*tar.Header
	// contents are the -write files' contents, by name.
	contents map[string][]byte
}

// entryFlag reads PATH:MODE:UID:GID[:REST] into a header of typ; rest
// says whether REST is there (all that follows the fourth colon).
func entryFlag(typ byte, s string, rest bool) (*tar.Header, string, error) {
	n := 4
	if rest {
		n = 5
	}
	f := strings.SplitN(s, ":", n)
	if len(f) != n || !path.IsAbs(f[0]) {
		return nil, "", fmt.Errorf("want PATH:MODE:UID:GID%s with PATH absolute, got %q", map[bool]string{true: ":REST"}[rest], s)
	}
	var mode, uid, gid int64
	if _, err := fmt.Sscanf(f[1]+" "+f[2]+" "+f[3], "%o %d %d", &mode, &uid, &gid); err != nil {
		return nil, "", fmt.Errorf("%q: mode (octal), uid and gid: %w", s, err)
	}
	hdr := &tar.Header{Typeflag: typ, Name: strings.TrimPrefix(path.Clean(f[0]), "/"), Mode: mode, Uid: int(uid), Gid: int(gid), ModTime: epoch}
	if rest {
		return hdr, f[4], nil
	}
	return hdr, "", nil
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "static binary to put in the image (required without -rootfs)")
	flag.StringVar(&o.rootfs, "rootfs", "", "tarball (plain or gzip) of a root filesystem: the image's first layer, as it is; -binary is then optional (without it the image has no entrypoint)")
	flag.StringVar(&o.path, "path", "/step-agent", "absolute path of the binary in the image; also the entrypoint")
	flag.StringVar(&o.ref, "ref", "", "image reference the tarball names, e.g. ghcr.io/jetway-ci/step-agent:v1 (required)")
	flag.StringVar(&o.version, "version", "dev", "org.opencontainers.image.version label")
	flag.StringVar(&o.source, "source", "https://github.com/jetway-ci/jetway", "org.opencontainers.image.source label")
	flag.StringVar(&o.title, "title", "jetway step-agent", "org.opencontainers.image.title label")
	flag.StringVar(&o.description, "description", "", "org.opencontainers.image.description label (none when empty)")
	flag.StringVar(&o.revision, "revision", "", "org.opencontainers.image.revision label, the source's commit (none when empty)")
	flag.StringVar(&o.user, "user", "65532:65532", "user the entrypoint runs as")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "architecture of the binary (GOARCH)")
	flag.StringVar(&o.out, "o", "", "tarball to write (required)")
	flag.Func("cmd", "a default argument to the entrypoint (the image's Cmd); repeat for more", func(s string) error {
		o.cmd = append(o.cmd, s)
		return nil
	})
	flag.Func("link", "absolute path of a symbolic link to the binary, such as /bin/sh; repeat for more", func(s string) error {
		o.links = append(o.links, s)
		return nil
	})
	flag.Func("dir", "absolute path of an empty folder writable by all, sticky (mode 1777), such as /tmp; repeat for more", func(s string) error {
		o.dirs = append(o.dirs, s)
		return nil
	})
	flag.Func("file", "another file, SRC:DEST with DEST absolute, read-only and executable for all; repeat for more", func(s string) error {
		if src, dest, ok := strings.Cut(s, ":"); !ok || src == "" || !path.IsAbs(dest) {
			return fmt.Errorf("want SRC:DEST with DEST absolute, got %q", s)
		}
		o.files = append(o.files, s)
		return nil
	})
	o.contents = map[string][]byte{}
	flag.Func("mkdir", "a folder, PATH:MODE:UID:GID (MODE octal, such as 0700); repeat for more", func(s string) error {
		hdr, _, err := entryFlag(tar.TypeDir, s, false)
		if err == nil {
			hdr.Name += "/"
			o.entries = append(o.entries, hdr)
		}
		return err
	})
	flag.Func("write", "a file, PATH:MODE:UID:GID:CONTENT (MODE octal, such as 4755 for setuid); repeat for more", func(s string) error {
		hdr, content, err := entryFlag(tar.TypeReg, s, true)
		if err == nil {
			hdr.Size = int64(len(content))
			o.contents[hdr.Name] = []byte(content)
			o.entries = append(o.entries, hdr)
		}
		return err
	})
	flag.Func("hardlink", "a hard link, PATH:TARGET, both absolute, TARGET a file written before; repeat for more", func(s string) error {
		p, target, ok := strings.Cut(s, ":")
		if !ok || !path.IsAbs(p) || !path.IsAbs(target) {
			return fmt.Errorf("want PATH:TARGET, both absolute, got %q", s)
		}
		hdr := &tar.Header{Typeflag: tar.TypeLink, Name: strings.TrimPrefix(path.Clean(p), "/"),
			Linkname: strings.TrimPrefix(path.Clean(target), "/"), ModTime: epoch}
		// A link's header carries its file's mode and owner, as GNU tar
		// writes it: an extractor (containerd's) may apply them.
		i := slices.IndexFunc(o.entries, func(e *tar.Header) bool { return e.Typeflag == tar.TypeReg && e.Name == hdr.Linkname })
		if i < 0 {
			return fmt.Errorf("hard link %q: %s is no file written before it", s, target)
		}
		hdr.Mode, hdr.Uid, hdr.Gid = o.entries[i].Mode, o.entries[i].Uid, o.entries[i].Gid
		o.entries = append(o.entries, hdr)
		return nil
	})
	o.created = epoch
	flag.Func("created", "RFC 3339 time the image was made: its created time and org.opencontainers.image.created label (default the Unix epoch)", func(s string) error {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return err
		}
		o.created = t.UTC()
		return nil
	})
	flag.Parse()
	if (o.binary == "" && o.rootfs == "") || o.ref == "" || o.out == "" || !allAbs(append([]string{o.path}, append(o.links, o.dirs...)...)) {
		fmt.Fprintln(os.Stderr, "mkimage: -binary or -rootfs, -ref and -o are required and -path, -link and -dir must be absolute")
		flag.Usage()
		os.Exit(2)
	}
	digest, err := build(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", o.ref, digest)
}

// build writes the tarball and returns the image's manifest digest.
func build(o options) (v1.Hash, error) {
	ref, err := name.ParseReference(o.ref, name.StrictValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("parse reference %q: %w", o.ref, err)
	}
	var layers []mutate.Addendum
	if o.rootfs != "" {
		layer, err := tarball.LayerFromFile(o.rootfs)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("read rootfs %s: %w", o.rootfs, err)
		}
		layers = append(layers, mutate.Addendum{Layer: layer,
			History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "mkimage -rootfs " + path.Base(o.rootfs)}})
	}
	if o.binary != "" {
		bin, err := os.ReadFile(o.binary)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("read binary: %w", err)
		}
		layerTar, err := layerOf(o, bin)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("write layer: %w", err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(layerTar)), nil
		})
		if err != nil {
			return v1.Hash{}, fmt.Errorf("make layer: %w", err)
		}
		layers = append(layers, mutate.Addendum{Layer: layer,
			History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "mkimage " + o.path}})
	}
	img, err := mutate.Append(empty.Image, layers...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("append layers: %w", err)
	}
	img, err = configure(img, o)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := tarball.WriteToFile(o.out, ref, img); err != nil {
		return v1.Hash{}, fmt.Errorf("write %s: %w", o.out, err)
	}
	return img.Digest()
}

// configure sets the entrypoint (the binary, if any), user, labels, platform and created time.
func configure(img v1.Image, o options) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = o.arch
	cf.Created = v1.Time{Time: o.created}
	if o.binary != "" {
		cf.Config.Entrypoint = []string{o.path}
	}
	cf.Config.Cmd = o.cmd
	cf.Config.User = o.user
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = labels(o)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// labels are the OCI annotations of the image
// (https://github.com/opencontainers/image-spec/blob/main/annotations.md);
// optional ones are left out when empty.
func labels(o options) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":   o.title,
		"org.opencontainers.image.version": o.version,
		"org.opencontainers.image.source":  o.source,
		"org.opencontainers.image.created": o.created.Format(time.RFC3339),
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.description": o.description,
		"org.opencontainers.image.revision":    o.revision,
	} {
		if v != "" {
			l[k] = v
		}
	}
	return l
}

func allAbs(paths []string) bool {
	for _, p := range paths {
		if !path.IsAbs(p) {
			return false
		}
	}
	return true
}

// layerOf is a tar holding the binary and the other files, read-only and
// executable for all, the links to the binary and the folders, owned by
// root, then the entries as given, all at the fixed epoch.
func layerOf(o options, content []byte) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	rel := func(p string) string { return strings.TrimPrefix(path.Clean(p), "/") }
	for _, d := range o.dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel(d) + "/", Mode: 0o1777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     rel(o.path),
		Mode:     0o555,
		Size:     int64(len(content)),
		ModTime:  epoch,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(content); err != nil {
		return nil, err
	}
	for _, f := range o.files {
		src, dest, _ := strings.Cut(f, ":")
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel(dest), Mode: 0o555, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	for _, l := range o.links {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel(l), Linkname: path.Clean(o.path), Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, hdr := range o.entries {
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(o.contents[hdr.Name]); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
