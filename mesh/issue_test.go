package mesh

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// caKeyFormats are the CA keys operators bring, as their tools write them.
var caKeyFormats = map[string]func(t *testing.T) (crypto.Signer, []byte){
	// Helm's genCA: RSA 2048 in PKCS#1.
	"rsa pkcs1": func(t *testing.T) (crypto.Signer, []byte) {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		require.NoError(t, err)
		return k, pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k))
	},
	// openssl ecparam -genkey: the curve's parameters, then SEC 1;
	// cert-manager's ECDSA keys in its default encoding.
	"ec sec1": func(t *testing.T) (crypto.Signer, []byte) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		der, err := x509.MarshalECPrivateKey(k)
		require.NoError(t, err)
		return k, append(pemOf("EC PARAMETERS", []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}),
			pemOf("EC PRIVATE KEY", der)...)
	},
	// openssl genpkey, cert-manager's encoding: PKCS8.
	"ecdsa pkcs8": func(t *testing.T) (crypto.Signer, []byte) {
		k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		require.NoError(t, err)
		return k, pkcs8(t, k)
	},
	"ed25519 pkcs8": func(t *testing.T) (crypto.Signer, []byte) {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		return k, pkcs8(t, k)
	},
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func pkcs8(t *testing.T, k crypto.Signer) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	require.NoError(t, err)
	return pemOf("PRIVATE KEY", der)
}

// caSpec is a CA certificate to write; the zero value is a CA valid for a
// year either side of now.
type caSpec struct {
	notCA    bool
	usage    x509.KeyUsage
	notAfter time.Time
}

// writeCA writes a self-signed CA with key (its PEM keyPEM) into dir and
// returns its files.
func writeCA(t *testing.T, dir string, key crypto.Signer, keyPEM []byte, spec caSpec) (certFile, keyFile string) {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jetway-mesh-ca"},
		NotBefore: time.Now().Add(-365 * 24 * time.Hour), NotAfter: spec.notAfter,
		IsCA: !spec.notCA, BasicConstraintsValid: true, KeyUsage: spec.usage}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	}
	if tmpl.KeyUsage == 0 {
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "ca-tls.crt"), filepath.Join(dir, "ca-tls.key")
	require.NoError(t, os.WriteFile(certFile, pemOf("CERTIFICATE", der), 0o644))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	return certFile, keyFile
}

// newCAFiles writes a CA of the given key format.
func newCAFiles(t *testing.T, format string, spec caSpec) (certFile, keyFile string) {
	t.Helper()
	key, keyPEM := caKeyFormats[format](t)
	return writeCA(t, t.TempDir(), key, keyPEM, spec)
}

// issueMember issues name's certificate from the CA files into a new
// directory, as the init container does, and loads it as `gateway run`
// does.
func issueMember(t *testing.T, caCert, caKey, name string) *Identity {
	t.Helper()
	out, err := Issue(IssueOptions{CACert: caCert, CAKey: caKey, Name: name,
		DNSNames: []string{"jetway-mesh.ci.svc"}, ValidFor: time.Hour, OutDir: filepath.Join(t.TempDir(), "mesh")})
	require.NoError(t, err)
	id, err := LoadIdentity(out.CACert, out.Cert, out.Key)
	require.NoError(t, err)
	return id
}

