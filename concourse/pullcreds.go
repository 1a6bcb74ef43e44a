package concourse

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/targets"
	"github.com/jetway-ci/jetway/volumes"
)

// A stock worker runs a registry-image get's rootfs from the get's volume;
// jetway runs the get's repository@digest, which the node pulls, so the
// node needs the credentials the get had. The web node gives them only in
// the stdin of the resource's in script (source.username and password),
// and never says which team a task's container is for, so jetway keeps
// them with the volume they fetched: once the in of a registry-image or
// docker-image base type ends 0, it writes them beside what in wrote, in
// pullCredentialFile, boxed under the installation's pod key
// (ownership.Key.Box). The file goes wherever the volume goes (copies,
// streams, other workers), as the rootfs would on a stock worker: whoever
// has the volume has the image. A container whose image is that volume's
// rootfs gets a pull secret of its own, made right after its pod, owned by
// the pod (so deleted with it), holding the credentials for the
// repository and digest the volume names, and for those alone.

// pullCredentialFile is the file beside a registry-image get's rootfs/
// that holds its source's credentials, boxed.
const pullCredentialFile = ".jetway-pull-credential"

const (
	// pullCredentialBox is the purpose the credentials are boxed for.
	pullCredentialBox = "concourse-pull-credential"
	// maxTappedStdin bounds what is kept of a resource script's stdin for
	// its source: a request with credentials is a few hundred bytes.
	maxTappedStdin = 64 << 10
	// maxPullCredentialFile bounds the boxed file read back.
	maxPullCredentialFile = 16 << 10
)

// credentialBases are the base resource types whose source may carry a
// registry's username and password, as Concourse's resources read it.
var credentialBases = map[string]bool{"registry-image": true, "docker-image": true}

// pullCredential is what a get's source and version say of the image it
// fetched and how to pull it.
type pullCredential struct {
	Repository string `json:"repository"`
	Digest     string `json:"digest,omitempty"`
	Username   string `json:"username"`
	Password   string `json:"password"`
}

// requestCredential is the credential a registry-image or docker-image
// in's request (its stdin) carries, ok false when it carries none.
func requestCredential(stdin []byte) (pullCredential, bool) {
	var in struct {
		Source struct {
			Repository string `json:"repository"`
			Username   string `json:"username"`
			Password   string `json:"password"`
		} `json:"source"`
		Version struct {
			Digest string `json:"digest"`
		} `json:"version"`
	}
	if json.Unmarshal(stdin, &in) != nil || in.Source.Repository == "" || in.Source.Username == "" {
		return pullCredential{}, false
	}
	return pullCredential{Repository: in.Source.Repository, Digest: in.Version.Digest,
		Username: in.Source.Username, Password: in.Source.Password}, true
}

// stdinTap keeps the first maxTappedStdin bytes of a process's stdin.
type stdinTap struct {
	mu   sync.Mutex
	b    bytes.Buffer
	over bool
}

func (t *stdinTap) write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over || t.b.Len()+len(p) > maxTappedStdin {
		t.over, t.b = true, bytes.Buffer{}
		return
	}
	t.b.Write(p)
}

// bytes is what was kept, nil if stdin went past the bound.
func (t *stdinTap) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over {
		return nil
	}
	return bytes.Clone(t.b.Bytes())
}

// credentialTap is the stdin tap of process spec in ct and the pod volume
// of the folder its in writes (its first argument), if spec is the in of
// a base type whose source may carry credentials; nil otherwise.
func (c *Containers) credentialTap(ct *Container, spec processSpec) (*stdinTap, string) {
	if ct.Agent || spec.Path != "/opt/resource/in" || len(spec.Args) != 1 || !c.credentialBase(ct.Image) {
		return nil, ""
	}
	dest := path.Clean(spec.Args[0])
	for i, bm := range ct.Spec.BindMounts {
		if path.Clean(bm.DstPath) == dest {
			return &stdinTap{}, mountVolume(i)
		}
	}
	return nil, ""
}

// processSpec is what credentialTap reads of a process's spec.
type processSpec struct {
	Path string
	Args []string
}

// credentialBase reports whether image is the image of a base resource
// type in credentialBases.
func (c *Containers) credentialBase(image string) bool {
	for _, rt := range c.ResourceTypes {
		if rt.Image == image && credentialBases[rt.Type] {
			return true
		}
	}
	return false
}

