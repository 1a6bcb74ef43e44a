package mesh

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ca is a test certificate authority.
type ca = meshtest.CA

var newCA = meshtest.NewCA

// issued writes CA, certificate and key for name and loads them.
func issued(t *testing.T, c *ca, name string, notAfter time.Time) *Identity {
	return memberTrusting(t, c, c, name, notAfter)
}

// memberTrusting is a member with a certificate of c that trusts trust.
func memberTrusting(t *testing.T, c, trust *ca, name string, notAfter time.Time) *Identity {
	t.Helper()
	id, err := LoadIdentity(c.Files(t, trust, t.TempDir(), name, notAfter))
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
	return handshakeWith(t, dialer.ClientConfig(), listener.ServerConfig())
}

// handshakeWith is handshake with the dialer's and the listener's TLS
// configurations.
func handshakeWith(t *testing.T, dialer, listener *tls.Config) (clientErr, serverErr error, clientSaw, serverSaw string) {
	t.Helper()
	a, b := connPair(t)
	defer a.Close()
	defer b.Close()
	client, server := tls.Client(a, dialer), tls.Server(b, listener)
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
	a, b := issued(t, mesh, "gw-a", time.Now().Add(time.Hour)), issued(t, mesh, "gw-b", time.Now().Add(time.Hour))
	assert.Equal(t, "gw-a", a.Name())
	cerr, serr, clientSaw, serverSaw := handshake(t, a, b)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	assert.Equal(t, "gw-b", clientSaw)
	assert.Equal(t, "gw-a", serverSaw)
}

func TestMeshRefusesStrangers(t *testing.T) {
	mesh, other := newCA(t, "mesh-ca"), newCA(t, "other-ca")
	b := issued(t, mesh, "gw-b", time.Now().Add(time.Hour))
	for name, tt := range map[string]struct {
		dialer *Identity
		reason string
	}{
		"foreign CA": {memberTrusting(t, other, mesh, "intruder", time.Now().Add(time.Hour)), RefusedUnknownCA},
		"expired":    {issued(t, mesh, "stale", time.Now().Add(-time.Hour)), RefusedExpired},
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
		cerr, _, _, _ := handshake(t, b, memberTrusting(t, other, mesh, "fake-hub", time.Now().Add(time.Hour)))
		var refused *RefusedError
		require.ErrorAs(t, cerr, &refused, "the dialer refuses")
		assert.Equal(t, RefusedUnknownCA, refused.Reason)
	})
}

func TestCertificatesRotateWithoutRestart(t *testing.T) {
	mesh := newCA(t, "mesh-ca")
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, mesh.PEM, 0o644))
	first := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	certFile, keyFile := mesh.Issue(t, dir, "gw-a", first)
	a, err := LoadIdentity(caFile, certFile, keyFile)
	require.NoError(t, err)
	b := issued(t, mesh, "gw-b", time.Now().Add(time.Hour))
	type load struct {
		notAfter time.Time
		err      string
	}
	var loads []load
	a.Observe(func(leaf *x509.Certificate, err error) {
		l := load{notAfter: leaf.NotAfter}
		if err != nil {
			l.err = err.Error()
		}
		loads = append(loads, l)
	})
	replace := func(src, dst string, at time.Duration) {
		raw, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, raw, 0o600))
		future := time.Now().Add(at) // a new mtime even on coarse clocks
		require.NoError(t, os.Chtimes(dst, future, future))
	}

	// A new certificate in place of the old one: the next handshake loads
	// and presents it.
	second := first.Add(time.Hour)
	newCert, newKey := mesh.Issue(t, t.TempDir(), "gw-a", second)
	replace(newCert, certFile, time.Second)
	replace(newKey, keyFile, time.Second)
	cerr, serr, _, serverSaw := handshake(t, a, b)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	assert.Equal(t, "gw-a", serverSaw)
	assert.Equal(t, []load{{notAfter: first}, {notAfter: second}}, loads)

	// A broken rotation (a key that is not the certificate's) keeps the
	// last good material, and says so once, however many handshakes.
	other, _ := mesh.Issue(t, t.TempDir(), "gw-a", time.Now().Add(time.Hour))
	replace(other, certFile, 2*time.Second)
	assert.ErrorContains(t, a.Reload(), "certificate "+certFile+" with key "+keyFile)
	for range 2 {
		cerr, serr, _, serverSaw = handshake(t, a, b)
		require.NoError(t, cerr)
		require.NoError(t, serr)
		assert.Equal(t, "gw-a", serverSaw)
	}
	require.Len(t, loads, 3)
	assert.Equal(t, second, loads[2].notAfter, "still the last good one")
	assert.Contains(t, loads[2].err, "certificate "+certFile+" with key "+keyFile)

	// A certificate of another name is refused: peers know a member by it.
	renamedCert, renamedKey := mesh.Issue(t, t.TempDir(), "gw-z", time.Now().Add(time.Hour))
	replace(renamedCert, certFile, 3*time.Second)
	replace(renamedKey, keyFile, 3*time.Second)
	assert.ErrorContains(t, a.Reload(), `names "gw-z", but this member is "gw-a"; a new name needs a restart`)
	_, _, _, serverSaw = handshake(t, a, b)
	assert.Equal(t, "gw-a", serverSaw)
	assert.Equal(t, "gw-a", a.Name())

	// So is a certificate for another kind of member.
	agentCert, agentKey := mesh.Issue(t, t.TempDir(), "gw-a", time.Now().Add(time.Hour), roleAgent, scopeGlobal)
	replace(agentCert, certFile, 4*time.Second)
	replace(agentKey, keyFile, 4*time.Second)
	assert.ErrorContains(t, a.Reload(), "is an agent's, but this member is a gateway; a new kind needs a restart")
	assert.Equal(t, KindGateway, a.Kind())
}

