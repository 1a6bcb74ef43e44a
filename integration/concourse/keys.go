package concourse

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"
)

// keyBits is the size of every RSA key made here: `concourse
// generate-key`'s default, 4096, takes about 0.9 s a key on two cores;
// 2048 about 0.1 s.
const keyBits = "2048"

// generateKeys makes the session signing key, the TSA's host key and one
// worker key, in parallel, and authorizes the worker key.
func (w *WebNode) generateKeys(ctx context.Context) error {
	if err := os.MkdirAll(w.keysDir, 0o700); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.generateKey(gctx, "rsa", "session_signing_key") })
	g.Go(func() error { return w.generateKey(gctx, "ssh", "tsa_host_key") })
	g.Go(func() error { return w.generateKey(gctx, "ssh", "worker_key") })
	if err := g.Wait(); err != nil {
		return err
	}
	w.TSAPublicKey = filepath.Join(w.keysDir, "tsa_host_key.pub")
	w.WorkerKey = filepath.Join(w.keysDir, "worker_key")
	w.WorkerPublicKey = w.WorkerKey + ".pub"
	pub, err := os.ReadFile(w.WorkerPublicKey)
	if err != nil {
		return err
	}
	return os.WriteFile(w.authorizedKeys(), pub, 0o600)
}

// generateKey runs `concourse generate-key`: a PKCS#8 PEM private key in
// keys/<name> (ParseWorkerKey), and for type ssh its public half in
// keys/<name>.pub.
func (w *WebNode) generateKey(ctx context.Context, typ, name string) error {
	out, err := exec.CommandContext(ctx, w.concourseBin, "generate-key", "-t", typ, "-b", keyBits,
		"-f", filepath.Join(w.keysDir, name)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("concourse generate-key %s: %w: %s", name, err, out)
	}
	return nil
}

func (w *WebNode) authorizedKeys() string { return filepath.Join(w.keysDir, "authorized_worker_keys") }

// AddWorkerKey makes another worker key, keys/<name> (its public half
// <name>.pub), authorizes it for every team and returns the private key's
// path once the TSA accepts it. The TSA rereads --tsa-authorized-keys on
// SIGHUP; a key for one team only (--tsa-team-authorized-keys) needs
// Options.Args and a file written before Start.
func (w *WebNode) AddWorkerKey(ctx context.Context, name string) (string, error) {
	if err := w.generateKey(ctx, "ssh", name); err != nil {
		return "", err
	}
	path := filepath.Join(w.keysDir, name)
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		return "", err
	}
	w.keysMu.Lock()
	defer w.keysMu.Unlock()
	f, err := os.OpenFile(w.authorizedKeys(), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(pub); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := w.web.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return "", fmt.Errorf("reload the TSA's keys: %w", err)
	}
	return path, w.waitKeyAccepted(ctx, path)
}

// waitKeyAccepted returns once an SSH handshake with the key at path
// succeeds: the TSA reloads its keys a moment after SIGHUP.
func (w *WebNode) waitKeyAccepted(ctx context.Context, path string) error {
	config, err := w.SSHConfig(path)
	if err != nil {
		return err
	}
	config.Timeout = 5 * time.Second
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := ssh.Dial("tcp", w.TSAAddr, config)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the TSA to accept %s: %w (last: %v)", path, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// SSHConfig is a client configuration for the TSA: the private key at
// keyPath and the TSA's host key pinned. Any user name is accepted.
func (w *WebNode) SSHConfig(keyPath string) (*ssh.ClientConfig, error) {
	key, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	signer, err := ParseWorkerKey(key)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", keyPath, err)
	}
	hostLine, err := os.ReadFile(w.TSAPublicKey)
	if err != nil {
		return nil, err
	}
	host, _, _, _, err := ssh.ParseAuthorizedKey(hostLine)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", w.TSAPublicKey, err)
	}
	return &ssh.ClientConfig{
		User:            "jetway",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(host),
	}, nil
}

// ParseWorkerKey reads a worker's private key as Concourse does. `concourse
// generate-key` writes a PEM block typed "PRIVATE KEY" (PKCS#8's label)
// holding PKCS#1 DER, which ssh.ParsePrivateKey rejects; Concourse reads it
// with jwt.ParseRSAPrivateKeyFromPEM, which tries PKCS#1 and then PKCS#8
// whatever the label. Any other key ssh.ParsePrivateKey reads (OpenSSH's
// own format, ed25519, ...) is taken too.
func ParseWorkerKey(key []byte) (ssh.Signer, error) {
	if signer, err := ssh.ParsePrivateKey(key); err == nil {
		return signer, nil
	}
	block, _ := pem.Decode(key)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return ssh.NewSignerFromKey(k)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("neither PKCS#1 nor PKCS#8: %w", err)
	}
	return ssh.NewSignerFromKey(k)
}
