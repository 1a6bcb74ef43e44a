package ownership

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Labels say whose a pod is, but anyone who may create or patch pods in a
// target namespace can write them. So every pod jetway makes carries, from
// the installation's pod key (a Secret in the state namespace, which only
// the gateways read):
//
//   - a seal (SealAnnotation): an HMAC of the target, the pod's name and its
//     team label. A pod without a seal that matches (planted, or its team
//     label changed) is not jetway's. The seal is no secret; it cannot be
//     made for another name or team without the key, but it can be copied
//     onto a later pod of the same name: so it alone says only that jetway
//     may delete the pod.
//   - a nonce (NonceAnnotation), random for each pod jetway makes, and the
//     SHA-256 of the pod's token (TokenHash, in the volume sidecar's
//     environment): the token, an HMAC of the target, the pod's name and
//     its nonce, is the sidecar's credential. The gateways derive it, the
//     pod holds only its hash, and a token seen by one pod opens no other,
//     not even a later one of the same name.
//   - a binding (BoundAnnotation), written by the gateway that made the pod
//     once its create returned (Bind): an HMAC of the seal's parts, the
//     nonce and the UID the API server gave that pod. UIDs are never
//     reused, so no other pod can carry it. A gateway trusts a pod (sends
//     it a token, a spec, an input; takes its output, its status) only
//     when it is Bound: a pod made in the name of one of jetway's, before
//     or after it, with everything copied from its spec, gets nothing.
const (
	SealAnnotation  = "jetway-ci.dev/seal"
	NonceAnnotation = "jetway-ci.dev/nonce"
	BoundAnnotation = "jetway-ci.dev/bound"
	// keyData is the key's data key in its Secret.
	keyData = "pod-key"
	keySize = 32
)

// Key is an installation's pod key, or a key still to be read (see
// KeyLoader): copies share it. A Key not read yet, as the zero Key, seals
// nothing and verifies nothing.
type Key struct{ s *keyState }

type keyState struct {
	ready chan struct{} // closed once b is set
	b     []byte
}

// NewKey makes a Key of at least 32 bytes of secret.
func NewKey(b []byte) (Key, error) {
	if len(b) < keySize {
		return Key{}, fmt.Errorf("a pod key has at least %d bytes, not %d", keySize, len(b))
	}
	s := &keyState{ready: make(chan struct{}), b: append([]byte(nil), b...)}
	close(s.ready)
	return Key{s: s}, nil
}

// Ready is closed once the key is read; it is never closed for the zero
// Key.
func (k Key) Ready() <-chan struct{} {
	if k.s == nil {
		return nil
	}
	return k.s.ready
}

// bytes is the key, or nil before it is read.
func (k Key) bytes() []byte {
	select {
	case <-k.Ready():
		return k.s.b
	default:
		return nil
	}
}

// IsZero reports whether the key is missing: the zero Key, or one not
// read yet.
func (k Key) IsZero() bool { return k.bytes() == nil }