// Two replicas, each with a certificate Issue made from one CA, join as
// two members that know each other by their names; a member issued by
// another CA is refused.
func TestIssuedCertificatesJoinTheMesh(t *testing.T) {
	for format := range caKeyFormats {
		t.Run(format, func(t *testing.T) {
			caCert, caKey := newCAFiles(t, format, caSpec{})
			a, b := issueMember(t, caCert, caKey, "jetway-0"), issueMember(t, caCert, caKey, "jetway-1")
			require.Equal(t, "jetway-0", a.Name())
			require.Equal(t, "jetway-1", b.Name())
			m0 := startMember(t, nil, "jetway-0", memberOpts{identity: a, listen: true}, "east")
			m1 := startMember(t, nil, "jetway-1", memberOpts{identity: b, peers: []string{m0.Addr().String()}}, "west")
			eventually(t, m0, "jetway-1's target at jetway-0", func() bool { return len(m0.Remotes()) == 1 })
			eventually(t, m1, "jetway-0's target at jetway-1", func() bool { return len(m1.Remotes()) == 1 })
			assert.Equal(t, []string{"jetway-1/west=running"}, remoteNames(m0))
			assert.Equal(t, []string{"jetway-0/east=running"}, remoteNames(m1))
			assert.Equal(t, []string{"jetway-1"}, m0.Peers())
			assert.Equal(t, []string{"jetway-0"}, m1.Peers())

			resp, err := m1.Client().Get("http://jetway-0/x")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, "jetway-0 /x from jetway-1: ", string(body))
			m1.stop()
			m0.stop()
		})
	}
	t.Run("another CA's member", func(t *testing.T) {
		caCert, caKey := newCAFiles(t, "ec sec1", caSpec{})
		otherCert, otherKey := newCAFiles(t, "ec sec1", caSpec{})
		// The intruder trusts the mesh's CA, so the refusal is the mesh's.
		out, err := Issue(IssueOptions{CACert: otherCert, CAKey: otherKey, Name: "jetway-9", ValidFor: time.Hour, OutDir: t.TempDir()})
		require.NoError(t, err)
		intruder, err := LoadIdentity(caCert, out.Cert, out.Key)
		require.NoError(t, err)
		_, serr, _, _ := handshake(t, intruder, issueMember(t, caCert, caKey, "jetway-0"))
		var refused *RefusedError
		require.ErrorAs(t, serr, &refused)
		assert.Equal(t, RefusedUnknownCA, refused.Reason)
	})
}

func TestIssueWritesTheMembersFiles(t *testing.T) {
	caCert, caKey := newCAFiles(t, "rsa pkcs1", caSpec{})
	now := time.Now().Truncate(time.Second)
	dir := filepath.Join(t.TempDir(), "mesh")
	o := IssueOptions{CACert: caCert, CAKey: caKey, Name: "jetway-7d9f-x2x4q",
		DNSNames: []string{"jetway-7d9f-x2x4q", "jetway-mesh.ci.svc"}, ValidFor: 90 * 24 * time.Hour,
		OutDir: dir, Now: func() time.Time { return now }}
	out, err := Issue(o)
	require.NoError(t, err)
	assert.False(t, out.Capped)
	assert.Equal(t, filepath.Join(dir, "ca.crt"), out.CACert)
	assert.Equal(t, filepath.Join(dir, "tls.crt"), out.Cert)
	assert.Equal(t, filepath.Join(dir, "tls.key"), out.Key)
	assertFiles(t, dir, map[string]os.FileMode{"ca.crt": 0o644, "tls.crt": 0o644, "tls.key": 0o600})
	caPEM, err := os.ReadFile(caCert)
	require.NoError(t, err)
	copied, err := os.ReadFile(out.CACert)
	require.NoError(t, err)
	assert.Equal(t, string(caPEM), string(copied), "ca.crt is the CA's certificate")

	leaf := readLeaf(t, out.Cert)
	assert.Equal(t, "jetway-7d9f-x2x4q", leaf.Subject.CommonName)
	assert.Equal(t, []string{"jetway-7d9f-x2x4q", "jetway-mesh.ci.svc"}, leaf.DNSNames)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage)
	assert.Equal(t, []string{"urn:jetway:mesh:gateway"}, uris(leaf), "a gateway's role")
	assert.False(t, leaf.IsCA)
	assert.Equal(t, now.Add(-5*time.Minute).UTC(), leaf.NotBefore)
	assert.Equal(t, now.Add(90*24*time.Hour).UTC(), leaf.NotAfter)
	assert.Positive(t, leaf.SerialNumber.Sign())
	assert.LessOrEqual(t, leaf.SerialNumber.BitLen(), 128)
	assert.Greater(t, leaf.SerialNumber.BitLen(), 64, "random 128 bits (fails once in 2^64)")
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	require.True(t, ok, "an ECDSA key, got %T", leaf.PublicKey)
	assert.Equal(t, elliptic.P256(), pub.Curve)
	keyPEM, err := os.ReadFile(out.Key)
	require.NoError(t, err)
	block, _ := pem.Decode(keyPEM)
	require.NotNil(t, block)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	assert.True(t, key.(*ecdsa.PrivateKey).PublicKey.Equal(pub), "tls.key is tls.crt's key")

	// Again into the same directory: every file replaced, nothing else left.
	again, err := Issue(o)
	require.NoError(t, err)
	assert.NotEqual(t, leaf.SerialNumber, readLeaf(t, again.Cert).SerialNumber)
	assertFiles(t, dir, map[string]os.FileMode{"ca.crt": 0o644, "tls.crt": 0o644, "tls.key": 0o600})
}

