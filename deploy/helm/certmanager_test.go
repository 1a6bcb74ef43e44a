package helm_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetway-ci/jetway/internal/meshtest"
	"github.com/jetway-ci/jetway/mesh"
)

// TestCertManagerCertificatesJoinTheMesh makes the certificates that
// cert-manager's csi-driver requests for two replicas, from the volume
// attributes the chart renders, as the csi-driver and cert-manager's CA
// Issuer make them; the mesh's own code then judges them: each loads as
// its replica's identity (mesh.LoadIdentity checks the name, the role URI
// and both usages), a gateway's, named after its pod, and the two
// handshake with each other, each knowing the other by its pod name. No
// copy of the mesh's role URI or usages here: the mesh decides.
func TestCertManagerCertificatesJoinTheMesh(t *testing.T) {
	attrs := renderedCSIAttributes(t)
	ca := meshtest.NewCA(t, "mesh-ca")
	pods := []string{fullname + "-5d8c7b9f4-x2x7q", fullname + "-5d8c7b9f4-k9r4m"}
	ids := make([]*mesh.Identity, len(pods))
	for i, pod := range pods {
		id, err := csiIdentity(t, ca, attrs, pod)
		require.NoError(t, err, pod)
		assert.Equal(t, pod, id.Name(), "a replica's mesh name is its pod's: two replicas never share one")
		assert.Equal(t, mesh.KindGateway, id.Kind())
		ids[i] = id
	}
	dialerSaw, listenerSaw := meshHandshake(t, ids[0], ids[1])
	assert.Equal(t, pods[1], dialerSaw)
	assert.Equal(t, pods[0], listenerSaw)
}

// TestCertManagerRequestsWhatTheMeshRequires: the same request without
// the role URI, or without either usage, makes a certificate the mesh
// refuses, so the test above turns on what the chart requests.
func TestCertManagerRequestsWhatTheMeshRequires(t *testing.T) {
	ca := meshtest.NewCA(t, "mesh-ca")
	for name, tc := range map[string]struct{ key, value, err string }{
		"no role URI":       {"csi.cert-manager.io/uri-sans", "", "no role URI"},
		"server auth alone": {"csi.cert-manager.io/key-usages", "digital signature,server auth", "not for both TLS client and server authentication"},
		"client auth alone": {"csi.cert-manager.io/key-usages", "digital signature,client auth", "not for both TLS client and server authentication"},
	} {
		t.Run(name, func(t *testing.T) {
			attrs := renderedCSIAttributes(t)
			attrs[tc.key] = tc.value
			_, err := csiIdentity(t, ca, attrs, fullname+"-5d8c7b9f4-x2x7q")
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

// renderedCSIAttributes are the volume attributes of the mesh volume with
// mesh.certManager.enabled.
func renderedCSIAttributes(t *testing.T) map[string]string {
	t.Helper()
	o, _ := renderCI(t, "cert-manager-values.yaml")
	d, _ := deployment(t, o, fullname)
	v := volume(t, d.Spec.Template.Spec, "mesh").CSI
	require.NotNil(t, v)
	require.Equal(t, "csi.cert-manager.io", v.Driver)
	return v.VolumeAttributes
}

// csiIdentity writes, as the csi-driver does into the pod's volume, the
// certificate that ca (standing in for the CA Issuer) signs for the
// request attrs make for pod, and loads it as the gateway does.
func csiIdentity(t *testing.T, ca *meshtest.CA, attrs map[string]string, pod string) (*mesh.Identity, error) {
	t.Helper()
	expand := func(key string) string {
		return os.Expand(attrs[key], func(v string) string {
			vars := map[string]string{"POD_NAME": pod, "POD_NAMESPACE": namespace, "SERVICE_ACCOUNT_NAME": fullname}
			val, ok := vars[v]
			require.True(t, ok, "%s: the csi-driver knows no variable %s", key, v)
			return val
		})
	}
	dir := t.TempDir()
	certFile, keyFile := ca.IssueWith(t, dir, "member", time.Now().Add(time.Hour), func(c *x509.Certificate) {
		c.Subject.CommonName = expand("csi.cert-manager.io/common-name")
		c.DNSNames = list(expand("csi.cert-manager.io/dns-names"))
		c.URIs = nil
		for _, u := range list(expand("csi.cert-manager.io/uri-sans")) {
			parsed, err := url.ParseRequestURI(u)
			require.NoError(t, err, "csi.cert-manager.io/uri-sans")
			c.URIs = append(c.URIs, parsed)
		}
		c.KeyUsage, c.ExtKeyUsage = certManagerUsages(t, list(attrs["csi.cert-manager.io/key-usages"]))
	})
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, ca.PEM, 0o644))
	return mesh.LoadIdentity(caFile, certFile, keyFile)
}

// list splits a csi-driver list attribute: comma-separated, spaces trimmed.
func list(csv string) []string {
	var out []string
	for _, s := range strings.Split(csv, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// certManagerUsages maps usages in cert-manager's words (its API's
// KeyUsage values, which the CA Issuer signs as pkg/api/util's
// KeyUsageType and ExtKeyUsageType say) to X.509's. A word this table does
// not know fails the test rather than being dropped.
func certManagerUsages(t *testing.T, words []string) (x509.KeyUsage, []x509.ExtKeyUsage) {
	t.Helper()
	keyUsages := map[string]x509.KeyUsage{
		"signing": x509.KeyUsageDigitalSignature, "digital signature": x509.KeyUsageDigitalSignature,
		"key encipherment": x509.KeyUsageKeyEncipherment,
	}
	extUsages := map[string]x509.ExtKeyUsage{
		"any": x509.ExtKeyUsageAny, "server auth": x509.ExtKeyUsageServerAuth, "client auth": x509.ExtKeyUsageClientAuth,
	}
	var ku x509.KeyUsage
	var eku []x509.ExtKeyUsage
	for _, w := range words {
		if u, ok := keyUsages[w]; ok {
			ku |= u
		} else if u, ok := extUsages[w]; ok {
			eku = append(eku, u)
		} else {
			t.Fatalf("key usage %q: not one this test knows", w)
		}
	}
	return ku, eku
}

// meshHandshake runs the mesh's TLS handshake between a dialer and a
// listener over loopback TCP (net.Pipe has no buffer: both sides of a
// TLS 1.3 handshake write at once) and returns the name each saw.
func meshHandshake(t *testing.T, dialer, listener *mesh.Identity) (dialerSaw, listenerSaw string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		conn *tls.Conn
		err  error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- result{err: err}
			return
		}
		conn := tls.Server(c, listener.ServerConfig())
		accepted <- result{conn, conn.HandshakeContext(ctx)}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	client := tls.Client(c, dialer.ClientConfig())
	defer client.Close()
	clientErr := client.HandshakeContext(ctx)
	if clientErr != nil {
		_ = c.Close() // the listener's handshake ends
	}
	server := <-accepted
	if server.conn != nil {
		defer server.conn.Close()
	}
	require.NoError(t, clientErr)
	require.NoError(t, server.err)
	return mesh.PeerName(client.ConnectionState()), mesh.PeerName(server.conn.ConnectionState())
}
