package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/internal/provision"
	"github.com/jetway-ci/jetway/targets"
)

// TestTargetBadArgumentsTouchNothing: a bad command line is refused with
// status 2 and a message naming what is wrong, before any cluster is read
// (the admin kubeconfig here does not even exist).
func TestTargetBadArgumentsTouchNothing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no name", []string{"add", "--namespace", "ci", "--out", "d"}, "exactly one argument, the target's name"},
		{"no namespace", []string{"add", "x", "--out", "d"}, "--namespace is required"},
		{"no output", []string{"add", "x", "--namespace", "ci"}, "--out DIR or --secret"},
		{"both outputs", []string{"add", "x", "--namespace", "ci", "--out", "d", "--secret"}, "--out and --secret exclude each other"},
		{"both tokens", []string{"add", "x", "--namespace", "ci", "--out", "d", "--long-lived-token", "--token-duration", "1h"}, "--token-duration and --long-lived-token exclude each other"},
		{"bad name", []string{"add", "Prod_1", "--namespace", "ci", "--out", "d"}, `target name "Prod_1"`},
		{"name too long", []string{"add", "a23456789012345678901234567890123456789012345678901234567", "--namespace", "ci", "--out", "d"}, "too long for its objects (jetway-a2345"},
		{"bad namespace", []string{"add", "x", "--namespace", "CI", "--out", "d"}, `namespace "CI"`},
		{"repeated tag", []string{"add", "x", "--namespace", "ci", "--out", "d", "--tag", "a", "--tag", "a"}, `tags[1] "a" is repeated`},
		{"empty tag", []string{"add", "x", "--namespace", "ci", "--out", "d", "--tag", " "}, "tags[0] is empty"},
		{"remove without namespace", []string{"remove", "x"}, "--namespace is required"},
		{"rbac without namespace", []string{"rbac"}, "--namespace is required"},
		{"bad egress deny", []string{"add", "x", "--namespace", "ci", "--out", "d", "--egress-deny", "10.0.0.0/8", "--egress-deny", "metadata"},
			`--egress-deny "metadata": neither a CIDR nor an IP address`},
		{"egress deny none and more", []string{"add", "x", "--namespace", "ci", "--out", "d", "--egress-deny", "none", "--egress-deny", "10.0.0.0/8"},
			"--egress-deny none drops every egress rule; it cannot be combined"},
		{"rbac bad egress deny", []string{"rbac", "--namespace", "ci", "--egress-deny", "10.0.0.0/40"}, `--egress-deny "10.0.0.0/40"`},
		{"unknown subcommand", []string{"ad", "x"}, `unknown command "ad"; see gateway target --help`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"target"}, tt.args...)
			if tt.args[0] == "add" || tt.args[0] == "remove" {
				args = append(args, "--kubeconfig", missing)
			}
			code := execute(args, &stdout, &stderr)
			assert.Equal(t, exitUsage, code, stderr.String())
			assert.Contains(t, stderr.String(), tt.want)
			assert.Empty(t, stdout.String())
		})
	}
	// A kubeconfig that is not there is named; nothing was written.
	var stdout, stderr bytes.Buffer
	out := t.TempDir()
	code := execute([]string{"target", "add", "x", "--namespace", "ci", "--out", out, "--kubeconfig", missing}, &stdout, &stderr)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr.String(), "admin kubeconfig")
	assert.Contains(t, stderr.String(), missing)
	entries, err := os.ReadDir(out)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// TestTargetRBACIsTheRequiredList: the printed Role grants exactly the
