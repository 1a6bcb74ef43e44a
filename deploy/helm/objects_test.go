package helm_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// TestDefaults checks what an install with nothing but tokens makes: two
// locked-down replicas meshed with each other, with probes and resources.
func TestDefaults(t *testing.T) {
	o, r := renderCI(t, "default-values.yaml")
	assert.Equal(t, []string{
		"ConfigMap/" + fullname + "-config",
		"Deployment/" + fullname,
		"PodDisruptionBudget/" + fullname,
		"Role/" + fullname,
		"RoleBinding/" + fullname,
		"Secret/" + fullname + "-auth",
		"Secret/" + fullname + "-mesh-ca",
		"Service/" + fullname,
		"Service/" + fullname + "-mesh",
		"ServiceAccount/" + fullname,
	}, o.keys())
	assert.Contains(t, r.Notes, "gateway target add NAME")
	assert.Contains(t, r.Notes, "The mesh CA's key (Secret "+fullname+"-mesh-ca) is mounted into every replica's init container")

	d, c := deployment(t, o, fullname)
	pod := d.Spec.Template.Spec
	assert.EqualValues(t, 2, *d.Spec.Replicas)
	assert.Equal(t, d.Spec.Selector.MatchLabels, subset(d.Spec.Template.Labels, d.Spec.Selector.MatchLabels))
	assert.Equal(t, "ghcr.io/jetway-ci/gateway:0.1.0", c.Image)
	assert.Equal(t, fullname, pod.ServiceAccountName)
	assert.True(t, *pod.AutomountServiceAccountToken, "the state namespace is reached with it")
	assertLockedDown(t, pod)

	f := flags(t, c.Args)
	assert.Equal(t, "run", c.Args[0])
	assert.Equal(t, map[string]string{
		"config":           "/etc/jetway/config/config.yaml",
		"listen":           ":8080",
		"targets-dir":      "/etc/jetway/targets",
		"shutdown-timeout": "15s",
		"auth-tokens-file": "/etc/jetway/auth/tokens.yaml",
		"mesh-listen":      ":7443",
		"mesh-peers":       "dns:" + fullname + "-mesh.ci.svc:7443",
		"mesh-ca":          "/etc/jetway/mesh/ca.crt",
		"mesh-cert":        "/etc/jetway/mesh/tls.crt",
		"mesh-key":         "/etc/jetway/mesh/tls.key",
		// Pod names never return: peers forget a stopped replica at once.
		"mesh-leave-on-stop": "true",
	}, f)
	// README, Operations: above shutdown-timeout + 5 s.
	assert.Greater(t, *pod.TerminationGracePeriodSeconds, int64(15+5))

	assert.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.Equal(t, intstr.FromString("http"), c.LivenessProbe.HTTPGet.Port)
	assert.Equal(t, intstr.FromString("http"), c.ReadinessProbe.HTTPGet.Port)
	assert.Equal(t, []corev1.ContainerPort{
		{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "mesh", ContainerPort: 7443, Protocol: corev1.ProtocolTCP},
	}, c.Ports)
	assert.False(t, c.Resources.Requests.Cpu().IsZero())
	assert.False(t, c.Resources.Requests.Memory().IsZero())
	assert.False(t, c.Resources.Limits.Memory().IsZero())
}

// TestDefaultMounts: the config file, the targets Secret (optional), the
// tokens and the mesh certificate where the flags say; the mesh CA only
// in the init container.
func TestDefaultMounts(t *testing.T) {
	o, _ := renderCI(t, "default-values.yaml")
	d, c := deployment(t, o, fullname)
	pod := d.Spec.Template.Spec
	m := mounts(*c)
	assert.Len(t, m, 4)
	for path, volumeName := range map[string]string{
		"/etc/jetway/config": "config", "/etc/jetway/targets": "targets",
		"/etc/jetway/auth": "auth", "/etc/jetway/mesh": "mesh",
	} {
		assert.Equal(t, volumeName, m[path].Name, path)
		assert.True(t, m[path].ReadOnly, path)
	}
	targets := volume(t, pod, "targets").Secret
	require.NotNil(t, targets)
	assert.Equal(t, "jetway-targets", targets.SecretName)
	assert.True(t, *targets.Optional, "the gateway starts before any target is added")
	assert.Equal(t, fullname+"-auth", volume(t, pod, "auth").Secret.SecretName)
	assert.Equal(t, fullname+"-config", volume(t, pod, "config").ConfigMap.Name)
	assert.Nil(t, volume(t, pod, "auth").Secret.Optional, "no tokens, no API: the pod waits for them")

	assertMeshInit(t, pod, fullname+"-mesh-ca")
	assertCA(t, get[corev1.Secret](t, o, "Secret", fullname+"-mesh-ca"))

	tokens := get[corev1.Secret](t, o, "Secret", fullname+"-auth")
	var file struct {
		Tokens []map[string]any `json:"tokens"`
	}
	require.NoError(t, yaml.UnmarshalStrict(tokens.Data["tokens.yaml"], &file))
	assert.Equal(t, []map[string]any{
		{"name": "ops", "token": "ci-admin-token-0123456789", "admin": true},
		{"name": "main-ci", "token": "ci-main-token-0123456789", "team": "main"},
	}, file.Tokens)
}

