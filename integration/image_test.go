package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// builtImage is one image `make image` writes into the bin dir, and what
// it must hold.
type builtImage struct {
	file  string   // the tarball
	repo  string   // its tag's repository; the tag is the version
	path  string   // the one file: the binary, also the entrypoint
	cmd   []string // default arguments to the entrypoint
	title string   // org.opencontainers.image.title
	// version, when set, runs the binary taken out of the image with these
	// arguments; it must print versionPrefix and the image's version.
	version       []string
	versionPrefix string
}

var builtImages = []builtImage{{
	file:  "step-agent-image.tar",
	repo:  "ghcr.io/jetway-ci/step-agent",
	path:  "/step-agent",
	title: "jetway step-agent",
}, {
	file:          "gateway-image.tar",
	repo:          "ghcr.io/jetway-ci/gateway",
	path:          "/gateway",
	cmd:           []string{"run"},
	title:         "jetway gateway",
	version:       []string{"version"},
	versionPrefix: "gateway ",
}}

// imageConfig is the part of an OCI image config the test checks.
type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Created      string `json:"created"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		User       string            `json:"User"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// TestImages opens each tarball `make image` builds, as `docker load`
// would: the manifest names the image and its one layer, the config runs
// the binary as a non-root user on this machine's platform with the OCI
// labels, and the layer holds the binary alone, a static executable of
// that platform, which runs here.
func TestImages(t *testing.T) {
	for _, im := range builtImages {
		t.Run(strings.TrimPrefix(im.path, "/"), func(t *testing.T) { checkImage(t, im) })
	}
}

func checkImage(t *testing.T, im builtImage) {
	files := readImageTar(t, im.file)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(need(t, files, "manifest.json"), &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(manifest) != 1 || len(manifest[0].Layers) != 1 || len(manifest[0].RepoTags) != 1 {
		t.Fatalf("manifest.json: want one image with one tag and one layer, got %+v", manifest)
	}
	m := manifest[0]
	version, ok := strings.CutPrefix(m.RepoTags[0], im.repo+":")
	if !ok || version == "" {
		t.Fatalf("image tag %q, want %s:<version>", m.RepoTags[0], im.repo)
	}
	var cfg imageConfig
	if err := json.Unmarshal(need(t, files, m.Config), &cfg); err != nil {
		t.Fatalf("config %s: %v", m.Config, err)
	}
	checkImageConfig(t, im, cfg, version)

	layer := gunzip(t, need(t, files, m.Layers[0]))
	sum := sha256.Sum256(layer)
	if want := "sha256:" + hex.EncodeToString(sum[:]); len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != want {
		t.Errorf("config diff_ids %v, want [%s] (the layer's)", cfg.RootFS.DiffIDs, want)
	}
	bin := checkLayer(t, im.path, layer, cfg.Architecture)
	if im.version != nil {
		checkRuns(t, im, bin, version)
	}
}

func checkImageConfig(t *testing.T, im builtImage, cfg imageConfig, version string) {
	t.Helper()
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{im.path}) || !slices.Equal(cfg.Config.Cmd, im.cmd) {
		t.Errorf("entrypoint %q cmd %q, want [%s] and cmd %q", cfg.Config.Entrypoint, cfg.Config.Cmd, im.path, im.cmd)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cfg.Config.User)
	}
	labels := cfg.Config.Labels
	want := map[string]string{
		"org.opencontainers.image.title":   im.title,
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.source":  "https://github.com/jetway-ci/jetway",
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
	if labels["org.opencontainers.image.description"] == "" {
		t.Errorf("label org.opencontainers.image.description is missing")
	}
	if rev := labels["org.opencontainers.image.revision"]; !regexp.MustCompile(`^[0-9a-f]{40,64}$`).MatchString(rev) {
		t.Errorf("label org.opencontainers.image.revision = %q, want the commit's id", rev)
	}
	// created is the commit's time, the config's and the label's alike.
	created, err := time.Parse(time.RFC3339, labels["org.opencontainers.image.created"])
	if err != nil {
		t.Errorf("label org.opencontainers.image.created: %v", err)
	}
	if cfgCreated, err := time.Parse(time.RFC3339, cfg.Created); err != nil || !cfgCreated.Equal(created) {
		t.Errorf("config created %q, want the label's %v (%v)", cfg.Created, created, err)
	}
}

// checkLayer wants exactly one file, at path, executable by all, a
// statically linked ELF for arch, and returns it.
func checkLayer(t *testing.T, path string, layer []byte, arch string) []byte {
	t.Helper()
	name := strings.TrimPrefix(path, "/")
	tr := tar.NewReader(bytes.NewReader(layer))
	hdr, err := tr.Next()
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	if strings.TrimPrefix(hdr.Name, "/") != name || hdr.Typeflag != tar.TypeReg || hdr.Mode != 0o555 {
		t.Fatalf("layer entry %q type %c mode %o, want regular file %s mode 555", hdr.Name, hdr.Typeflag, hdr.Mode, name)
	}
	bin, err := io.ReadAll(tr)
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	if next, err := tr.Next(); err != io.EOF {
		t.Errorf("layer holds more than %s: %v %v", name, next, err)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s is not an ELF executable: %v", path, err)
	}
	defer f.Close()
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s is %v %v, want %v ET_EXEC for %s", path, f.Machine, f.Type, machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is dynamically linked (%v); it must run in an empty image", path, p.Type)
		}
	}
	return bin
}

// checkRuns runs the binary taken out of the image (static, of this
// machine's platform, so it runs here as it would in its image) and
// wants it to print its version.
func checkRuns(t *testing.T, im builtImage, bin []byte, version string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(im.path))
	if err := os.WriteFile(path, bin, 0o555); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, im.version...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", im.path, strings.Join(im.version, " "), err, out)
	}
	if want := im.versionPrefix + version + " "; !strings.HasPrefix(string(out), want) {
		t.Errorf("%s %s printed %q, want it to start %q", im.path, strings.Join(im.version, " "), out, want)
	}
}

// readImageTar returns every file of the image tarball by name.
func readImageTar(t *testing.T, file string) map[string][]byte {
	t.Helper()
	dir := os.Getenv(cluster.EnvBinDir)
	if dir == "" {
		dir = filepath.Join("..", "bin")
	}
	path := filepath.Join(dir, file)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s is missing: run make image", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if files[hdr.Name], err = io.ReadAll(tr); err != nil {
			t.Fatalf("read %s: %s: %v", path, hdr.Name, err)
		}
	}
}

func need(t *testing.T, files map[string][]byte, name string) []byte {
	t.Helper()
	b, ok := files[name]
	if !ok {
		t.Fatalf("image tarball has no %s", name)
	}
	return b
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	return out
}