// permissions the health check reviews, bound to the service account.
func TestTargetRBACIsTheRequiredList(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, execute([]string{"target", "rbac", "--namespace", "ci", "--name", "prod"}, &stdout, &stderr), stderr.String())
	docs := bytes.Split(stdout.Bytes(), []byte("\n---\n"))
	require.Len(t, docs, 5)
	var role rbacv1.Role
	require.NoError(t, yaml.UnmarshalStrict(docs[1], &role))
	assert.Equal(t, "Role", role.Kind)
	assert.Equal(t, "ci", role.Namespace)
	assert.Equal(t, "jetway-prod", role.Name)
	assert.Equal(t, targets.RBACRules(targets.Required), role.Rules)
	var binding rbacv1.RoleBinding
	require.NoError(t, yaml.UnmarshalStrict(docs[2], &binding))
	assert.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "jetway-prod"}, binding.RoleRef)
	assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "jetway-prod", Namespace: "ci"}}, binding.Subjects)
	assert.NotContains(t, stdout.String(), "creationTimestamp")
	var policy networkingv1.NetworkPolicy
	require.NoError(t, yaml.UnmarshalStrict(docs[3], &policy))
	steps := metav1.LabelSelector{MatchLabels: map[string]string{"org.concourse-ci.worker": "prod"}}
	assert.Equal(t, "jetway-prod", policy.Name)
	assert.Equal(t, metav1.LabelSelector{MatchLabels: steps.MatchLabels, MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: targets.HermeticLabel, Operator: metav1.LabelSelectorOpDoesNotExist}}}, policy.Spec.PodSelector, "the target's step pods but the hermetic ones")
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, policy.Spec.PolicyTypes)
	require.Len(t, policy.Spec.Ingress, 2)
	assert.Equal(t, []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, policy.Spec.Ingress[0].From, "from the target's own step pods")
	require.Len(t, policy.Spec.Ingress[0].Ports, 1)
	assert.Equal(t, "7788", policy.Spec.Ingress[0].Ports[0].Port.String(), "to their volume sidecars alone")
	assert.Empty(t, policy.Spec.Ingress[1].From, "from anywhere (the nodes' container runtimes)...")
	require.Len(t, policy.Spec.Ingress[1].Ports, 1)
	assert.Equal(t, "7789", policy.Spec.Ingress[1].Ports[0].Port.String(), "...to the holder's images alone")
	// Out: anywhere but the cloud metadata addresses, by default.
	assert.Equal(t, provision.Access{Target: "prod", Namespace: "ci"}.NetworkPolicy(provision.DefaultEgressDeny()).Spec, policy.Spec)
	require.NotEmpty(t, policy.Spec.Egress)
	assert.Equal(t, []networkingv1.NetworkPolicyPeer{
		{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"169.254.169.254/32"}}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: []string{"fd00:ec2::254/128"}}},
	}, policy.Spec.Egress[0].To)
	// The hermetic step pods': nothing but the sidecars of the target's
	// own step pods, in and out.
	var hermetic networkingv1.NetworkPolicy
	require.NoError(t, yaml.UnmarshalStrict(docs[4], &hermetic))
	assert.Equal(t, "jetway-prod-hermetic", hermetic.Name)
	assert.Equal(t, provision.Access{Target: "prod", Namespace: "ci"}.HermeticPolicy().Spec, hermetic.Spec)
}

// TestTargetRBACEgressDeny: --egress-deny replaces the default list and
// --egress-deny none prints the ingress-only policy.
func TestTargetRBACEgressDeny(t *testing.T) {
	policyOf := func(args ...string) networkingv1.NetworkPolicy {
		t.Helper()
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, execute(append([]string{"target", "rbac", "--namespace", "ci", "--name", "prod"}, args...), &stdout, &stderr), stderr.String())
		docs := bytes.Split(stdout.Bytes(), []byte("\n---\n"))
		require.Len(t, docs, 5)
		var policy networkingv1.NetworkPolicy
		require.NoError(t, yaml.UnmarshalStrict(docs[3], &policy))
		return policy
	}
	policy := policyOf("--egress-deny", "10.1.2.3/16", "--egress-deny", "fd00:10::1")
	require.NotEmpty(t, policy.Spec.Egress)
	assert.Equal(t, []networkingv1.NetworkPolicyPeer{
		{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.1.0.0/16"}}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: []string{"fd00:10::1/128"}}},
	}, policy.Spec.Egress[0].To, "the given list alone, masked")

	policy = policyOf("--egress-deny", "none")
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, policy.Spec.PolicyTypes, "their traffic out is theirs")
	assert.Empty(t, policy.Spec.Egress)
	require.Len(t, policy.Spec.Ingress, 2, "the ingress rules stay")
}

// TestTargetHelpNamesTheFlags: --help of add and rbac shows --egress-deny
// with its default list, and value names are words, not sentences that
// pflag took from back-quoted usage text.
func TestTargetHelpNamesTheFlags(t *testing.T) {
	for _, sub := range []string{"add", "rbac"} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, execute([]string{"target", sub, "--help"}, &stdout, &stderr), stderr.String())
		help := stdout.String()
		assert.Regexp(t, `--egress-deny CIDR +CIDR or IP address`, help, sub)
		assert.Contains(t, help, "(default [169.254.169.254/32,fd00:ec2::254/128])", sub)
		assert.Contains(t, help, "none: no egress rules", sub)
		for _, line := range strings.Split(help, "\n") {
			if flag, _, ok := strings.Cut(strings.TrimSpace(line), "  "); ok && strings.HasPrefix(flag, "--") {
				assert.LessOrEqual(t, len(strings.Fields(flag)), 2, "%s: a value name of more than one word: %s", sub, line)
			}
		}
	}
}