// An agent's certificate says what the agent is: the one team whose steps
// it runs, or every team's, and its tags.
func TestIssueMakesAnAgentsCertificate(t *testing.T) {
	caCert, caKey := newCAFiles(t, "ec sec1", caSpec{})
	for name, tt := range map[string]struct {
		team   string
		global bool
		tags   []string
		uris   []string
		scope  AgentScope
	}{
		"a team's": {team: "main", tags: []string{"mac", "ios", "mac"},
			uris:  []string{"urn:jetway:mesh:agent", "urn:jetway:agent:team:main", "urn:jetway:agent:tag:mac", "urn:jetway:agent:tag:ios", "urn:jetway:agent:tag:mac"},
			scope: AgentScope{Team: "main", Tags: []string{"ios", "mac"}}},
		"every team's": {global: true, uris: []string{"urn:jetway:mesh:agent", "urn:jetway:agent:global"}, scope: AgentScope{Global: true}},
		"names escaped": {team: "team a/b", tags: []string{"x y"},
			uris:  []string{"urn:jetway:mesh:agent", "urn:jetway:agent:team:team%20a%2Fb", "urn:jetway:agent:tag:x%20y"},
			scope: AgentScope{Team: "team a/b", Tags: []string{"x y"}}},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := Issue(IssueOptions{CACert: caCert, CAKey: caKey, Name: "mac-mini-1", Agent: true, Team: tt.team,
				Global: tt.global, Tags: tt.tags, ValidFor: time.Hour, OutDir: t.TempDir()})
			require.NoError(t, err)
			assert.Equal(t, tt.uris, uris(readLeaf(t, out.Cert)))
			id, err := LoadIdentity(out.CACert, out.Cert, out.Key)
			require.NoError(t, err)
			assert.Equal(t, KindAgent, id.Kind())
			assert.Equal(t, tt.scope, id.Scope())
			_, err = New(Options{Identity: id, Kind: KindAgent})
			assert.NoError(t, err, "gateway agent runs with it")
		})
	}
}

// An agent's certificate names its team or global, one of the two; a
// gateway's names neither.
func TestIssueRefusesAnAgentWithoutItsScope(t *testing.T) {
	caCert, caKey := newCAFiles(t, "ec sec1", caSpec{})
	for name, tt := range map[string]struct {
		o   IssueOptions
		err string
	}{
		"an agent of no team":   {IssueOptions{Agent: true}, "team: an agent's certificate names the one team whose steps it runs (--team TEAM), or --global for an agent of every team"},
		"an agent of both":      {IssueOptions{Agent: true, Team: "main", Global: true}, "global: an agent is of one team (--team) or of every team (--global), not both"},
		"a gateway with a team": {IssueOptions{Team: "main"}, "agent: --team, --global and --tag are an agent's: add --agent"},
		"a gateway with tags":   {IssueOptions{Tags: []string{"mac"}}, "agent: --team, --global and --tag are an agent's: add --agent"},
		"an empty tag":          {IssueOptions{Agent: true, Global: true, Tags: []string{""}}, "tag: empty"},
	} {
		t.Run(name, func(t *testing.T) {
			o := tt.o
			o.CACert, o.CAKey, o.Name, o.ValidFor, o.OutDir = caCert, caKey, "m", time.Hour, t.TempDir()
			_, err := Issue(o)
			assert.ErrorContains(t, err, tt.err)
		})
	}
}

func uris(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return out
}

func TestIssueEndsWithTheCA(t *testing.T) {
	caEnd := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	caCert, caKey := newCAFiles(t, "ec sec1", caSpec{notAfter: caEnd})
	out, err := Issue(IssueOptions{CACert: caCert, CAKey: caKey, Name: "jetway-0", ValidFor: 8760 * time.Hour,
		OutDir: t.TempDir()})
	require.NoError(t, err)
	assert.True(t, out.Capped)
	assert.Equal(t, caEnd, readLeaf(t, out.Cert).NotAfter)
	id, err := LoadIdentity(out.CACert, out.Cert, out.Key)
	require.NoError(t, err)
	assert.Equal(t, "jetway-0", id.Name())
}