// TestDefaultServicesAndBudget: the API and mesh Services, the budget, the
// ServiceAccount (whose token only the gateway's pods ask for) and the
// replicas' spread select the pods.
func TestDefaultServicesAndBudget(t *testing.T) {
	o, _ := renderCI(t, "default-values.yaml")
	d, _ := deployment(t, o, fullname)
	pod := d.Spec.Template.Spec
	api := get[corev1.Service](t, o, "Service", fullname)
	assert.Equal(t, corev1.ServiceTypeClusterIP, api.Spec.Type)
	assert.Equal(t, []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}, api.Spec.Ports)
	assert.Equal(t, d.Spec.Selector.MatchLabels, api.Spec.Selector)

	mesh := get[corev1.Service](t, o, "Service", fullname+"-mesh")
	assert.Equal(t, corev1.ClusterIPNone, mesh.Spec.ClusterIP)
	assert.True(t, mesh.Spec.PublishNotReadyAddresses, "replicas join the mesh before they are ready")
	assert.Equal(t, []corev1.ServicePort{{Name: "mesh", Port: 7443, TargetPort: intstr.FromString("mesh"), Protocol: corev1.ProtocolTCP}}, mesh.Spec.Ports)
	assert.Equal(t, d.Spec.Selector.MatchLabels, mesh.Spec.Selector)

	pdb := get[policyv1.PodDisruptionBudget](t, o, "PodDisruptionBudget", fullname)
	assert.Equal(t, intstr.FromInt32(1), *pdb.Spec.MaxUnavailable)
	assert.Nil(t, pdb.Spec.MinAvailable)
	assert.Equal(t, d.Spec.Selector, pdb.Spec.Selector)

	sa := get[corev1.ServiceAccount](t, o, "ServiceAccount", fullname)
	assert.False(t, *sa.AutomountServiceAccountToken, "other pods running as it get no token")

	anti := pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	require.Len(t, anti, 1, "replicas prefer other nodes")
	assert.Equal(t, "kubernetes.io/hostname", anti[0].PodAffinityTerm.TopologyKey)
	assert.Equal(t, d.Spec.Selector.MatchLabels, anti[0].PodAffinityTerm.LabelSelector.MatchLabels)
}

// assertLockedDown checks the pod's and every container's security
// settings, which the restricted Pod Security Standard requires.
func assertLockedDown(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	psc := pod.SecurityContext
	assert.True(t, *psc.RunAsNonRoot)
	assert.EqualValues(t, 65532, *psc.RunAsUser)
	assert.EqualValues(t, 65532, *psc.RunAsGroup)
	assert.EqualValues(t, 65532, *psc.FSGroup)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		sc := c.SecurityContext
		require.NotNil(t, sc, c.Name)
		assert.True(t, *sc.ReadOnlyRootFilesystem, c.Name)
		assert.False(t, *sc.AllowPrivilegeEscalation, c.Name)
		assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, c.Name)
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			// Group-readable, the group being the pod's fsGroup.
			assert.EqualValues(t, 0o440, *v.Secret.DefaultMode, v.Name)
		}
	}
}

