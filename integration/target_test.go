package integration

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/internal/provision"
	"github.com/jetway-ci/jetway/targets"
)

// runCLI runs the gateway CLI and returns its stdout, stderr and exit
// status.
func runCLI(t *testing.T, ctx context.Context, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return stdout.String(), stderr.String(), code
}

// TestTargetAddToDirectory adds a cluster the way an operator would, with
// the admin kubeconfig (CA and client certificate in files beside it):
// the namespace, service account, Role and binding are made, the entry is
// written with the CA inline and checked; run again it rotates the token
// and repairs the Role; remove deletes exactly what add made.
func TestTargetAddToDirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clusters[0]
	admin := c.AdminKubeconfig()
	dir := t.TempDir()
	add := []string{"target", "add", "tadd", "--kubeconfig", admin, "--namespace", "tadd-ns", "--create-namespace",
		"--team", "main", "--tag", "fast", "--tag", "linux-big", "--out", dir}

	stdout, stderr, code := runCLI(t, ctx, add...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Regexp(t, `tadd\s+tadd-ns\s+`+c.Server+`\s+ok\s+-`, stdout)
	for _, line := range []string{"created namespace tadd-ns", "created service account tadd-ns/jetway-tadd",
		"created role tadd-ns/jetway-tadd", "created role binding tadd-ns/jetway-tadd", "created network policy tadd-ns/jetway-tadd",
		"created network policy tadd-ns/jetway-tadd-hermetic", "issued a token for service account tadd-ns/jetway-tadd"} {
		assert.Contains(t, stderr, line)
	}

	kubeconfig, err := os.ReadFile(filepath.Join(dir, "tadd", "kubeconfig"))
	require.NoError(t, err)
	kc, err := clientcmd.Load(kubeconfig)
	require.NoError(t, err)
	cl := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster]
	assert.Equal(t, c.Server, cl.Server)
	assert.Equal(t, c.CAData, cl.CertificateAuthorityData, "the CA is inline, not the admin's file")
	assert.Empty(t, cl.CertificateAuthority)
	assert.Equal(t, "tadd-ns", kc.Contexts[kc.CurrentContext].Namespace)
	token := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo].Token
	require.NotEmpty(t, token)
	assert.NotContains(t, stdout+stderr, token, "the token is only in the entry")
	var meta targets.Metadata
	require.NoError(t, yaml.UnmarshalStrict(readFile(t, filepath.Join(dir, "tadd", "target.yaml")), &meta))
	assert.Equal(t, targets.Metadata{Team: "main", Tags: []string{"fast", "linux-big"}}, meta)
	info, err := os.Stat(filepath.Join(dir, "tadd", "kubeconfig"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// The token is a bounded TokenRequest token: 30 days by default.
	assert.Regexp(t, `valid until `+time.Now().Add(provision.DefaultTokenDuration).UTC().Format("2006-01-02"), stderr)

	// What gateway run would read: the same check passes.
	stdout, stderr, code = runCLI(t, ctx, "check", dir)
	require.Equal(t, 0, code, "%s%s", stdout, stderr)

	// The Role is exactly the one list of permissions.
	role, err := c.Client.RbacV1().Roles("tadd-ns").Get(ctx, "jetway-tadd", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, targets.RBACRules(targets.Required), role.Rules)
	assert.Equal(t, "tadd", role.Labels[provision.AccessLabel])
	// The NetworkPolicy, as the API server took it: the default egress
	// rules keep step pods from the cloud metadata addresses.
	access := provision.Access{Target: "tadd", Namespace: "tadd-ns"}
	policy, err := c.Client.NetworkingV1().NetworkPolicies("tadd-ns").Get(ctx, "jetway-tadd", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, access.NetworkPolicy(provision.DefaultEgressDeny()).Spec, policy.Spec)
	hermetic, err := c.Client.NetworkingV1().NetworkPolicies("tadd-ns").Get(ctx, "jetway-tadd-hermetic", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, access.HermeticPolicy().Spec, hermetic.Spec, "the hermetic step pods' policy")
	assert.Equal(t, "tadd", hermetic.Labels[provision.AccessLabel])
	policy.Spec.Ingress = nil // someone opened it to every pod
	_, err = c.Client.NetworkingV1().NetworkPolicies("tadd-ns").Update(ctx, policy, metav1.UpdateOptions{})
	require.NoError(t, err)

	// Run again, with addresses of both families to deny: a new token, a
	// Role someone trimmed is whole again, the policy too, with the list.
	role.Rules = role.Rules[:1]
	_, err = c.Client.RbacV1().Roles("tadd-ns").Update(ctx, role, metav1.UpdateOptions{})
	require.NoError(t, err)
	deny := []string{"--egress-deny", "10.96.0.0/12", "--egress-deny", "10.244.7.9", "--egress-deny", "fd00:10:96::1/108"}
	stdout, stderr, code = runCLI(t, ctx, append(slices.Clone(add), deny...)...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stderr, "service account tadd-ns/jetway-tadd is up to date")
	assert.Contains(t, stderr, "updated role tadd-ns/jetway-tadd")
	assert.Contains(t, stderr, "updated network policy tadd-ns/jetway-tadd")
	assert.Contains(t, stderr, "network policy tadd-ns/jetway-tadd-hermetic is up to date")
	rotated, err := clientcmd.LoadFromFile(filepath.Join(dir, "tadd", "kubeconfig"))
	require.NoError(t, err)
	assert.NotEqual(t, token, rotated.AuthInfos[rotated.Contexts[rotated.CurrentContext].AuthInfo].Token)
	role, err = c.Client.RbacV1().Roles("tadd-ns").Get(ctx, "jetway-tadd", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, targets.RBACRules(targets.Required), role.Rules)
	policy, err = c.Client.NetworkingV1().NetworkPolicies("tadd-ns").Get(ctx, "jetway-tadd", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, access.NetworkPolicy(egressDeny(t, deny)).Spec, policy.Spec)
	require.NotEmpty(t, policy.Spec.Egress)
	assert.Equal(t, []string{"10.96.0.0/12", "10.244.7.9/32"}, policy.Spec.Egress[0].To[0].IPBlock.Except)
	assert.Equal(t, []string{"fd00:10:96::/108"}, policy.Spec.Egress[0].To[1].IPBlock.Except)

	// And with --egress-deny none: the ingress-only policy.
	stdout, stderr, code = runCLI(t, ctx, append(slices.Clone(add), "--egress-deny", "none")...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stderr, "updated network policy tadd-ns/jetway-tadd")
	policy, err = c.Client.NetworkingV1().NetworkPolicies("tadd-ns").Get(ctx, "jetway-tadd", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, access.NetworkPolicy(nil).Spec, policy.Spec)
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, policy.Spec.PolicyTypes)

	// Something else in the namespace, and a service account add did not
	// make under the name another target would use.
	_, err = c.Client.CoreV1().ConfigMaps("tadd-ns").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "keep"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Client.CoreV1().ServiceAccounts("tadd-ns").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "jetway-other"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	stdout, stderr, code = runCLI(t, ctx, "target", "add", "other", "--kubeconfig", admin, "--namespace", "tadd-ns", "--out", dir)
	assert.Equal(t, 1, code, "%s%s", stdout, stderr)
	assert.Contains(t, stderr, "service account tadd-ns/jetway-other exists and was not made by `gateway target add other`")
	assert.NoDirExists(t, filepath.Join(dir, "other"))
	stdout, stderr, code = runCLI(t, ctx, "target", "remove", "other", "--kubeconfig", admin, "--namespace", "tadd-ns")
	assert.Equal(t, 0, code, "%s%s", stdout, stderr)
	assert.Contains(t, stderr, "left alone service account tadd-ns/jetway-other")
	_, err = c.Client.CoreV1().ServiceAccounts("tadd-ns").Get(ctx, "jetway-other", metav1.GetOptions{})
	require.NoError(t, err, "remove deleted a service account add did not make")

	// Remove: the objects, the namespace add created, the entry.
	stdout, stderr, code = runCLI(t, ctx, "target", "remove", "tadd", "--kubeconfig", admin, "--namespace", "tadd-ns", "--out", dir)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, line := range []string{"deleted network policy tadd-ns/jetway-tadd", "deleted network policy tadd-ns/jetway-tadd-hermetic", "deleted role binding tadd-ns/jetway-tadd", "deleted role tadd-ns/jetway-tadd",
		"deleted service account tadd-ns/jetway-tadd", "deleted namespace tadd-ns"} {
		assert.Contains(t, stderr, line)
	}
	assert.NoDirExists(t, filepath.Join(dir, "tadd"))
	ns, err := c.Client.CoreV1().Namespaces().Get(ctx, "tadd-ns", metav1.GetOptions{})
	if err == nil {
		assert.NotNil(t, ns.DeletionTimestamp, "namespace tadd-ns is being deleted")
	} else {
		assert.True(t, apierrors.IsNotFound(err), "%v", err)
	}
}

