package cluster

import (
	"archive/tar"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The media types of the manifests and blobs the node's registry serves.
const (
	manifestType = "application/vnd.docker.distribution.manifest.v2+json"
	configType   = "application/vnd.docker.container.image.v1+json"
	layerType    = "application/vnd.docker.image.rootfs.diff.tar.gzip"
)

// The credentials NodeRegistry asks for under PrivateRepository: HTTP
// Basic auth, as a registry behind a login answers. A pod pulls from there
// with an imagePullSecrets Secret of type kubernetes.io/dockerconfigjson
// keyed by NodeRegistry; a registry-image source with these as its
// username and password.
const (
	PrivateUser     = "jetway-puller"
	PrivatePassword = "jetway-test-pull-secret"
)

// PrivateRepository is the repository prefix under which NodeRegistry
// serves every image it holds again, but only to a client that sends
// PrivateUser and PrivatePassword: NodeRegistry/private/busybox@sha256:…
// is busybox's manifest.
const PrivateRepository = "private/"

// registry is the registry the harness serves as NodeRegistry on the
// node's bridge. It holds the node's images (NodeImages), each under its
// name without its host (jetway.test/busybox:1 is NodeRegistry/busybox:1),
// by tag and by the digest of the manifest it serves, so a pod's image
// `NodeRegistry/busybox@sha256:…` is pulled for real. It serves:
//
//   - /v2/, open to all (containerd probes it);
//   - the images' manifests by tag and by digest, and their blobs;
//   - the same again under PrivateRepository (NodeRegistry/private/…),
//     each request only with HTTP Basic auth of PrivateUser and
//     PrivatePassword, else 401 Unauthorized with a Basic challenge of
//     realm NodeRegistry and the registry error UNAUTHORIZED;
//   - 429 Too Many Requests for every manifest under NodeRegistry/busy/
//     (a pull that may succeed later);
//   - 404 for every other manifest (a pull that cannot succeed).
//
// The images are small and fixed (a few MiB), so it holds them in memory.
type registry struct {
	manifests map[string][]byte // "busybox:1" and "busybox@sha256:…"
	blobs     map[string][]byte // by digest: configs and layers
}

// loadRegistry reads the `docker save`-style tarballs in dir.
func loadRegistry(dir string, tarballs []string) (*registry, error) {
	r := &registry{manifests: map[string][]byte{}, blobs: map[string][]byte{}}
	for _, name := range tarballs {
		if err := r.load(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("registry: %s: %w", name, err)
		}
	}
	return r, nil
}

func (r *registry) load(tarball string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if files[hdr.Name], err = io.ReadAll(tr); err != nil {
			return err
		}
	}
	var images []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &images); err != nil {
		return fmt.Errorf("manifest.json: %w", err)
	}
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Size      int    `json:"size"`
		Digest    string `json:"digest"`
	}
	blob := func(name, mediaType string) (descriptor, error) {
		b, ok := files[name]
		if !ok {
			return descriptor{}, fmt.Errorf("no %s", name)
		}
		d := digestOf(b)
		r.blobs[d] = b
		return descriptor{MediaType: mediaType, Size: len(b), Digest: d}, nil
	}
	for _, img := range images {
		m := struct {
			SchemaVersion int          `json:"schemaVersion"`
			MediaType     string       `json:"mediaType"`
			Config        descriptor   `json:"config"`
			Layers        []descriptor `json:"layers"`
		}{SchemaVersion: 2, MediaType: manifestType}
		// The config the registry serves is labelled so, which makes
		// the image it names another image than the one imported into
		// the node's containerd (another ID): a pod that pulls it by
		// digest leaves the imported image's references alone.
		config, err := servedConfig(files[img.Config])
		if err != nil {
			return fmt.Errorf("%s: %w", img.Config, err)
		}
		files[img.Config+"+served"] = config
		if m.Config, err = blob(img.Config+"+served", configType); err != nil {
			return err
		}
		for _, l := range img.Layers {
			d, err := blob(l, layerType)
			if err != nil {
				return err
			}
			m.Layers = append(m.Layers, d)
		}
		raw, err := json.Marshal(m)
		if err != nil {
			return err
		}
		for _, ref := range img.RepoTags {
			_, path, _ := strings.Cut(ref, "/") // without the host
			repo, tag, _ := strings.Cut(path, ":")
			r.manifests[repo+":"+tag] = raw
			r.manifests[repo+"@"+digestOf(raw)] = raw
		}
	}
	return nil
}

// servedConfig is an image config with the label
// jetway.test/served-by=registry.
func servedConfig(b []byte) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, err
	}
	inner, _ := cfg["config"].(map[string]any)
	if inner == nil {
		inner = map[string]any{}
		cfg["config"] = inner
	}
	labels, _ := inner["Labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		inner["Labels"] = labels
	}
	labels["jetway.test/served-by"] = "registry"
	return json.Marshal(cfg)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (r *registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	p := req.URL.Path
	fail := func(status int, code, message string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`, code, message)
	}
	serve := func(b []byte, mediaType, digest string) {
		w.Header().Set("Content-Type", mediaType)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Header().Set("Docker-Content-Digest", digest)
		if req.Method != http.MethodHead {
			_, _ = w.Write(b)
		}
	}
	if rest, ok := strings.CutPrefix(p, "/v2/"+PrivateRepository); ok {
		if !privateAuthorized(req) {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf("Basic realm=%q", NodeRegistry))
			fail(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		}
		p = "/v2/" + rest
	}
	switch {
	case p == "/v2/":
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
	case strings.HasPrefix(p, "/v2/busy/"):
		fail(http.StatusTooManyRequests, "TOOMANYREQUESTS", "you have reached your pull rate limit")
	case strings.Contains(p, "/manifests/"):
		repo, ref, _ := strings.Cut(strings.TrimPrefix(p, "/v2/"), "/manifests/")
		m, ok := r.manifests[repo+":"+ref]
		if !ok {
			m, ok = r.manifests[repo+"@"+ref]
		}
		if !ok {
			fail(http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown")
			return
		}
		serve(m, manifestType, digestOf(m))
	case strings.Contains(p, "/blobs/"):
		_, digest, _ := strings.Cut(p, "/blobs/")
		b, ok := r.blobs[digest]
		if !ok {
			fail(http.StatusNotFound, "BLOB_UNKNOWN", "blob unknown")
			return
		}
		serve(b, "application/octet-stream", digest)
	default:
		fail(http.StatusNotFound, "NAME_UNKNOWN", "repository name not known to registry")
	}
}

// privateAuthorized tells whether req carries PrivateUser and
// PrivatePassword.
func privateAuthorized(req *http.Request) bool {
	user, password, ok := req.BasicAuth()
	return ok && subtle.ConstantTimeCompare([]byte(user), []byte(PrivateUser)) == 1 &&
		subtle.ConstantTimeCompare([]byte(password), []byte(PrivatePassword)) == 1
}