func TestLoadIdentityNamesTheBadFile(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, []byte("not pem"), 0o644))
	mesh := newCA(t, "mesh-ca")
	certFile, keyFile := mesh.Issue(t, dir, "gw", time.Now().Add(time.Hour))
	_, err := LoadIdentity(caFile, certFile, keyFile)
	assert.ErrorContains(t, err, "CA file "+caFile+" holds no PEM certificate")
	_, err = LoadIdentity(filepath.Join(dir, "missing"), certFile, keyFile)
	assert.ErrorContains(t, err, filepath.Join(dir, "missing"))
}

// issuedAs is issued for a certificate with the URI SANs uris: role URIs.
func issuedAs(t *testing.T, c *ca, name string, uris ...string) *Identity {
	t.Helper()
	id, err := LoadIdentity(c.Files(t, c, t.TempDir(), name, time.Now().Add(time.Hour), uris...))
	require.NoError(t, err)
	return id
}

// presenting is a certificate of c for name with the URI SANs uris, as a
// peer presents it: LoadIdentity may refuse to load it.
func presenting(t *testing.T, c *ca, name string, uris ...string) tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.Issue(t, t.TempDir(), name, time.Now().Add(time.Hour), uris...))
	require.NoError(t, err)
	return pair
}

func TestACertificatesRoleIsItsKind(t *testing.T) {
	mesh := newCA(t, "mesh-ca")
	for name, tt := range map[string]struct {
		uris []string
		kind string
		err  string
	}{
		"a gateway's":          {uris: []string{roleGateway}, kind: KindGateway},
		"an agent's":           {uris: []string{roleAgent, scopeGlobal}, kind: KindAgent},
		"another URI besides":  {uris: []string{"spiffe://ci/agent", roleAgent, scopeTeam + "main"}, kind: KindAgent},
		"both":                 {uris: []string{roleGateway, roleAgent}, err: `has role URIs urn:jetway:mesh:gateway, urn:jetway:mesh:agent; want one of`},
		"one it does not know": {uris: []string{"urn:jetway:mesh:robot"}, err: `has role URIs urn:jetway:mesh:robot; want one of`},
	} {
		t.Run(name, func(t *testing.T) {
			caFile, certFile, keyFile := mesh.Files(t, mesh, t.TempDir(), "m", time.Now().Add(time.Hour), tt.uris...)
			id, err := LoadIdentity(caFile, certFile, keyFile)
			if tt.err != "" {
				assert.ErrorContains(t, err, "mesh: "+certFile+`: certificate of "m" `+tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.kind, id.Kind())
		})
	}
}

// presentingWith is a certificate of c for name, with no URI SAN but what
// change sets, as a peer presents it.
func presentingWith(t *testing.T, c *ca, name string, change func(*x509.Certificate)) tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.IssueWith(t, t.TempDir(), name, time.Now().Add(time.Hour), change))
	require.NoError(t, err)
	return pair
}

// withUsages gives a certificate the gateway's role URI and the extended
// key usages us.
func withUsages(us ...x509.ExtKeyUsage) func(*x509.Certificate) {
	return func(c *x509.Certificate) {
		c.URIs = []*url.URL{{Scheme: "urn", Opaque: "jetway:mesh:gateway"}}
		c.ExtKeyUsage = us
	}
}

