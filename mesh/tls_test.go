package mesh

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ca is a test certificate authority.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &ca{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a certificate for name, valid until notAfter, and its key
// into dir, and returns the files.
func (c *ca) issue(t *testing.T, dir, name string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// member writes CA, certificate and key for name and loads them.
func (c *ca) member(t *testing.T, name string, notAfter time.Time) *Identity {
	return c.memberTrusting(t, c, name, notAfter)
}

// memberTrusting is a member with a certificate of c that trusts trust.
func (c *ca) memberTrusting(t *testing.T, trust *ca, name string, notAfter time.Time) *Identity {
	t.Helper()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, trust.pem, 0o644))
	certFile, keyFile := c.issue(t, dir, name, notAfter)
	id, err := LoadIdentity(caFile, certFile, keyFile)
	require.NoError(t, err)
	return id
}

// connPair is two ends of a loopback TCP connection (net.Pipe has no
// buffer: both sides of a TLS 1.3 handshake write at once).
func connPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	b := <-accepted
	require.NotNil(t, b)
	return a, b
}

// handshake runs a TLS handshake between a dialer and a listener over
// loopback TCP and returns what each side saw.
func handshake(t *testing.T, dialer, listener *Identity) (clientErr, serverErr error, clientSaw, serverSaw string) {
	t.Helper()
	a, b := connPair(t)
	defer a.Close()
	defer b.Close()
	client, server := tls.Client(a, dialer.ClientConfig()), tls.Server(b, listener.ServerConfig())
	done := make(chan error, 1)
	go func() {
		err := server.Handshake()
		if err != nil {
			_ = b.Close() // the client's read ends
		}
		done <- err
	}()
	clientErr = client.Handshake()
	if clientErr != nil {
		_ = a.Close()
		serverErr = <-done
		return clientErr, serverErr, "", ""
	}
	// In TLS 1.3 the dialer is done before the listener has checked its
	// certificate: a refusal reaches it as an alert on its first read.
	read := make(chan error, 1)
	go func() {
		_, err := client.Read(make([]byte, 1))
		read <- err
	}()
	serverErr = <-done
	if serverErr != nil {
		clientErr = <-read
	}
	_ = a.Close()
	_ = b.Close()
	if serverErr == nil {
		<-read
	}
	return clientErr, serverErr, PeerName(client.ConnectionState()), PeerName(server.ConnectionState())
}

func TestMeshPeersKnowEachOtherByTheirCertificates(t *testing.T) {
	mesh := newCA(t, "mesh-ca")
	a, b := mesh.member(t, "gw-a", time.Now().Add(time.Hour)), mesh.member(t, "gw-b", time.Now().Add(time.Hour))
	assert.Equal(t, "gw-a", a.Name())
	cerr, serr, clientSaw, serverSaw := handshake(t, a, b)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	assert.Equal(t, "gw-b", clientSaw)
	assert.Equal(t, "gw-a", serverSaw)
}

func TestMeshRefusesStrangers(t *testing.T) {
	mesh, other := newCA(t, "mesh-ca"), newCA(t, "other-ca")
	b := mesh.member(t, "gw-b", time.Now().Add(time.Hour))
	for name, tt := range map[string]struct {
		dialer *Identity
		reason string
	}{
		"foreign CA": {other.memberTrusting(t, mesh, "intruder", time.Now().Add(time.Hour)), RefusedUnknownCA},
		"expired":    {mesh.member(t, "stale", time.Now().Add(-time.Hour)), RefusedExpired},
	} {
		t.Run(name, func(t *testing.T) {
			cerr, serr, _, _ := handshake(t, tt.dialer, b)
			var refused *RefusedError
			require.ErrorAs(t, serr, &refused, "the listener refuses")
			assert.Equal(t, tt.reason, refused.Reason)
			assert.Error(t, cerr)
		})
	}
	t.Run("no certificate", func(t *testing.T) {
		a, c := connPair(t)
		defer a.Close()
		defer c.Close()
		done := make(chan error, 1)
		server := tls.Server(c, b.ServerConfig())
		go func() {
			err := server.Handshake()
			_ = c.Close()
			done <- err
		}()
		_ = tls.Client(a, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}).Handshake()
		_ = a.Close()
		err := <-done
		assert.ErrorContains(t, err, "client didn't provide a certificate")
	})
	t.Run("a listener of another CA", func(t *testing.T) {
		cerr, _, _, _ := handshake(t, b, other.memberTrusting(t, mesh, "fake-hub", time.Now().Add(time.Hour)))
		var refused *RefusedError
		require.ErrorAs(t, cerr, &refused, "the dialer refuses")
		assert.Equal(t, RefusedUnknownCA, refused.Reason)
	})
}

func TestCertificatesRotateWithoutRestart(t *testing.T) {
	mesh := newCA(t, "mesh-ca")
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, mesh.pem, 0o644))
	certFile, keyFile := mesh.issue(t, dir, "gw-a", time.Now().Add(time.Hour))
	a, err := LoadIdentity(caFile, certFile, keyFile)
	require.NoError(t, err)
	b := mesh.member(t, "gw-b", time.Now().Add(time.Hour))

	// A new certificate (here with another name, to see it) in place of the
	// old one: the next handshake presents it.
	newCert, newKey := mesh.issue(t, t.TempDir(), "gw-a2", time.Now().Add(2*time.Hour))
	for src, dst := range map[string]string{newCert: certFile, newKey: keyFile} {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, b, 0o600))
		future := time.Now().Add(time.Second) // a new mtime even on coarse clocks
		require.NoError(t, os.Chtimes(dst, future, future))
	}
	_, _, _, serverSaw := handshake(t, a, b)
	assert.Equal(t, "gw-a2", serverSaw)

	// A broken rotation (a key that is not the certificate's) keeps the
	// last good material, and says so.
	other, _ := mesh.issue(t, t.TempDir(), "gw-x", time.Now().Add(time.Hour))
	raw, err := os.ReadFile(other)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(certFile, raw, 0o644))
	future := time.Now().Add(2 * time.Second)
	require.NoError(t, os.Chtimes(certFile, future, future))
	assert.ErrorContains(t, a.Reload(), "certificate "+certFile+" with key "+keyFile)
	_, _, _, serverSaw = handshake(t, a, b)
	assert.Equal(t, "gw-a2", serverSaw)
}

func TestLoadIdentityNamesTheBadFile(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, []byte("not pem"), 0o644))
	mesh := newCA(t, "mesh-ca")
	certFile, keyFile := mesh.issue(t, dir, "gw", time.Now().Add(time.Hour))
	_, err := LoadIdentity(caFile, certFile, keyFile)
	assert.ErrorContains(t, err, "CA file "+caFile+" holds no PEM certificate")
	_, err = LoadIdentity(filepath.Join(dir, "missing"), certFile, keyFile)
	assert.ErrorContains(t, err, filepath.Join(dir, "missing"))
}
