package targets

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// Policy says which risky kubeconfig features the operator allows. Each is
// refused unless enabled by name.
type Policy struct {
	AllowExecPlugins   bool
	AllowAuthProviders bool
	AllowInsecureTLS   bool
	AllowExternalFiles bool
}

// Metadata is what placement and step pods need to know about a target.
// It comes from target.yaml or from the `jetway` extension of the
// kubeconfig's current context.
type Metadata struct {
	Team           string              `json:"team,omitempty"`
	Tags           []string            `json:"tags,omitempty"`
	Platform       string              `json:"platform,omitempty"`
	Namespace      string              `json:"namespace,omitempty"`
	NodeSelector   map[string]string   `json:"nodeSelector,omitempty"`
	Tolerations    []corev1.Toleration `json:"tolerations,omitempty"`
	MaxActiveTasks int                 `json:"maxActiveTasks,omitempty"`
	// ImagePullSecrets name Secrets of the namespace that step pods pull
	// their images with.
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// Steps is what the target's operator allows its step pods and the
	// sizes and requests they get (StepPolicy).
	Steps StepPolicy `json:"steps,omitzero"`
	// Concourse is how it registers as a Concourse worker
	// (ConcourseWorker).
	Concourse ConcourseWorker `json:"concourse,omitzero"`
}

// DefaultPlatform is a target's platform when its metadata names none.
const DefaultPlatform = "linux"

// ExtensionName is the kubeconfig context extension holding metadata.
const ExtensionName = "jetway"

// Config is one target's validated configuration.
type Config struct {
	Name string
	Meta Metadata
	// Server is the API server URL.
	Server string
	// REST carries the credentials; it is never logged or served.
	REST *rest.Config
	// hash identifies the entry's content, to tell changed entries apart.
	hash string
}

// entry is one target's raw material as read from the directory.
type entry struct {
	name       string
	dir        string // folder the kubeconfig's relative paths start from
	kubeconfig []byte
	targetYAML []byte // nil when absent
}

// ParseKubeconfig validates one target's self-contained kubeconfig, its
// metadata in the context's `jetway` extension, as the targets directory's
// entry NAME.kubeconfig would be read under policy. It has no directory, so
// a kubeconfig naming files (a CA file, a token file) is refused.
func ParseKubeconfig(name string, kubeconfig []byte, policy Policy) (*Config, error) {
	return parse(entry{name: name, kubeconfig: kubeconfig}, "", policy)
}

// parse validates e against policy and builds its Config. Errors name the
// offending field and never quote credentials.
func parse(e entry, root string, policy Policy) (*Config, error) {
	if errs := validation.IsDNS1123Label(e.name); len(errs) > 0 {
		return nil, fmt.Errorf("%w: name %q is not a DNS-1123 label: %s", ErrInvalidEntry, e.name, strings.Join(errs, "; "))
	}
	kc, err := clientcmd.Load(e.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%w: kubeconfig does not parse: %v", ErrInvalidEntry, err)
	}
	ctxName := kc.CurrentContext
	kctx, ok := kc.Contexts[ctxName]
	if ctxName == "" || !ok {
		return nil, fmt.Errorf("%w: kubeconfig current-context %q does not exist", ErrInvalidEntry, ctxName)
	}
	cluster, ok := kc.Clusters[kctx.Cluster]
	if !ok {
		return nil, fmt.Errorf("%w: context %q names cluster %q, which does not exist", ErrInvalidEntry, ctxName, kctx.Cluster)
	}
	user, ok := kc.AuthInfos[kctx.AuthInfo]
	if !ok {
		return nil, fmt.Errorf("%w: context %q names user %q, which does not exist", ErrInvalidEntry, ctxName, kctx.AuthInfo)
	}
	var files []byte
	if err := checkPolicy(kctx, cluster, user, e.dir, root, policy, &files); err != nil {
		return nil, err
	}
	meta, err := metadata(e, kctx)
	if err != nil {
		return nil, err
	}
	// Only the current context matters; a config reduced to it cannot
	// reach for another context's credentials.
	cc := clientcmd.NewNonInteractiveClientConfig(*kc, ctxName, &clientcmd.ConfigOverrides{}, nil)
	restConfig, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: kubeconfig: %v", ErrInvalidEntry, err)
	}
	h := sha256.New()
	for _, b := range [][]byte{e.kubeconfig, e.targetYAML, files} {
		h.Write(b)
		h.Write([]byte{0})
	}
	return &Config{Name: e.name, Meta: meta, Server: cluster.Server, REST: restConfig, hash: hex.EncodeToString(h.Sum(nil))}, nil
}

