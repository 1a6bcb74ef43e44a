package ownership

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
)

// ErrNotBoxed: what Open was given was not boxed under this key for
// that purpose (made by someone else, changed, or cut).
var ErrNotBoxed = errors.New("not sealed by this installation's key for this use")

// Box encrypts and authenticates b under a key derived from the pod key
// for purpose (AES-256-GCM, a random nonce): only a gateway of the
// installation can read it, or make one Open takes. What jetway leaves
// where a step may read or copy it (a registry credential beside a
// volume's rootfs) is boxed.
func (k Key) Box(purpose string, b []byte) ([]byte, error) {
	aead, err := k.aead(purpose)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(b)+aead.Overhead())
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, b, []byte(purpose)), nil
}

// Open is what Box boxed for purpose: ErrNotBoxed if boxed was not made
// so under this key.
func (k Key) Open(purpose string, boxed []byte) ([]byte, error) {
	aead, err := k.aead(purpose)
	if err != nil {
		return nil, err
	}
	if len(boxed) < aead.NonceSize() {
		return nil, ErrNotBoxed
	}
	b, err := aead.Open(nil, boxed[:aead.NonceSize()], boxed[aead.NonceSize():], []byte(purpose))
	if err != nil {
		return nil, ErrNotBoxed
	}
	return b, nil
}

func (k Key) aead(purpose string) (cipher.AEAD, error) {
	if k.IsZero() {
		return nil, errors.New("the installation's pod key is not read yet")
	}
	key, err := hex.DecodeString(k.mac("box", purpose)) // 32 bytes: AES-256
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