// badCertificates are certificates of the mesh CA that do not say what
// they are for: each is refused with its reason.
var badCertificates = map[string]struct {
	change      func(*x509.Certificate)
	reason, msg string
}{
	"no role URI": {func(*x509.Certificate) {}, RefusedNoRole,
		`certificate of "odd" has no role URI: it must say what it is for with urn:jetway:mesh:gateway (a gateway) or urn:jetway:mesh:agent (an agent)`},
	"server auth alone": {withUsages(x509.ExtKeyUsageServerAuth), RefusedKeyUsage, notForBoth + "serverAuth)"},
	"client auth alone": {withUsages(x509.ExtKeyUsageClientAuth), RefusedKeyUsage, notForBoth + "clientAuth)"},
	"any usage":         {withUsages(x509.ExtKeyUsageAny), RefusedKeyUsage, notForBoth + "any)"},
	"no usage":          {withUsages(), RefusedKeyUsage, notForBoth + "none)"},
}

const notForBoth = `certificate of "odd" is not for both TLS client and server authentication (its extended key usages: `

// A certificate without a role URI, or not for both client and server
// authentication, is refused at the handshake, dialing or listening, and
// a member will not run with one.
func TestCertificatesMustSayWhatTheyAreFor(t *testing.T) {
	mesh := newCA(t, "mesh-ca")
	b := issued(t, mesh, "gw-b", time.Now().Add(time.Hour))
	for name, tt := range badCertificates {
		t.Run(name, func(t *testing.T) {
			cert := presentingWith(t, mesh, "odd", tt.change)
			check := func(err error) {
				t.Helper()
				var refused *RefusedError
				require.ErrorAs(t, err, &refused)
				assert.Equal(t, tt.reason, refused.Reason)
				assert.ErrorContains(t, err, tt.msg)
			}
			dialer := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}
			_, serr, _, _ := handshakeWith(t, dialer, b.ServerConfig())
			check(serr)
			listener := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert}
			cerr, _, _, _ := handshakeWith(t, b.ClientConfig(), listener)
			check(cerr)

			dir := t.TempDir()
			caFile := filepath.Join(dir, "ca.crt")
			require.NoError(t, os.WriteFile(caFile, mesh.PEM, 0o644))
			certFile, keyFile := mesh.IssueWith(t, dir, "odd", time.Now().Add(time.Hour), tt.change)
			_, err := LoadIdentity(caFile, certFile, keyFile)
			assert.ErrorContains(t, err, "mesh: "+certFile+": "+tt.msg)
		})
	}
}

// A peer whose certificate has both roles is refused at the handshake,
// dialing or listening.
func TestACertificateWithBothRolesIsRefused(t *testing.T) {
	mesh := newCA(t, "mesh-ca")
	b := issued(t, mesh, "gw-b", time.Now().Add(time.Hour))
	both := presenting(t, mesh, "two-faced", roleGateway, roleAgent)
	check := func(err error) {
		t.Helper()
		var refused *RefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, RefusedBadRole, refused.Reason)
		assert.ErrorContains(t, err, `certificate of "two-faced" has role URIs`)
	}
	dialer := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{both}}
	_, serr, _, _ := handshakeWith(t, dialer, b.ServerConfig())
	check(serr)
	listener := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{both}, ClientAuth: tls.RequireAnyClientCert}
	cerr, _, _, _ := handshakeWith(t, b.ClientConfig(), listener)
	check(cerr)
}

// A member runs as the kind its certificate is for; the error says which
// certificate to issue.
func TestAMemberMustBeOfItsCertificatesKind(t *testing.T) {
	c := newCA(t, "mesh-ca")
	agent, gateway := issuedAs(t, c, "mac-1", roleAgent, scopeGlobal), issued(t, c, "gw-a", time.Now().Add(time.Hour))
	for name, tt := range map[string]struct {
		id   *Identity
		kind string
		err  string
	}{
		"a gateway with an agent's certificate": {agent, "", "mesh: certificate " + agent.certFile +
			" is an agent's (URI SAN urn:jetway:mesh:agent); a gateway needs a gateway certificate: gateway mesh issue without --agent"},
		"an agent with a gateway's certificate": {gateway, KindAgent, "mesh: certificate " + gateway.certFile +
			" is a gateway's; gateway agent needs an agent certificate: gateway mesh issue --agent"},
		"an unknown kind":   {gateway, "robot", `mesh: unknown member kind "robot"; want gateway or agent`},
		"an agent":          {agent, KindAgent, ""},
		"a gateway":         {gateway, "", ""},
		"a gateway by name": {gateway, KindGateway, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(Options{Identity: tt.id, Kind: tt.kind})
			if tt.err == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tt.err)
			}
		})
	}
}