// checkPolicy refuses what the operator has not allowed, resolves relative
// file paths against dir in place, and appends the referenced files'
// contents to files (so a rotated certificate file counts as a change).
func checkPolicy(kctx *clientcmdapi.Context, cluster *clientcmdapi.Cluster, user *clientcmdapi.AuthInfo,
	dir, root string, policy Policy, files *[]byte) error {
	var errs []error
	if user.Exec != nil && !policy.AllowExecPlugins {
		errs = append(errs, fmt.Errorf("user %q uses exec plugin %q (allow with --allow-exec-plugins)", kctx.AuthInfo, user.Exec.Command))
	}
	if user.AuthProvider != nil && !policy.AllowAuthProviders {
		errs = append(errs, fmt.Errorf("user %q uses auth-provider %q (allow with --allow-auth-providers)", kctx.AuthInfo, user.AuthProvider.Name))
	}
	if cluster.InsecureSkipTLSVerify && !policy.AllowInsecureTLS {
		errs = append(errs, fmt.Errorf("cluster %q sets insecure-skip-tls-verify (allow with --allow-insecure-tls)", kctx.Cluster))
	}
	for _, f := range []struct {
		field string
		path  *string
	}{
		{"clusters[" + kctx.Cluster + "].certificate-authority", &cluster.CertificateAuthority},
		{"users[" + kctx.AuthInfo + "].client-certificate", &user.ClientCertificate},
		{"users[" + kctx.AuthInfo + "].client-key", &user.ClientKey},
		{"users[" + kctx.AuthInfo + "].tokenFile", &user.TokenFile},
	} {
		if *f.path == "" {
			continue
		}
		resolved, err := resolveFile(*f.path, dir, root, policy.AllowExternalFiles)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.field, err))
			continue
		}
		*f.path = resolved
		if b, err := os.ReadFile(resolved); err == nil {
			*files = append(*files, b...)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRefused, errors.Join(errs...))
	}
	return nil
}

// resolveFile makes path absolute (relative to dir) and, unless external
// files are allowed, requires it to lie inside root once symlinks are
// followed.
func resolveFile(path, dir, root string, allowExternal bool) (string, error) {
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("file %s: %w", path, errors.Unwrap(err))
	}
	if allowExternal {
		return real, nil
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(realRoot, real); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("file %s is outside the targets directory (allow with --allow-external-files)", path)
	}
	return real, nil
}

// metadata reads target.yaml, else the context extension, then defaults
// and validates it.
func metadata(e entry, kctx *clientcmdapi.Context) (Metadata, error) {
	var m Metadata
	switch {
	case e.targetYAML != nil:
		if err := yaml.UnmarshalStrict(e.targetYAML, &m); err != nil {
			return m, fmt.Errorf("%w: target.yaml: %v", ErrInvalidEntry, err)
		}
	case kctx.Extensions[ExtensionName] != nil:
		raw, err := extensionJSON(kctx.Extensions[ExtensionName])
		if err == nil {
			err = yaml.UnmarshalStrict(raw, &m)
		}
		if err != nil {
			return m, fmt.Errorf("%w: context extension %q: %v", ErrInvalidEntry, ExtensionName, err)
		}
	}
	if m.Platform == "" {
		m.Platform = DefaultPlatform
	}
	if m.Namespace == "" {
		m.Namespace = kctx.Namespace
	}
	if m.Namespace == "" {
		m.Namespace = "default"
	}
	if err := m.validate(); err != nil {
		return m, fmt.Errorf("%w: %v", ErrInvalidEntry, err)
	}
	return m, nil
}

func extensionJSON(obj runtime.Object) ([]byte, error) {
	if u, ok := obj.(*runtime.Unknown); ok {
		return u.Raw, nil
	}
	return json.Marshal(obj)
}

func (m Metadata) validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(m.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s", m.Namespace, strings.Join(msgs, "; ")))
	}
	for i, tag := range m.Tags {
		if strings.TrimSpace(tag) == "" {
			errs = append(errs, fmt.Errorf("tags[%d] is empty", i))
		}
		if slices.Contains(m.Tags[:i], tag) {
			errs = append(errs, fmt.Errorf("tags[%d] %q is repeated", i, tag))
		}
	}
	if m.MaxActiveTasks < 0 {
		errs = append(errs, fmt.Errorf("maxActiveTasks must not be negative, got %d", m.MaxActiveTasks))
	}
	for k, v := range m.NodeSelector {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("nodeSelector key %q: %s", k, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("nodeSelector[%s] value %q: %s", k, v, strings.Join(msgs, "; ")))
		}
	}
	if err := m.Steps.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := m.Concourse.validate(); err != nil {
		errs = append(errs, err)
	}
	for i, t := range m.Tolerations {
		if t.Operator != "" && t.Operator != corev1.TolerationOpEqual && t.Operator != corev1.TolerationOpExists {
			errs = append(errs, fmt.Errorf("tolerations[%d].operator %q is not Equal or Exists", i, t.Operator))
		}
	}
	return errors.Join(errs...)
}

// Hash identifies the content of the target's entry (kubeconfig, metadata,
// referenced files): equal hashes, same target definition.
func (c *Config) Hash() string { return c.hash }
