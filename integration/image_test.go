package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// imageFile is what `make image` writes into the bin dir.
const imageFile = "step-agent-image.tar"

// imageConfig is the part of an OCI image config the test checks.
type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
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

// TestStepAgentImage opens the tarball `make image` builds, as `docker
// load` would: the manifest names the image and its one layer, the config
// runs /step-agent as a non-root user on this machine's platform, and the
// layer holds the agent as a static executable of that platform.
func TestStepAgentImage(t *testing.T) {
	files := readImageTar(t)
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
	if !strings.HasPrefix(m.RepoTags[0], "ghcr.io/jetway-ci/step-agent:") {
		t.Errorf("image tag %q, want ghcr.io/jetway-ci/step-agent:<version>", m.RepoTags[0])
	}
	var cfg imageConfig
	if err := json.Unmarshal(need(t, files, m.Config), &cfg); err != nil {
		t.Fatalf("config %s: %v", m.Config, err)
	}
	checkImageConfig(t, cfg, strings.TrimPrefix(m.RepoTags[0], "ghcr.io/jetway-ci/step-agent:"))

	layer := gunzip(t, need(t, files, m.Layers[0]))
	sum := sha256.Sum256(layer)
	if want := "sha256:" + hex.EncodeToString(sum[:]); len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != want {
		t.Errorf("config diff_ids %v, want [%s] (the layer's)", cfg.RootFS.DiffIDs, want)
	}
	checkAgentLayer(t, layer, cfg.Architecture)
}

func checkImageConfig(t *testing.T, cfg imageConfig, version string) {
	t.Helper()
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/step-agent" || len(cfg.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/step-agent] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cfg.Config.User)
	}
	want := map[string]string{
		"org.opencontainers.image.title":   "jetway step-agent",
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.source":  "https://github.com/jetway-ci/jetway",
	}
	for k, v := range want {
		if cfg.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cfg.Config.Labels[k], v)
		}
	}
}

// checkAgentLayer wants exactly one file, step-agent, executable by all,
// a statically linked ELF for arch.
func checkAgentLayer(t *testing.T, layer []byte, arch string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(layer))
	hdr, err := tr.Next()
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	if strings.TrimPrefix(hdr.Name, "/") != "step-agent" || hdr.Typeflag != tar.TypeReg || hdr.Mode != 0o555 {
		t.Fatalf("layer entry %q type %c mode %o, want regular file step-agent mode 555", hdr.Name, hdr.Typeflag, hdr.Mode)
	}
	bin, err := io.ReadAll(tr)
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	if next, err := tr.Next(); err != io.EOF {
		t.Errorf("layer holds more than step-agent: %v %v", next, err)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("/step-agent is not an ELF executable: %v", err)
	}
	defer f.Close()
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("/step-agent is %v %v, want %v ET_EXEC for %s", f.Machine, f.Type, machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/step-agent is dynamically linked (%v); it must run in any image", p.Type)
		}
	}
}

// readImageTar returns every file of the image tarball by name.
func readImageTar(t *testing.T) map[string][]byte {
	t.Helper()
	dir := os.Getenv(cluster.EnvBinDir)
	if dir == "" {
		dir = filepath.Join("..", "bin")
	}
	path := filepath.Join(dir, imageFile)
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