// keepCredential writes the credential p's in was given, boxed, into the
// pod volume it wrote, before the web node hears that it ended. A failure
// is logged, not the get's: its image then fails to pull, saying so.
func (c *Containers) keepCredential(ctx context.Context, p *Process) {
	cred, ok := requestCredential(p.tap.bytes())
	if !ok {
		return
	}
	err := c.writeCredential(ctx, p.ct, p.tapVolume, cred)
	if err == nil {
		c.Metrics.pullCredential("kept")
	}
	if err != nil && ctx.Err() == nil {
		c.Metrics.pullCredential("not_kept")
		c.logger().Warn("registry credentials of a get not kept: a container of its image pulls without them",
			"target", p.ct.Target, "handle", p.ct.Handle(), "repository", cred.Repository, "error", err.Error())
	}
}

func (c *Containers) writeCredential(ctx context.Context, ct *Container, volume string, cred pullCredential) error {
	if c.Holder == nil || c.Holder.Server == nil {
		return errors.New("this gateway reaches no pod's volumes")
	}
	plain, _ := json.Marshal(cred)
	boxed, err := c.Pod().Key.Box(pullCredentialBox, plain)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: pullCredentialFile, Mode: 0o644, Size: int64(len(boxed)), ModTime: time.Now(), Typeflag: tar.TypeReg})
	_, _ = tw.Write(boxed)
	_ = tw.Close()
	ctx, cancel := context.WithTimeout(ctx, holderCall)
	defer cancel()
	resp, err := c.Holder.Server(ctx, ct.Target, ct.Pod, http.MethodPut, "/volumes/"+url.PathEscape(volume)+"/stream-in",
		url.Values{"path": {"."}}, http.Header{"Content-Encoding": {volumes.Raw}}, &b)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("write %s: %s", pullCredentialFile, answerError(resp.StatusCode, msg))
	}
	return nil
}

// volumeCredential is the credential kept beside the rootfs of target's
// volume handle for repository and digest, nil if it has none. One that
// is not boxed under the pod key, or names another image, is no
// credential: a task can write any file into its outputs.
func (c *Containers) volumeCredential(ctx context.Context, target, handle, repository, digest string) (*pullCredential, error) {
	b, err := c.Holder.ReadFile(ctx, target, handle, pullCredentialFile, maxPullCredentialFile)
	if errors.Is(err, errVolumeNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	plain, err := c.Pod().Key.Open(pullCredentialBox, b)
	if err != nil {
		c.Metrics.pullCredential("refused")
		c.logger().Warn("registry credentials beside a volume's rootfs refused: jetway did not write them", "target", target, "volume", handle)
		return nil, nil
	}
	var cred pullCredential
	if json.Unmarshal(plain, &cred) != nil || cred.Repository != repository || (cred.Digest != "" && cred.Digest != digest) {
		c.Metrics.pullCredential("refused")
		c.logger().Warn("registry credentials beside a volume's rootfs refused: they are for another image", "target", target, "volume", handle)
		return nil, nil
	}
	return &cred, nil
}

// registryHost is the registry of a repository as the kubelet matches a
// pull secret's keys: its first part when that names a host (a dot, a
// port or localhost), else Docker Hub's.
func registryHost(repository string) string {
	first, _, found := strings.Cut(repository, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first
	}
	return "https://index.docker.io/v1/"
}

// dockerConfigJSON is a kubernetes.io/dockerconfigjson Secret's data for
// cred at its repository's registry.
func dockerConfigJSON(cred pullCredential) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(cred.Username + ":" + cred.Password))
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{registryHost(cred.Repository): map[string]string{
		"username": cred.Username, "password": cred.Password, "auth": auth}}})
	return b
}

// makePullSecret makes the pull secret of pod, a container's, owned by the
// pod: the garbage collector deletes it with the pod, however the pod
// goes. It is made right after the pod, before the kubelet pulls (if it
// pulls first, it pulls again after its back-off, with it).
func makePullSecret(ctx context.Context, t *targets.Target, pod *corev1.Pod, cred pullCredential) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Labels: map[string]string{ContainerLabel: pod.Labels[ContainerLabel],
			ownership.InstallationLabel: pod.Labels[ownership.InstallationLabel]},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: dockerConfigJSON(cred)},
	}
	_, err := t.Core.Secrets(t.Namespace()).Create(ctx, s, metav1.CreateOptions{})
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("the image's registry credentials (from its get's source) need a pull secret, and jetway may not create secrets in %s: "+
			"grant create on secrets there (docs/concourse.md, Registry credentials)", t.Namespace())
	case err != nil:
		return fmt.Errorf("make the pull secret %s/%s: %w", t.Namespace(), pod.Name, err)
	}
	return nil
}