func TestIssueSaysWhatIsWrong(t *testing.T) {
	ecKey, ecPEM := caKeyFormats["ec sec1"](t)
	dir := t.TempDir()
	caCert, caKey := writeCA(t, dir, ecKey, ecPEM, caSpec{})
	_, otherKey := newCAFiles(t, "ecdsa pkcs8", caSpec{})
	leafCert, leafKey := writeCA(t, t.TempDir(), ecKey, ecPEM, caSpec{notCA: true, usage: x509.KeyUsageDigitalSignature})
	noSign, noSignKey := writeCA(t, t.TempDir(), ecKey, ecPEM, caSpec{usage: x509.KeyUsageDigitalSignature})
	expired, expiredKey := writeCA(t, t.TempDir(), ecKey, ecPEM, caSpec{notAfter: time.Now().Add(-time.Minute)})
	write := func(name string, content []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, content, 0o600))
		return p
	}
	garbage := []byte("not a key, but base64 of something secret")
	corrupt := write("corrupt.key", pemOf("RSA PRIVATE KEY", garbage))
	encrypted := write("encrypted.key", pemOf("ENCRYPTED PRIVATE KEY", garbage))
	missing := filepath.Join(dir, "missing.key")

	for name, tt := range map[string]struct {
		cert, key string
		want      string
	}{
		"the key of another CA":  {caCert, otherKey, "CA key " + otherKey + " does not match CA certificate " + caCert},
		"a certificate, no CA":   {leafCert, leafKey, "CA certificate " + leafCert + ` ("jetway-mesh-ca") is not a CA`},
		"a CA that may not sign": {noSign, noSignKey, "CA certificate " + noSign + ` ("jetway-mesh-ca") may not sign certificates`},
		"an expired CA":          {expired, expiredKey, "CA certificate " + expired + ` ("jetway-mesh-ca") expired at`},
		"no key file":            {caCert, missing, "CA key: open " + missing + ": no such file"},
		"no CA file":             {missing, caKey, "CA certificate: open " + missing + ": no such file"},
		"a certificate as key":   {caCert, caCert, "CA key " + caCert + " holds no PEM private key"},
		"a key as certificate":   {caKey, caKey, "CA certificate " + caKey + " holds no PEM certificate"},
		"a corrupt key":          {caCert, corrupt, "CA key " + corrupt + ": its RSA PRIVATE KEY block is no PKCS#1, SEC 1 or PKCS#8 signing key"},
		"an encrypted key":       {caCert, encrypted, "CA key " + encrypted + " is encrypted"},
	} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "mesh")
			_, err := Issue(IssueOptions{CACert: tt.cert, CAKey: tt.key, Name: "jetway-0", ValidFor: time.Hour, OutDir: out})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "PRIVATE KEY-----")
			assert.NotContains(t, err.Error(), base64.StdEncoding.EncodeToString(garbage)[:16])
			assert.NoDirExists(t, out, "nothing written")
		})
	}
}

func TestIssueOptionsReportEveryProblem(t *testing.T) {
	err := IssueOptions{Name: "Jetway_0", DNSNames: []string{"ok.svc", "*.svc"}}.Validate()
	require.Error(t, err)
	for _, want := range []string{"ca-cert: required", "ca-key: required", "out: required",
		`name: "Jetway_0": a lowercase RFC 1123 subdomain`, `dns: "*.svc"`, "valid-for: must be positive, got 0s"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NotContains(t, err.Error(), "ok.svc")

	long := strings.Repeat("a", 65)
	err = IssueOptions{CACert: "c", CAKey: "k", OutDir: "o", Name: long, ValidFor: time.Hour}.Validate()
	assert.EqualError(t, err, `mesh: invalid certificate request: name: "`+long+`" has 65 characters; a certificate's common name holds at most 64`)
	assert.NoError(t, IssueOptions{CACert: "c", CAKey: "k", OutDir: "o", Name: "jetway-0", ValidFor: time.Hour}.Validate())
	err = IssueOptions{CACert: "c", CAKey: "k", OutDir: "o", ValidFor: time.Hour}.Validate()
	assert.EqualError(t, err, "mesh: invalid certificate request: name: required")
}

// assertFiles wants exactly these files, with these modes, in dir.
func assertFiles(t *testing.T, dir string, want map[string]os.FileMode) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	got := map[string]os.FileMode{}
	for _, e := range entries {
		info, err := e.Info()
		require.NoError(t, err)
		got[e.Name()] = info.Mode()
	}
	assert.Equal(t, want, got)
}

func readLeaf(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	block, rest := pem.Decode(raw)
	require.NotNil(t, block)
	assert.Empty(t, rest, "one certificate, no chain")
	c, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return c
}
