package mesh

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/jetway-ci/jetway/internal/atomicfile"
)

// IssueOptions say which member certificate Issue makes, from which CA,
// and where it writes it. The keys of Validate's messages are the flags of
// `gateway mesh issue`.
type IssueOptions struct {
	// CACert and CAKey are the mesh CA's PEM files: its certificate (the
	// first in the file) and its unencrypted private key, PKCS#1 ("RSA
	// PRIVATE KEY", Helm's genCA), SEC 1 ("EC PRIVATE KEY") or PKCS#8
	// ("PRIVATE KEY"; openssl genpkey, cert-manager's option).
	CACert, CAKey string
	// Name is the member's mesh name: the certificate's common name and
	// first DNS name. A DNS-1123 subdomain of at most 64 characters (a
	// common name's bound), such as a pod's name.
	Name string
	// DNSNames are further DNS names of the certificate (a Service's).
	DNSNames []string
	// Agent issues an agent's certificate (URI SAN urn:jetway:mesh:agent)
	// instead of a gateway's (urn:jetway:mesh:gateway).
	Agent bool
	// Team is the one team whose steps an agent runs; Global, instead,
	// makes it an agent of every team. An agent's certificate says one or
	// the other, and Tags, its tags (scope.go): what a gateway takes it
	// for, whatever it announces.
	Team   string
	Global bool
	Tags   []string
	// ValidFor is how long the certificate is valid from now; never past
	// the CA certificate's end.
	ValidFor time.Duration
	// OutDir receives ca.crt (the CA's certificate), tls.crt and tls.key:
	// what --mesh-ca, --mesh-cert and --mesh-key name. Made if missing.
	OutDir string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Files Issue writes into IssueOptions.OutDir.
const (
	IssuedCAFile   = "ca.crt"
	IssuedCertFile = "tls.crt"
	IssuedKeyFile  = "tls.key"
)

// backdate is how long before now an issued certificate starts: a peer
// whose clock is a little behind still accepts it.
const backdate = 5 * time.Minute

// maxCommonName is X.509's upper bound on a common name (RFC 5280,
// ub-common-name).
const maxCommonName = 64

// Validate reports every bad option at once.
func (o IssueOptions) Validate() error {
	var probs []string
	add := func(key, format string, args ...any) {
		probs = append(probs, key+": "+fmt.Sprintf(format, args...))
	}
	for _, f := range [][2]string{{"ca-cert", o.CACert}, {"ca-key", o.CAKey}, {"out", o.OutDir}} {
		if f[1] == "" {
			add(f[0], "required")
		}
	}
	switch errs := validation.IsDNS1123Subdomain(o.Name); {
	case o.Name == "":
		add("name", "required")
	case len(errs) > 0:
		add("name", "%q: %s", o.Name, strings.Join(errs, ", "))
	case len(o.Name) > maxCommonName:
		add("name", "%q has %d characters; a certificate's common name holds at most %d", o.Name, len(o.Name), maxCommonName)
	}
	for _, d := range o.DNSNames {
		if errs := validation.IsDNS1123Subdomain(d); len(errs) > 0 {
			add("dns", "%q: %s", d, strings.Join(errs, ", "))
		}
	}
	if o.ValidFor <= 0 {
		add("valid-for", "must be positive, got %s", o.ValidFor)
	}
	switch {
	case !o.Agent && (o.Team != "" || o.Global || len(o.Tags) > 0):
		add("agent", "--team, --global and --tag are an agent's: add --agent")
	case o.Agent && o.Team == "" && !o.Global:
		add("team", "an agent's certificate names the one team whose steps it runs (--team TEAM), or --global for an agent of every team")
	case o.Agent && o.Team != "" && o.Global:
		add("global", "an agent is of one team (--team) or of every team (--global), not both")
	}
	for _, t := range o.Tags {
		if t == "" {
			add("tag", "empty")
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("mesh: invalid certificate request: %s", strings.Join(probs, "; "))
	}
	return nil
}

// Kind is the kind of member the certificate is for: KindAgent with
// o.Agent, else KindGateway.
func (o IssueOptions) Kind() string {
	if o.Agent {
		return KindAgent
	}
	return KindGateway
}

// Issued is what Issue wrote.
type Issued struct {
	// CACert, Cert and Key are the files written.
	CACert, Cert, Key string
	// Certificate is the member certificate.
	Certificate *x509.Certificate
	// Capped says the certificate ends when the CA's does, before
	// ValidFor.
	Capped bool
}

// Issue makes a member certificate for o.Name from the mesh CA, with a new
// ECDSA P-256 key, for client and server authentication, with the role
// URI of o.Kind(), and writes it, its key and the CA's certificate into
// o.OutDir, each file replaced atomically (the key readable by its owner
// only). Before writing, the certificate is checked as every mesh
// handshake checks a peer's. Errors name the file at fault; none carries
// key material.
func Issue(o IssueOptions) (*Issued, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	now := time.Now()
	if o.Now != nil {
		now = o.Now()
	}
	caCert, err := readCACert(o.CACert, now)
	if err != nil {
		return nil, err
	}
	caKey, err := readCAKey(o.CAKey)
	if err != nil {
		return nil, err
	}
	if pub, ok := caKey.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(caCert.PublicKey) {
		return nil, fmt.Errorf("mesh: CA key %s does not match CA certificate %s", o.CAKey, o.CACert)
	}
	leaf, keyDER, capped, err := sign(o, caCert, caKey, now)
	if err != nil {
		return nil, err
	}
	out := &Issued{CACert: filepath.Join(o.OutDir, IssuedCAFile), Cert: filepath.Join(o.OutDir, IssuedCertFile),
		Key: filepath.Join(o.OutDir, IssuedKeyFile), Certificate: leaf, Capped: capped}
	if err := out.write(o.OutDir, caCert, keyDER); err != nil {
		return nil, err
	}
	return out, nil
}

// sign makes the member's key and certificate and checks the certificate
// as a peer's is checked at the handshake. It returns the certificate, the
// key in PKCS#8 and whether the CA's end cut its validity.
func sign(o IssueOptions, caCert *x509.Certificate, caKey crypto.Signer, now time.Time) (*x509.Certificate, []byte, bool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, fmt.Errorf("mesh: generate key: %w", err)
	}
	tmpl, capped, err := memberTemplate(o, caCert, now)
	if err != nil {
		return nil, nil, false, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, false, fmt.Errorf("mesh: sign with CA %s: %w", o.CACert, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, false, fmt.Errorf("mesh: read the certificate made: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	if err := verifyChain([]*x509.Certificate{leaf}, pool, now); err != nil {
		return nil, nil, false, fmt.Errorf("mesh: CA %s makes a certificate the mesh refuses: %w", o.CACert, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("mesh: encode key: %w", err)
	}
	return leaf, keyDER, capped, nil
}

// write puts the CA's certificate, the key and the certificate into dir,
// made if missing. The certificate goes last: a member re-reading its
// files as they change sees a new key beside the old certificate, which
// does not load and keeps the last good pair, never a certificate without
// its key.
func (out *Issued) write(dir string, caCert *x509.Certificate, keyDER []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	for _, f := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{
		{out.CACert, "CERTIFICATE", caCert.Raw, 0o644},
		{out.Key, "PRIVATE KEY", keyDER, 0o600},
		{out.Cert, "CERTIFICATE", out.Certificate.Raw, 0o644},
	} {
		if err := atomicfile.Write(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return fmt.Errorf("mesh: write %s: %w", f.path, err)
		}
	}
	return nil
}

// memberTemplate is the certificate to sign: valid from backdate before
// now (not before the CA) for o.ValidFor, cut at the CA's end (capped),
// with a random 128-bit serial and the role URI of o.Kind().
func memberTemplate(o IssueOptions, ca *x509.Certificate, now time.Time) (tmpl *x509.Certificate, capped bool, err error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, false, fmt.Errorf("mesh: serial: %w", err)
	}
	serial := new(big.Int).SetBytes(b[:])
	if serial.Sign() == 0 {
		serial.SetInt64(1) // a serial is positive (RFC 5280 4.1.2.2)
	}
	notBefore := now.Add(-backdate)
	if notBefore.Before(ca.NotBefore) {
		notBefore = ca.NotBefore
	}
	notAfter := now.Add(o.ValidFor)
	if notAfter.After(ca.NotAfter) {
		notAfter, capped = ca.NotAfter, true
	}
	dns := []string{o.Name}
	for _, d := range o.DNSNames {
		if !slices.Contains(dns, d) {
			dns = append(dns, d)
		}
	}
	role, err := url.Parse(rolePrefix + o.Kind())
	if err != nil {
		return nil, false, fmt.Errorf("mesh: role URI: %w", err)
	}
	uris := []*url.URL{role}
	if o.Agent {
		scope, err := AgentScope{Team: o.Team, Global: o.Global, Tags: o.Tags}.URIs()
		if err != nil {
			return nil, false, err
		}
		uris = append(uris, scope...)
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: o.Name},
		DNSNames:     dns,
		URIs:         uris,
		NotBefore:    notBefore.UTC(),
		NotAfter:     notAfter.UTC(),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, capped, nil
}

// readCACert reads the first certificate of file and checks that it is a
// CA that may sign certificates and is valid at now.
func readCACert(file string, now time.Time) (*x509.Certificate, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("mesh: CA certificate: %w", err)
	}
	var block *pem.Block
	for rest := raw; ; {
		if block, rest = pem.Decode(rest); block == nil || block.Type == "CERTIFICATE" {
			break
		}
	}
	if block == nil {
		return nil, fmt.Errorf("mesh: CA certificate %s holds no PEM certificate", file)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mesh: CA certificate %s: %w", file, err)
	}
	switch {
	case !ca.BasicConstraintsValid || !ca.IsCA:
		return nil, fmt.Errorf("mesh: CA certificate %s (%q) is not a CA: its basic constraints do not say CA:TRUE", file, ca.Subject.CommonName)
	case ca.KeyUsage != 0 && ca.KeyUsage&x509.KeyUsageCertSign == 0:
		return nil, fmt.Errorf("mesh: CA certificate %s (%q) may not sign certificates: its key usage lacks certSign", file, ca.Subject.CommonName)
	case !now.Before(ca.NotAfter):
		return nil, fmt.Errorf("mesh: CA certificate %s (%q) expired at %s", file, ca.Subject.CommonName, ca.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(ca.NotBefore):
		return nil, fmt.Errorf("mesh: CA certificate %s (%q) is not valid before %s", file, ca.Subject.CommonName, ca.NotBefore.UTC().Format(time.RFC3339))
	}
	return ca, nil
}

// readCAKey reads the first private key of file. Errors say what is
// wrong with it, never what it holds.
func readCAKey(file string) (crypto.Signer, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("mesh: CA key: %w", err)
	}
	for rest := raw; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return nil, fmt.Errorf("mesh: CA key %s holds no PEM private key (RSA PRIVATE KEY, EC PRIVATE KEY or PRIVATE KEY)", file)
		}
		switch {
		case block.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(block.Headers["Proc-Type"], "ENCRYPTED"):
			return nil, fmt.Errorf("mesh: CA key %s is encrypted; give it unencrypted", file)
		case block.Type == "RSA PRIVATE KEY" || block.Type == "EC PRIVATE KEY" || block.Type == "PRIVATE KEY":
			key := parsePrivateKey(block.Bytes)
			if key == nil {
				return nil, fmt.Errorf("mesh: CA key %s: its %s block is no PKCS#1, SEC 1 or PKCS#8 signing key", file, block.Type)
			}
			return key, nil
		}
	}
}

// parsePrivateKey reads a PKCS#8, PKCS#1 or SEC 1 key, whatever its PEM
// label says (tools mislabel them), or returns nil. The parsers' errors
// are dropped: they describe the bytes.
func parsePrivateKey(der []byte) crypto.Signer {
	if k, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		s, _ := k.(crypto.Signer)
		return s
	}
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k
	}
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k
	}
	return nil
}