// assertMeshInit checks the init container that issues each replica's
// mesh certificate from the CA in caSecret.
func assertMeshInit(t *testing.T, pod corev1.PodSpec, caSecret string) {
	t.Helper()
	require.Len(t, pod.InitContainers, 1)
	ic := pod.InitContainers[0]
	assert.Equal(t, pod.Containers[0].Image, ic.Image)
	assert.Equal(t, []string{"mesh", "issue",
		"--ca-cert", "/etc/jetway/mesh-ca/tls.crt", "--ca-key", "/etc/jetway/mesh-ca/tls.key",
		"--name", "$(POD_NAME)", "--dns", "$(POD_NAME)", "--dns", fullname + "-mesh.ci.svc",
		"--out", "/etc/jetway/mesh"}, ic.Args)
	require.Len(t, ic.Env, 1)
	assert.Equal(t, "POD_NAME", ic.Env[0].Name)
	assert.Equal(t, "metadata.name", ic.Env[0].ValueFrom.FieldRef.FieldPath)
	m := mounts(ic)
	assert.Equal(t, "mesh-ca", m["/etc/jetway/mesh-ca"].Name)
	assert.True(t, m["/etc/jetway/mesh-ca"].ReadOnly)
	assert.Equal(t, "mesh", m["/etc/jetway/mesh"].Name)
	assert.False(t, m["/etc/jetway/mesh"].ReadOnly)
	assert.Equal(t, caSecret, volume(t, pod, "mesh-ca").Secret.SecretName)
	for _, c := range pod.Containers {
		assert.NotContains(t, mounts(c), "/etc/jetway/mesh-ca", "only the init container sees the CA's key")
	}
	dir := volume(t, pod, "mesh").EmptyDir
	require.NotNil(t, dir)
	assert.Equal(t, corev1.StorageMediumMemory, dir.Medium, "the key never touches a disk")
}

// assertCA checks a generated mesh CA: a TLS Secret whose certificate is a
// CA and whose key is that certificate's.
func assertCA(t *testing.T, s *corev1.Secret) {
	t.Helper()
	assert.Equal(t, corev1.SecretTypeTLS, s.Type)
	_, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	require.NoError(t, err)
	block, _ := pem.Decode(s.Data["tls.crt"])
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.True(t, cert.IsCA)
	assert.NotZero(t, cert.KeyUsage&x509.KeyUsageCertSign)
}

// TestWithoutMesh: one gateway on its own with tokens from an existing
// Secret makes no mesh objects, flags or init container.
func TestWithoutMesh(t *testing.T) {
	o, _ := renderCI(t, "no-mesh-values.yaml")
	assert.Equal(t, []string{
		"ConfigMap/" + fullname + "-config",
		"Deployment/" + fullname,
		"Role/" + fullname,
		"RoleBinding/" + fullname,
		"Service/" + fullname,
	}, o.keys())
	d, c := deployment(t, o, fullname)
	assert.EqualValues(t, 1, *d.Spec.Replicas)
	assert.Empty(t, d.Spec.Template.Spec.InitContainers)
	assert.Equal(t, "default", d.Spec.Template.Spec.ServiceAccountName)
	for key := range flags(t, c.Args) {
		assert.NotContains(t, key, "mesh")
	}
	assert.Len(t, c.Ports, 1)
	assert.Equal(t, "jetway-tokens", volume(t, d.Spec.Template.Spec, "auth").Secret.SecretName)
	assertLockedDown(t, d.Spec.Template.Spec)
}

// TestNoAuth: auth.noAuth passes --no-auth and mounts no tokens, and the
// notes say so.
func TestNoAuth(t *testing.T) {
	o, r := render(t, map[string]any{"auth": map[string]any{"noAuth": true}})
	_, c := deployment(t, o, fullname)
	f := flags(t, c.Args)
	assert.Equal(t, "true", f["no-auth"])
	assert.NotContains(t, f, "auth-tokens-file")
	assert.NotContains(t, mounts(*c), "/etc/jetway/auth")
	assert.NotContains(t, o, "Secret/"+fullname+"-auth")
	assert.Contains(t, r.Notes, "WARNING: the API serves without authentication")
}

