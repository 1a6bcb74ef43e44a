package mesh

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Identity is a member's mesh TLS material: its certificate and key and
// the mesh CA. The files are read again whenever one of them changed, at
// the next handshake, so certificates rotate without a restart; a
// rotation that does not load (a half-written file, a key that does not
// match) keeps the last good material and is reported by Reload.
type Identity struct {
	caFile, certFile, keyFile string
	now                       func() time.Time

	mu    sync.Mutex
	stamp [3]stamp
	cert  *tls.Certificate
	pool  *x509.CertPool
	name  string
	kind  string
	scope AgentScope // an agent's, from its certificate
	// bad and badErr are the files as they were when they last failed to
	// load, and why: not read again, nor reported again, until they change.
	bad     [3]stamp
	badErr  error
	observe func(leaf *x509.Certificate, err error)
}

// stamp is what tells a file changed.
type stamp struct {
	mod  time.Time
	size int64
}

// Reasons a peer is refused at the handshake.
const (
	RefusedNoCertificate = "no-certificate"
	RefusedUnknownCA     = "unknown-authority"
	RefusedExpired       = "expired"
	RefusedNoName        = "no-name"
	// RefusedBadRole is a certificate with both role URIs, or a role URI
	// this version does not know (certKind).
	RefusedBadRole = "bad-role"
	// RefusedNoRole is a certificate with no role URI: it does not say
	// what it is for, and a member never guesses.
	RefusedNoRole = "no-role"
	// RefusedKeyUsage is a certificate not for both TLS client and server
	// authentication: every member dials and accepts.
	RefusedKeyUsage = "key-usage"
	// RefusedAgentScope is an agent's certificate that does not say
	// which team's steps the agent runs (one issued before scopes were
	// bound to certificates), or says it ambiguously (scope.go).
	RefusedAgentScope = "agent-scope"
	// RefusedDuplicate is a second session of a member whose session is
	// live: it answered a ping. A member holds one session per peer; a
	// new one replaces the old only once the old stopped answering.
	RefusedDuplicate = "duplicate"
)

// Role URIs: a certificate's URI SAN says which kind of member it is for
// (docs/mesh.md, "TLS"); a certificate without one is refused.
const (
	rolePrefix  = "urn:jetway:mesh:"
	roleGateway = rolePrefix + KindGateway
	roleAgent   = rolePrefix + KindAgent
)

// errNoRole is a certificate without a role URI.
var errNoRole = errors.New("no role URI")

// certKind is the kind of member a certificate is for: KindAgent with the
// agent's role URI, KindGateway with the gateway's. None (errNoRole),
// both, or any other URI under rolePrefix, is an error: a member never
// guesses a role.
func certKind(c *x509.Certificate) (string, error) {
	var roles []string
	for _, u := range c.URIs {
		if s := u.String(); strings.HasPrefix(s, rolePrefix) {
			roles = append(roles, s)
		}
	}
	switch {
	case len(roles) == 0:
		return "", fmt.Errorf("certificate of %q has %w: it must say what it is for with %s (a gateway) or %s (an agent); gateway mesh issue writes one",
			certName(c), errNoRole, roleGateway, roleAgent)
	case len(roles) == 1 && roles[0] == roleGateway:
		return KindGateway, nil
	case len(roles) == 1 && roles[0] == roleAgent:
		return KindAgent, nil
	}
	return "", fmt.Errorf("certificate of %q has role URIs %s; want one of %s (a gateway) or %s (an agent)",
		certName(c), strings.Join(roles, ", "), roleGateway, roleAgent)
}

// aKind is "a gateway" or "an agent", for messages.
func aKind(kind string) string {
	if kind == KindAgent {
		return "an agent"
	}
	return "a gateway"
}

// RefusedError is a peer refused at the handshake, with the reason (one of
// the Refused values) and the detail.
type RefusedError struct {
	Reason string
	Err    error
}

func (e *RefusedError) Error() string { return "peer refused (" + e.Reason + "): " + e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// LoadIdentity reads the mesh CA, the certificate and its key; an error
// names the file at fault.
func LoadIdentity(caFile, certFile, keyFile string) (*Identity, error) {
	id := &Identity{caFile: caFile, certFile: certFile, keyFile: keyFile, now: time.Now}
	if err := id.Reload(); err != nil {
		return nil, err
	}
	return id, nil
}

// Name is this member's mesh name: its certificate's.
func (id *Identity) Name() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.name
}

// Kind is the kind of member this certificate is for (KindGateway or
// KindAgent), from its role URI (certKind).
func (id *Identity) Kind() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.kind
}

// Scope is what an agent's certificate lets it be (its team and tags);
// the zero AgentScope for a gateway's.
func (id *Identity) Scope() AgentScope {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.scope
}

