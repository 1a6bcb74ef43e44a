package concourse

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"golang.org/x/crypto/ssh"
)

// LoadWorkerKey reads the worker's private key (--concourse-worker-key):
// any key golang.org/x/crypto/ssh reads, and the PKCS #1 RSA key in a
// "PRIVATE KEY" block that `concourse generate-key -t ssh` writes.
func LoadWorkerKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("worker key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(b)
	if err == nil {
		return signer, nil
	}
	if block, _ := pem.Decode(b); block != nil {
		if k, perr := x509.ParsePKCS1PrivateKey(block.Bytes); perr == nil {
			return ssh.NewSignerFromKey(k)
		}
	}
	var missing *ssh.PassphraseMissingError
	if errors.As(err, &missing) {
		return nil, fmt.Errorf("worker key %s: it has a passphrase; give a key without one", path)
	}
	return nil, fmt.Errorf("worker key %s: not a private key jetway reads: %w", path, err)
}

// LoadHostKeys reads the TSA's host public keys (--concourse-tsa-public-key):
// one or more lines in authorized_keys form, as `concourse generate-key`
// writes them.
func LoadHostKeys(path string) ([]ssh.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("TSA public key: %w", err)
	}
	var keys []ssh.PublicKey
	for rest := b; len(rest) > 0; {
		k, _, _, r, err := ssh.ParseAuthorizedKey(rest)
		if err != nil {
			if len(keys) > 0 {
				break // trailing text after the keys
			}
			return nil, fmt.Errorf("TSA public key %s: %w", path, err)
		}
		keys = append(keys, k)
		rest = r
	}
	return keys, nil
}