// TestCertManager: with mesh.certManager.enabled cert-manager makes the CA
// (a self-signed Issuer signs a CA Certificate) and a CA Issuer signing
// with it; cert-manager's csi-driver requests each pod's certificate from
// that Issuer. No init container, and no pod holds the CA's key.
func TestCertManager(t *testing.T) {
	o, r := renderCI(t, "cert-manager-values.yaml")
	assert.NotContains(t, r.Notes, "CA's key")
	assert.NotContains(t, o, "Secret/"+fullname+"-mesh-ca")
	issuer := o["Issuer/"+fullname+"-mesh-issuer"]
	require.NotNil(t, issuer)
	assert.Equal(t, "cert-manager.io/v1", issuer.GetAPIVersion())
	assert.Equal(t, map[string]any{}, field(t, issuer, "spec", "selfSigned"))

	cert := o["Certificate/"+fullname+"-mesh-ca"]
	require.NotNil(t, cert)
	assert.Equal(t, true, field(t, cert, "spec", "isCA"))
	assert.Equal(t, fullname+"-mesh-ca", field(t, cert, "spec", "secretName"))
	assert.Equal(t, map[string]any{"group": "cert-manager.io", "kind": "Issuer", "name": fullname + "-mesh-issuer"}, field(t, cert, "spec", "issuerRef"))
	assert.Equal(t, "Never", field(t, cert, "spec", "privateKey", "rotationPolicy"), "a renewed CA keeps its key")

	caIssuer := o["Issuer/"+fullname+"-mesh-ca"]
	require.NotNil(t, caIssuer)
	assert.Equal(t, "cert-manager.io/v1", caIssuer.GetAPIVersion())
	assert.Equal(t, map[string]any{"secretName": fullname + "-mesh-ca"}, field(t, caIssuer, "spec", "ca"))

	d, c := deployment(t, o, fullname)
	pod := d.Spec.Template.Spec
	assert.Empty(t, pod.InitContainers, "no init container issues certificates from the CA's key")
	assertNoCAKey(t, pod, fullname+"-mesh-ca")
	assertMeshCSI(t, pod, *c, fullname+"-mesh-ca")
	assert.Equal(t, "dns:"+fullname+"-mesh.ci.svc:7443,hub.example.com:7443,dns:gateways.other.svc:7443", flags(t, c.Args)["mesh-peers"])
	assertLockedDown(t, pod)
}

// TestCertManagerWithExistingCA: cert-manager signs the replicas'
// certificates with a CA of the operator's (gateways of other clusters
// share it); the chart makes no CA of its own.
func TestCertManagerWithExistingCA(t *testing.T) {
	o, _ := render(t, map[string]any{
		"auth": map[string]any{"noAuth": true},
		"mesh": map[string]any{"ca": map[string]any{"existingSecret": "jetway-mesh-ca"}, "certManager": map[string]any{"enabled": true}},
	})
	assert.NotContains(t, o, "Secret/"+fullname+"-mesh-ca")
	assert.NotContains(t, o, "Certificate/jetway-mesh-ca")
	assert.NotContains(t, o, "Issuer/"+fullname+"-mesh-issuer")
	caIssuer := o["Issuer/"+fullname+"-mesh-ca"]
	require.NotNil(t, caIssuer)
	assert.Equal(t, map[string]any{"secretName": "jetway-mesh-ca"}, field(t, caIssuer, "spec", "ca"))
	d, c := deployment(t, o, fullname)
	pod := d.Spec.Template.Spec
	assert.Empty(t, pod.InitContainers)
	assertNoCAKey(t, pod, "jetway-mesh-ca")
	assertMeshCSI(t, pod, *c, fullname+"-mesh-ca")
}

// assertNoCAKey checks that nothing of the pod reaches the CA Secret
// caSecret (whose tls.key is the CA's key): no volume, projected or not,
// and no environment variable of any container or init container.
func assertNoCAKey(t *testing.T, pod corev1.PodSpec, caSecret string) {
	t.Helper()
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			assert.NotEqual(t, caSecret, v.Secret.SecretName, "volume %s holds the CA's key", v.Name)
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					assert.NotEqual(t, caSecret, src.Secret.Name, "volume %s holds the CA's key", v.Name)
				}
			}
		}
	}
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				assert.NotEqual(t, caSecret, e.SecretRef.Name, "container %s reads the CA Secret", c.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				assert.NotEqual(t, caSecret, e.ValueFrom.SecretKeyRef.Name, "container %s reads the CA Secret", c.Name)
			}
		}
	}
}