// TestTargetRBACAppliesServerSide applies `target rbac` output as
// `kubectl apply --server-side` does, with the default egress list, a
// list of both families, every address denied, and none: the API server
// takes each policy as printed, and applying the next moves the policy
// between them (egress rules come and go).
func TestTargetRBACAppliesServerSide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusters[0]
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "trbac-ns"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	access, apply := provision.Access{Target: "trbac", Namespace: "trbac-ns"}, newApplier(c)
	for _, deny := range [][]string{
		nil, // the default
		{"--egress-deny", "10.1.2.3/16", "--egress-deny", "192.0.2.7", "--egress-deny", "fd00:ec2::254", "--egress-deny", "2001:db8::/32"},
		{"--egress-deny", "0.0.0.0/0", "--egress-deny", "::/0"},
		{"--egress-deny", "none"},
		nil,
	} {
		stdout, stderr, code := runCLI(t, ctx, append([]string{"target", "rbac", "--namespace", "trbac-ns", "--name", "trbac"}, deny...)...)
		require.Equal(t, 0, code, "%v: %s", deny, stderr)
		docs := strings.Split(stdout, "\n---\n")
		require.Len(t, docs, 5)
		for _, doc := range docs {
			var obj unstructured.Unstructured
			require.NoError(t, yaml.Unmarshal([]byte(doc), &obj.Object))
			live, err := apply.apply(ctx, "", &obj)
			require.NoError(t, err, "%v: %s", deny, obj.GetKind())
			assert.Empty(t, diffApplied(obj.GetKind(), obj.Object, live.Object), "%v: the server changed what was applied", deny)
		}
		want := provision.DefaultEgressDeny()
		if deny != nil {
			want = egressDeny(t, deny)
		}
		policy, err := c.Client.NetworkingV1().NetworkPolicies("trbac-ns").Get(ctx, "jetway-trbac", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, access.NetworkPolicy(want).Spec, policy.Spec, "%v", deny)
		hermetic, err := c.Client.NetworkingV1().NetworkPolicies("trbac-ns").Get(ctx, "jetway-trbac-hermetic", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, access.HermeticPolicy().Spec, hermetic.Spec, "%v", deny)
	}
}