// memberKind is the kind a member asked to run as kind (KindGateway if
// empty) runs as with this certificate: that kind, if the certificate is
// for it; else the error says which certificate such a member needs.
func (id *Identity) memberKind(kind string) (string, error) {
	switch kind {
	case "":
		kind = KindGateway
	case KindGateway, KindAgent:
	default:
		return "", fmt.Errorf("mesh: unknown member kind %q; want %s or %s", kind, KindGateway, KindAgent)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	switch {
	case kind == id.kind:
		return kind, nil
	case id.kind == KindAgent:
		return "", fmt.Errorf("mesh: certificate %s is an agent's (URI SAN %s); a gateway needs a gateway certificate: gateway mesh issue without --agent",
			id.certFile, roleAgent)
	}
	return "", fmt.Errorf("mesh: certificate %s is a gateway's; gateway agent needs an agent certificate: gateway mesh issue --agent", id.certFile)
}

// Observe calls fn with the certificate in use now, then after each
// read of changed files: with the new certificate, or with why the files
// did not load (once per change). fn runs with the identity locked.
func (id *Identity) Observe(fn func(leaf *x509.Certificate, err error)) {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.observe = fn
	fn(id.cert.Leaf, nil)
}

// reportCertificate is an Observe function that logs each load of the
// files, or why they did not load, and notes it in the metrics.
func reportCertificate(log *slog.Logger, metrics *Metrics) func(*x509.Certificate, error) {
	return func(leaf *x509.Certificate, err error) {
		if err != nil {
			log.Error("mesh certificate files changed but do not load; the last good ones stay in use", "error", err.Error())
		} else {
			kind, _ := certKind(leaf) // load refused any other
			attrs := []any{"name", certName(leaf), "kind", kind, "not_after", leaf.NotAfter}
			if kind == KindAgent {
				scope, _ := certScope(leaf) // load refused any other
				attrs = append(attrs, "scope", scope.String())
			}
			log.Info("mesh certificate loaded", attrs...)
		}
		metrics.certificate(leaf, err)
	}
}

// Reload reads the files again if any changed since the last good read.
// A name or kind other than the one loaded first is refused: peers know a
// member by its name and kind, so a new one takes a restart.
func (id *Identity) Reload() error {
	var now [3]stamp
	var err error
	for i, f := range []string{id.caFile, id.certFile, id.keyFile} {
		fi, serr := os.Stat(f)
		if serr != nil {
			err = cmp.Or(err, fmt.Errorf("mesh: %w", serr))
			continue
		}
		now[i] = stamp{fi.ModTime(), fi.Size()}
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	switch {
	case err == nil && id.cert != nil && now == id.stamp:
		return nil
	case id.badErr != nil && now == id.bad:
		return id.badErr
	case err == nil:
		err = id.load(now)
	}
	id.bad, id.badErr = now, err
	if id.observe != nil {
		id.observe(id.cert.Leaf, err)
	}
	return err
}

// load reads the files, whose stamps are now. Called with id.mu held.
func (id *Identity) load(now [3]stamp) error {
	caPEM, err := os.ReadFile(id.caFile)
	if err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("mesh: CA file %s holds no PEM certificate", id.caFile)
	}
	cert, err := tls.LoadX509KeyPair(id.certFile, id.keyFile)
	if err != nil {
		return fmt.Errorf("mesh: certificate %s with key %s: %w", id.certFile, id.keyFile, err)
	}
	name := certName(cert.Leaf)
	kind, err := certKind(cert.Leaf)
	if err == nil {
		err = bothAuthUsages(cert.Leaf)
	}
	var scope AgentScope
	if err == nil && kind == KindAgent {
		scope, err = certScope(cert.Leaf)
	}
	switch {
	case name == "":
		return fmt.Errorf("mesh: certificate %s names no one (no common name or DNS name)", id.certFile)
	case err != nil:
		return fmt.Errorf("mesh: %s: %w", id.certFile, err)
	case id.name != "" && name != id.name:
		return fmt.Errorf("mesh: certificate %s names %q, but this member is %q; a new name needs a restart", id.certFile, name, id.name)
	case id.kind != "" && kind != id.kind:
		return fmt.Errorf("mesh: certificate %s is %s's, but this member is %s; a new kind needs a restart",
			id.certFile, aKind(kind), aKind(id.kind))
	case id.cert != nil && !scope.equal(id.scope):
		return fmt.Errorf("mesh: certificate %s makes this agent one of %s, but it runs as one of %s; a new scope needs a restart",
			id.certFile, scope, id.scope)
	}
	id.stamp, id.cert, id.pool, id.name, id.kind, id.scope = now, &cert, pool, name, kind, scope
	return nil
}

// certName is a certificate's mesh name: its common name, else its first
// DNS name.
func certName(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0]
	}
	return ""
}

