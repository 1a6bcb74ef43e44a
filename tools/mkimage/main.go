// Command mkimage packs one static binary into an OCI image and writes it
// as a `docker save`-style tarball (what `docker load`, `ctr images
// import`, `kind load image-archive` and `crane push` read). It needs no
// Docker daemon and no base image: the image is the binary alone, built up
// from an empty image. Every timestamp is fixed, so the same binary gives
// the same image digest.
//
//	mkimage -binary bin/step-agent-linux-amd64 -path /step-agent \
//	    -ref ghcr.io/jetway-ci/step-agent:v1 -version v1 -o bin/step-agent-image.tar
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
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every timestamp in the image: the layer's file and the config's
// created time. A fixed value keeps the digest reproducible.
var epoch = time.Unix(0, 0).UTC()

type options struct {
	binary, path, ref, version, source, title, user, arch, out string
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "static binary to put in the image (required)")
	flag.StringVar(&o.path, "path", "/step-agent", "absolute path of the binary in the image; also the entrypoint")
	flag.StringVar(&o.ref, "ref", "", "image reference the tarball names, e.g. ghcr.io/jetway-ci/step-agent:v1 (required)")
	flag.StringVar(&o.version, "version", "dev", "org.opencontainers.image.version label")
	flag.StringVar(&o.source, "source", "https://github.com/jetway-ci/jetway", "org.opencontainers.image.source label")
	flag.StringVar(&o.title, "title", "jetway step-agent", "org.opencontainers.image.title label")
	flag.StringVar(&o.user, "user", "65532:65532", "user the entrypoint runs as")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "architecture of the binary (GOARCH)")
	flag.StringVar(&o.out, "o", "", "tarball to write (required)")
	flag.Parse()
	if o.binary == "" || o.ref == "" || o.out == "" || !path.IsAbs(o.path) {
		fmt.Fprintln(os.Stderr, "mkimage: -binary, -ref and -o are required and -path must be absolute")
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
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("read binary: %w", err)
	}
	layerTar, err := layerOf(strings.TrimPrefix(o.path, "/"), bin)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("make layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("append layer: %w", err)
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

// configure sets the entrypoint, user, labels, platform and created time.
func configure(img v1.Image, o options) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = o.arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{o.path}
	cf.Config.Cmd = nil
	cf.Config.User = o.user
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   o.title,
		"org.opencontainers.image.version": o.version,
		"org.opencontainers.image.source":  o.source,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// layerOf is a tar holding one file, read-only and executable for all,
// owned by root, at the fixed epoch.
func layerOf(name string, content []byte) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
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
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