// assertMeshCSI checks the pod's mesh volume of cert-manager's csi-driver:
// a certificate from the CA Issuer issuer, named after the pod, whose
// files are where the gateway's flags look. csi_test.go checks that what
// it requests is a certificate the mesh takes.
func assertMeshCSI(t *testing.T, pod corev1.PodSpec, gw corev1.Container, issuer string) {
	t.Helper()
	v := volume(t, pod, "mesh").CSI
	require.NotNil(t, v, "the mesh volume is the csi-driver's")
	assert.Equal(t, "csi.cert-manager.io", v.Driver)
	assert.True(t, *v.ReadOnly, "the csi-driver mounts read-only volumes only")
	a := v.VolumeAttributes
	assert.Equal(t, issuer, a["csi.cert-manager.io/issuer-name"])
	assert.Equal(t, "Issuer", a["csi.cert-manager.io/issuer-kind"])
	assert.Equal(t, "cert-manager.io", a["csi.cert-manager.io/issuer-group"])
	assert.Equal(t, "168h", a["csi.cert-manager.io/duration"])
	assert.Equal(t, strconv.Itoa(int(*pod.SecurityContext.FSGroup)), a["csi.cert-manager.io/fs-group"], "the gateway's group reads the key")
	for _, k := range []string{"ca-file", "certificate-file", "privatekey-file"} {
		assert.NotContains(t, a, "csi.cert-manager.io/"+k, "the csi-driver's default file names are the flags'")
	}
	f := flags(t, gw.Args)
	assert.Equal(t, "/etc/jetway/mesh/ca.crt", f["mesh-ca"])
	assert.Equal(t, "/etc/jetway/mesh/tls.crt", f["mesh-cert"])
	assert.Equal(t, "/etc/jetway/mesh/tls.key", f["mesh-key"])
	m := mounts(gw)["/etc/jetway/mesh"]
	assert.Equal(t, "mesh", m.Name)
	assert.True(t, m.ReadOnly)
}

// TestTargetsAndConfig: targets and settings given as values, the CA from
// an existing Secret, another full name, a state namespace of its own.
func TestTargetsAndConfig(t *testing.T) {
	o, _ := renderCI(t, "targets-values.yaml")
	assert.NotContains(t, o, "Secret/gateways-mesh-ca", "the CA comes from mesh.ca.existingSecret")
	d, c := deployment(t, o, "gateways")
	pod := d.Spec.Template.Spec
	assert.Equal(t, "ci-targets", volume(t, pod, "targets").Secret.SecretName)
	assert.Equal(t, "jetway-mesh-ca", volume(t, pod, "mesh-ca").Secret.SecretName)
	assert.Equal(t, "30s", flags(t, c.Args)["shutdown-timeout"])
	assert.Equal(t, "jetway-state", flags(t, c.Args)["state-namespace"])
	rb := get[rbacv1.RoleBinding](t, o, "RoleBinding", namespace+"-gateways")
	assert.Equal(t, "jetway-state", rb.Namespace)
	assert.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "gateways", Namespace: namespace}}, rb.Subjects)
	assert.Greater(t, *pod.TerminationGracePeriodSeconds, int64(30+5))

	s := get[corev1.Secret](t, o, "Secret", "ci-targets")
	assert.Equal(t, []string{"prod-eu.kubeconfig"}, slices.Sorted(maps.Keys(s.Data)))

	cm := get[corev1.ConfigMap](t, o, "ConfigMap", "gateways-config")
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg))
	assert.Equal(t, map[string]any{
		"log-level": "debug", "installation": "ci-prod", "health-interval": "20s", "max-streams": float64(32),
		"placement-strategy": []any{"fewest-build-containers", "volume-locality"},
	}, cfg)

	pdb := get[policyv1.PodDisruptionBudget](t, o, "PodDisruptionBudget", "gateways")
	assert.Equal(t, intstr.FromInt32(1), *pdb.Spec.MinAvailable)
	assert.Nil(t, pdb.Spec.MaxUnavailable)
}

// TestConfigChangeRollsPods: the gateway reads its config file once, so a
// change of it changes the pod template.
func TestConfigChangeRollsPods(t *testing.T) {
	checksum := func(config map[string]any) string {
		o, _ := render(t, map[string]any{"auth": map[string]any{"noAuth": true}, "config": config})
		d, _ := deployment(t, o, fullname)
		return d.Spec.Template.Annotations["checksum/config"]
	}
	assert.NotEqual(t, checksum(map[string]any{"log-level": "debug"}), checksum(map[string]any{"log-level": "info"}))
}

func field(t *testing.T, u *unstructured.Unstructured, path ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	require.NoError(t, err)
	require.True(t, ok, "%s has no %v", u.GetName(), path)
	return v
}

// subset returns the entries of m whose keys are in keysOf.
func subset(m, keysOf map[string]string) map[string]string {
	out := map[string]string{}
	for k := range keysOf {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}