// egressDeny parses the values of --egress-deny flags as the CLI does.
func egressDeny(t *testing.T, flags []string) []netip.Prefix {
	t.Helper()
	var values []string
	for i := 1; i < len(flags); i += 2 {
		values = append(values, flags[i])
	}
	deny, err := provision.ParseEgressDeny(values)
	require.NoError(t, err)
	return deny
}

// TestTargetAddSecret adds two targets as keys of one targets Secret, each
// applied server-side by its own field manager as the printed command
// says, with a long-lived token for one; removing one takes out its key
// only; a namespace add did not create stays.
func TestTargetAddSecret(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := clusters[1]
	admin := c.AdminKubeconfig()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tsec-jetway"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// tsec-ns exists before add; tsec2-ns does not.
	_, err = c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tsec-ns"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	stdout, stderr, code := runCLI(t, ctx, "target", "add", "tsec", "--kubeconfig", admin, "--namespace", "tsec-ns",
		"--team", "blue", "--long-lived-token", "--secret", "--secret-namespace", "tsec-jetway")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Regexp(t, `tsec\s+tsec-ns\s+\S+\s+ok`, stderr, "the check goes to stderr, the manifest alone to stdout")
	assert.Contains(t, stdout, "kubectl apply --server-side --field-manager jetway-target-tsec -f -")
	applySecret(t, ctx, c, "jetway-target-tsec", stdout)
	token, err := c.Client.CoreV1().Secrets("tsec-ns").Get(ctx, "jetway-tsec-token", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.SecretTypeServiceAccountToken, token.Type)

	stdout, stderr, code = runCLI(t, ctx, "target", "add", "tsec2", "--kubeconfig", admin, "--namespace", "tsec2-ns",
		"--create-namespace", "--tag", "gpu", "--secret", "--secret-namespace", "tsec-jetway")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	applySecret(t, ctx, c, "jetway-target-tsec2", stdout)

	// The Secret, mounted as the targets dir, holds both targets, their
	// metadata inside the kubeconfigs.
	secret, err := c.Client.CoreV1().Secrets("tsec-jetway").Get(ctx, "jetway-targets", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, secret.Data, 2)
	dir := t.TempDir()
	for key, value := range secret.Data {
		writeFile(t, filepath.Join(dir, key), value)
	}
	results, _, err := targets.NewSource(targets.SourceOptions{Dir: dir}, nil).Read()
	require.NoError(t, err)
	require.NoError(t, results["tsec"].Err)
	require.NoError(t, results["tsec2"].Err)
	assert.Equal(t, "blue", results["tsec"].Config.Meta.Team)
	assert.Equal(t, []string{"gpu"}, results["tsec2"].Config.Meta.Tags)
	stdout, stderr, code = runCLI(t, ctx, "check", dir)
	require.Equal(t, 0, code, "%s%s", stdout, stderr)

	// Remove tsec: its objects and its key go; its namespace, made before,
	// and tsec2's key stay.
	stdout, stderr, code = runCLI(t, ctx, "target", "remove", "tsec", "--kubeconfig", admin, "--namespace", "tsec-ns",
		"--secret", "--secret-namespace", "tsec-jetway")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stderr, "deleted token secret tsec-ns/jetway-tsec-token")
	assert.NotContains(t, stderr, "namespace tsec-ns")
	applySecret(t, ctx, c, "jetway-target-tsec", stdout)
	secret, err = c.Client.CoreV1().Secrets("tsec-jetway").Get(ctx, "jetway-targets", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"tsec2.kubeconfig"}, keys(secret.Data))
	_, err = c.Client.CoreV1().Namespaces().Get(ctx, "tsec-ns", metav1.GetOptions{})
	require.NoError(t, err, "remove deleted a namespace add did not create")
	for _, name := range []string{"jetway-tsec", "jetway-tsec-token"} {
		_, err = c.Client.CoreV1().ServiceAccounts("tsec-ns").Get(ctx, name, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "%s: %v", name, err)
	}
}

// applySecret applies a printed manifest server-side, as `kubectl apply
// --server-side --field-manager manager -f -` does.
func applySecret(t *testing.T, ctx context.Context, c *cluster.Cluster, manager, manifest string) {
	t.Helper()
	var s corev1.Secret
	require.NoError(t, yaml.UnmarshalStrict([]byte(manifest), &s))
	body, err := yaml.YAMLToJSON([]byte(manifest))
	require.NoError(t, err)
	_, err = c.Client.CoreV1().Secrets(s.Namespace).Patch(ctx, s.Name, apitypes.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: manager})
	require.NoError(t, err)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
