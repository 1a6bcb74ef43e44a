// Package meshtest makes mesh certificates for tests: a CA, and members'
// certificates and keys written to files, as an operator's would be.
package meshtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, as a --mesh-ca file holds it.
	PEM []byte
}

// NewCA makes a CA named name, valid for an hour either side of now.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(t, err)
	cert, err := x509.ParseCertificate(der)
	check(t, err)
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// The role URIs of members' certificates (mesh/tls.go): every member
// certificate carries one.
const (
	GatewayURI = "urn:jetway:mesh:gateway"
	AgentURI   = "urn:jetway:mesh:agent"
)

// AgentURIs are the URI SANs of an agent's certificate (mesh/scope.go):
// its role, the one team whose steps it runs ("" for every team's) and
// its tags.
func AgentURIs(team string, tags ...string) []string {
	uris := []string{AgentURI, "urn:jetway:agent:global"}
	if team != "" {
		uris[1] = "urn:jetway:agent:team:" + url.PathEscape(team)
	}
	for _, t := range tags {
		uris = append(uris, "urn:jetway:agent:tag:"+url.PathEscape(t))
	}
	return uris
}

// Issue writes a certificate for name, valid until notAfter, with the URI
// SANs uris (role URIs, such as AgentURI; GatewayURI when none), and its
// key into dir, and returns the files.
func (c *CA) Issue(t testing.TB, dir, name string, notAfter time.Time, uris ...string) (certFile, keyFile string) {
	t.Helper()
	if len(uris) == 0 {
		uris = []string{GatewayURI}
	}
	return c.IssueWith(t, dir, name, notAfter, func(tmpl *x509.Certificate) {
		for _, u := range uris {
			parsed, err := url.Parse(u)
			check(t, err)
			tmpl.URIs = append(tmpl.URIs, parsed)
		}
	})
}

// IssueWith is Issue of a certificate with no URI SAN that change may
// alter first: a certificate a member must refuse, say.
func (c *CA) IssueWith(t testing.TB, dir, name string, notAfter time.Time, change func(*x509.Certificate)) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	check(t, err)
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature}
	change(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	check(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	check(t, err)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	check(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	check(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// Write writes the CA's certificate and key (SEC 1) into dir as tls.crt
// and tls.key, as a Secret of type kubernetes.io/tls mounted holds them,
// and returns the files.
func (c *CA) Write(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	kder, err := x509.MarshalECPrivateKey(c.key)
	check(t, err)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	check(t, os.WriteFile(certFile, c.PEM, 0o644))
	check(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// Files writes, into dir, the CA of trust and a certificate of c for name,
// valid until notAfter, with the URI SANs uris: what --mesh-ca,
// --mesh-cert and --mesh-key name.
func (c *CA) Files(t testing.TB, trust *CA, dir, name string, notAfter time.Time, uris ...string) (caFile, certFile, keyFile string) {
	t.Helper()
	caFile = filepath.Join(dir, "ca.crt")
	check(t, os.WriteFile(caFile, trust.PEM, 0o644))
	certFile, keyFile = c.Issue(t, dir, name, notAfter, uris...)
	return caFile, certFile, keyFile
}

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