// mac is the HMAC of parts under the key; "" before the key is read.
func (k Key) mac(parts ...string) string {
	b := k.bytes()
	if b == nil {
		return ""
	}
	m := hmac.New(sha256.New, b)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// Token is the volume sidecar's credential of pod on target, made with
// nonce (its NonceAnnotation). A pod made before nonces has none, and the
// token it was made with: bound, as its step's record vouches for it.
func (k Key) Token(target, pod, nonce string) string {
	if nonce == "" {
		return k.mac("token", target, pod)
	}
	return k.mac("token", target, pod, nonce)
}

// PodToken is the volume sidecar's credential of p, a pod of target.
func (k Key) PodToken(target string, p *corev1.Pod) string {
	return k.Token(target, p.Name, p.Annotations[NonceAnnotation])
}

// NewNonce is a pod's nonce: 128 random bits.
func NewNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Seal is the seal of pod on target for team ("" for admins alone).
func (k Key) Seal(target, pod, team string) string { return k.mac("seal", target, pod, team) }

// Sealed reports whether o, a pod of target (or another object jetway
// makes sealed, such as a volume holder's claim), carries the seal of its
// name and team label: whether jetway may delete it. Whether it may
// trust a pod is Bound.
func (k Key) Sealed(target string, o metav1.Object) bool {
	if k.IsZero() {
		return false
	}
	return equal(o.GetAnnotations()[SealAnnotation], k.Seal(target, o.GetName(), o.GetLabels()[TeamLabel]))
}

// binding is the BoundAnnotation of p on target: its seal's parts, its
// nonce and its UID.
func (k Key) binding(target string, p *corev1.Pod) string {
	return k.mac("bound", target, p.Name, p.Labels[TeamLabel], p.Annotations[NonceAnnotation], string(p.UID))
}

// Bound reports whether p, a pod of target, is sealed and bound to the
// UID it has: jetway made this very pod, not only one of its name.
func (k Key) Bound(target string, p *corev1.Pod) bool {
	return k.Sealed(target, p) && p.UID != "" && equal(p.Annotations[BoundAnnotation], k.binding(target, p))
}

func equal(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// Why a pod is not trusted (Verdict), as the metrics of refused pods say.
const (
	// Unsealed: no seal of its name and team; jetway did not make it.
	Unsealed = "unsealed"
	// Unbound: sealed, but not bound to its UID: planted with a seal
	// copied from a pod of the same name, or made by a gateway that
	// stopped before it bound it.
	Unbound = "unbound"
)

// Verdict is "" when jetway may trust p, a pod of target (Bound), else
// why not: Unsealed or Unbound.
func (k Key) Verdict(target string, p *corev1.Pod) string {
	switch {
	case !k.Sealed(target, p):
		return Unsealed
	case !k.Bound(target, p):
		return Unbound
	}
	return ""
}

// TokenHash is the SHA-256, in hex, of a token: what a sidecar holds.
func TokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// KeySecretName is the Secret holding an installation's pod key in its
// state namespace.
func KeySecretName(installation string) string { return "jetway-" + installation + "-pod-key" }

// KeySecret is the Secret holding installation's pod key b.
func KeySecret(installation string, b []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: KeySecretName(installation), Labels: map[string]string{InstallationLabel: installation}},
		Type:       "jetway-ci.dev/pod-key",
		Data:       map[string][]byte{keyData: b},
	}
}

// loadTimeout bounds reading (or making) the key.
const loadTimeout = 30 * time.Second

// LoadKey reads the installation's pod key from namespace, making it the
// first time: of gateways starting together, the first to create it wins
// and the others read it.
func LoadKey(ctx context.Context, secrets corev1client.SecretsGetter, namespace, installation string) (Key, error) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	name := KeySecretName(installation)
	api := secrets.Secrets(namespace)
	for range 3 {
		s, err := api.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			k, err := NewKey(s.Data[keyData])
			if err != nil {
				return Key{}, fmt.Errorf("pod key %s/%s: %w", namespace, name, err)
			}
			return k, nil
		}
		if !apierrors.IsNotFound(err) {
			return Key{}, fmt.Errorf("read pod key %s/%s: %w", namespace, name, err)
		}
		b := make([]byte, keySize)
		_, _ = rand.Read(b)
		_, err = api.Create(ctx, KeySecret(installation, b), metav1.CreateOptions{})
		if err == nil {
			return NewKey(b)
		}
		if !apierrors.IsAlreadyExists(err) {
			return Key{}, fmt.Errorf("make pod key %s/%s: %w", namespace, name, err)
		}
	}
	return Key{}, errors.New("pod key: created and deleted under us; try again")
}

// KeyLoader reads the installation's pod key from the state namespace in
// the background, again and again until it has it (the state namespace's
// API server may be down as the gateway starts): its Key is usable once
// Ready is closed.
type KeyLoader struct {
	secrets      corev1client.SecretsGetter
	namespace    string
	installation string
	logger       *slog.Logger
	key          Key
}

// NewKeyLoader makes a KeyLoader; Start reads the key.
func NewKeyLoader(secrets corev1client.SecretsGetter, namespace, installation string, logger *slog.Logger) *KeyLoader {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &KeyLoader{secrets: secrets, namespace: namespace, installation: installation, logger: logger,
		key: Key{s: &keyState{ready: make(chan struct{})}}}
}

// Key is the key the loader reads: not ready until it did.
func (l *KeyLoader) Key() Key { return l.key }

// Start reads the key, retrying with backoff (1 s to 30 s), then waits for
// ctx to end.
func (l *KeyLoader) Start(ctx context.Context) error {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		k, err := LoadKey(ctx, l.secrets, l.namespace, l.installation)
		if err == nil {
			l.key.s.b = k.s.b
			close(l.key.s.ready)
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		l.logger.Warn("pod key not read; steps wait for it", "error", err.Error(), "retry_in", wait.String())
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
	<-ctx.Done()
	return nil
}
