package concourse

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/jetway-ci/jetway/wire"
)

func write(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// TestLoadWorkerKey reads the key `concourse generate-key -t ssh` writes
// (PKCS #1 RSA in a "PRIVATE KEY" block) and OpenSSH's own, and says what
// is wrong with others.
func TestLoadWorkerKey(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	concourseStyle := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)})
	s, err := LoadWorkerKey(write(t, "worker_key", concourseStyle))
	require.NoError(t, err)
	assert.Equal(t, "ssh-rsa", s.PublicKey().Type())

	_, ek, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(ek, "")
	require.NoError(t, err)
	s, err = LoadWorkerKey(write(t, "id_ed25519", pem.EncodeToMemory(block)))
	require.NoError(t, err)
	assert.Equal(t, "ssh-ed25519", s.PublicKey().Type())

	block, err = ssh.MarshalPrivateKeyWithPassphrase(ek, "", []byte("secret"))
	require.NoError(t, err)
	_, err = LoadWorkerKey(write(t, "locked", pem.EncodeToMemory(block)))
	assert.ErrorContains(t, err, "it has a passphrase")

	_, err = LoadWorkerKey(write(t, "junk", []byte("not a key")))
	assert.ErrorContains(t, err, "not a private key jetway reads")
	_, err = LoadWorkerKey(filepath.Join(t.TempDir(), "missing"))
	assert.ErrorContains(t, err, "worker key")
}

func TestLoadHostKeys(t *testing.T) {
	_, a, _ := ed25519.GenerateKey(rand.Reader)
	_, b, _ := ed25519.GenerateKey(rand.Reader)
	pa, _ := ssh.NewPublicKey(a.Public())
	pb, _ := ssh.NewPublicKey(b.Public())
	keys, err := LoadHostKeys(write(t, "tsa.pub", append(ssh.MarshalAuthorizedKey(pa), ssh.MarshalAuthorizedKey(pb)...)))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	assert.Equal(t, pa.Marshal(), keys[0].Marshal())
	_, err = LoadHostKeys(write(t, "bad.pub", []byte("ssh-rsa nope")))
	assert.ErrorContains(t, err, "TSA public key")
}

func TestLoadResourceTypes(t *testing.T) {
	types, err := LoadResourceTypes(write(t, "types.yaml", []byte(
		"registry-image: docker.io/concourse/registry-image-resource:1.14.2\ngit: docker.io/concourse/git-resource:1.18\n")))
	require.NoError(t, err)
	assert.Equal(t, []wire.ResourceType{{Type: "git", Image: "docker.io/concourse/git-resource:1.18"},
		{Type: "registry-image", Image: "docker.io/concourse/registry-image-resource:1.14.2"}}, types)
	bad := write(t, "bad.yaml", []byte("git: ''\n'a b': x\n"))
	_, err = LoadResourceTypes(bad)
	assert.EqualError(t, err, "resource types "+bad+`: "a b" is not a resource type name; git: no image`)

	// As a stock worker's resource_metadata.json says them.
	types, err = LoadResourceTypes(write(t, "meta.yaml", []byte("time:\n  image: docker.io/concourse/time-resource:1.8.0\n"+
		"  version: 1.8.0\n  unique_version_history: true\ndocker-image: {image: docker.io/concourse/docker-image-resource:1.9, privileged: true}\n"+
		"git: docker.io/concourse/git-resource:1.18\n")))
	require.NoError(t, err)
	assert.Equal(t, []wire.ResourceType{
		{Type: "docker-image", Image: "docker.io/concourse/docker-image-resource:1.9", Privileged: true},
		{Type: "git", Image: "docker.io/concourse/git-resource:1.18"},
		{Type: "time", Image: "docker.io/concourse/time-resource:1.8.0", Version: "1.8.0", UniqueVersionHistory: true}}, types)
	bad = write(t, "badmeta.yaml", []byte("time: {image: x, unique: true}\ngit: {version: '1'}\n"))
	_, err = LoadResourceTypes(bad)
	assert.ErrorContains(t, err, `git: no image`)
	assert.ErrorContains(t, err, `time: want an image reference, or image with version, privileged and unique_version_history: json: unknown field "unique"`)
	_, err = LoadResourceTypes(write(t, "list.yaml", []byte("- git\n")))
	assert.ErrorContains(t, err, "want a map of type to image reference")
	types, err = LoadResourceTypes("")
	assert.NoError(t, err)
	assert.Empty(t, types)
}