// current reloads if needed (a failed reload keeps the last good
// material) and returns the certificate and CA pool.
func (id *Identity) current() (*tls.Certificate, *x509.CertPool) {
	_ = id.Reload()
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.cert, id.pool
}

// ServerConfig accepts mesh peers: TLS 1.3, a client certificate from the
// mesh CA required.
func (id *Identity) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert, // verified by verify, against the CA as it is now
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, _ := id.current()
			return cert, nil
		},
		VerifyConnection: id.verify,
		NextProtos:       []string{alpnSession, alpnBulk},
	}
}

// ALPN protocols of mesh connections: a session's, or a bulk session's
// (docs/mesh.md). The accepting side needs to know which before yamux
// starts, as the two run with different windows.
const (
	alpnSession = "jetway-mesh/1"
	alpnBulk    = "jetway-mesh-bulk/1"
)

// ClientConfig dials mesh peers. The peer is known by the name in its
// certificate from the mesh CA, not by the address dialed (a headless
// Service's addresses name no one), so verify checks it.
func (id *Identity) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // verify below does the whole check
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := id.current()
			return cert, nil
		},
		VerifyConnection: id.verify,
	}
}

// verify checks the peer's chain against the mesh CA.
func (id *Identity) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return &RefusedError{RefusedNoCertificate, errors.New("the peer presented no certificate")}
	}
	_, pool := id.current()
	return verifyChain(cs.PeerCertificates, pool, id.now())
}

// verifyChain is the whole check of a peer's certificates (the leaf
// first) against the mesh CA pool at now: what every handshake runs, and
// Issue on what it makes.
func verifyChain(chain []*x509.Certificate, pool *x509.CertPool, now time.Time) error {
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return &RefusedError{RefusedExpired, fmt.Errorf("certificate of %q: %w", certName(leaf), err)}
	case err != nil:
		return &RefusedError{RefusedUnknownCA, fmt.Errorf("certificate of %q: %w", certName(leaf), err)}
	case certName(leaf) == "":
		return &RefusedError{RefusedNoName, errors.New("the peer's certificate names no one")}
	}
	if err := bothAuthUsages(leaf); err != nil {
		return &RefusedError{RefusedKeyUsage, err}
	}
	kind, err := certKind(leaf)
	switch {
	case errors.Is(err, errNoRole):
		return &RefusedError{RefusedNoRole, err}
	case err != nil:
		return &RefusedError{RefusedBadRole, err}
	case kind == KindAgent:
		if _, err := certScope(leaf); err != nil {
			return &RefusedError{RefusedAgentScope, err}
		}
	}
	return nil
}

// bothAuthUsages checks that a member's certificate is for TLS client and
// server authentication alike, by its extended key usages (not "any").
func bothAuthUsages(c *x509.Certificate) error {
	if slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) && slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		return nil
	}
	return fmt.Errorf("certificate of %q is not for both TLS client and server authentication (its extended key usages: %s); every member dials and accepts: gateway mesh issue writes both",
		certName(c), usageNames(c.ExtKeyUsage))
}

func usageNames(us []x509.ExtKeyUsage) string {
	if len(us) == 0 {
		return "none"
	}
	names := map[x509.ExtKeyUsage]string{x509.ExtKeyUsageAny: "any", x509.ExtKeyUsageServerAuth: "serverAuth",
		x509.ExtKeyUsageClientAuth: "clientAuth", x509.ExtKeyUsageCodeSigning: "codeSigning", x509.ExtKeyUsageEmailProtection: "emailProtection"}
	var out []string
	for _, u := range us {
		out = append(out, cmp.Or(names[u], fmt.Sprintf("usage %d", u)))
	}
	return strings.Join(out, ", ")
}

// PeerName is the verified peer's mesh name of a finished handshake.
func PeerName(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return certName(cs.PeerCertificates[0])
}

// peerCert is what a peer's verified certificate says: its name and the
// kind of member it is for (its hello must say the same), and an agent's
// scope.
type peerCert struct {
	name, kind string
	scope      AgentScope
}

// peerCertOf is the verified peer's certificate of a finished handshake.
func peerCertOf(cs tls.ConnectionState) peerCert {
	if len(cs.PeerCertificates) == 0 {
		return peerCert{}
	}
	leaf := cs.PeerCertificates[0]
	kind, _ := certKind(leaf) // verify refused any other
	p := peerCert{name: certName(leaf), kind: kind}
	if kind == KindAgent {
		p.scope, _ = certScope(leaf) // verify refused any other
	}
	return p
}
