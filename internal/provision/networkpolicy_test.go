package provision

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestParseEgressDeny: CIDRs and bare addresses of both families are
// taken, masked as the API server wants them, once each; none alone is no
// list; every bad value is named with the flag.
func TestParseEgressDeny(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   []string
		errs   []string
	}{
		{"cidrs", []string{"10.96.0.0/12", "fd00:10::/64"}, []string{"10.96.0.0/12", "fd00:10::/64"}, nil},
		{"bare addresses", []string{"10.0.0.5", "fd00:ec2::254"}, []string{"10.0.0.5/32", "fd00:ec2::254/128"}, nil},
		{"masked", []string{"10.1.2.3/8", "fd00:1:2:3::1/32"}, []string{"10.0.0.0/8", "fd00:1::/32"}, nil},
		{"repeats dropped", []string{"169.254.169.254", "169.254.169.254/32", "10.0.0.0/8", "10.9.9.9/8"},
			[]string{"169.254.169.254/32", "10.0.0.0/8"}, nil},
		{"none", []string{"none"}, nil, nil},
		{"nothing", nil, nil, nil},
		{"none with addresses", []string{"none", "10.0.0.0/8"}, nil, []string{"--egress-deny none drops every egress rule"}},
		{"bad values", []string{"10.0.0.300", "10.0.0.0/33", "", " 10.0.0.1", "fe80::1%eth0", "10.0.0.0/8"}, nil, []string{
			`--egress-deny "10.0.0.300": neither a CIDR nor an IP address`,
			`--egress-deny "10.0.0.0/33": neither`,
			`--egress-deny "": neither`,
			`--egress-deny " 10.0.0.1": neither`,
			`--egress-deny "fe80::1%eth0": neither`,
		}},
		{"mapped", []string{"::ffff:10.0.0.1"}, nil, []string{`--egress-deny "::ffff:10.0.0.1": an IPv4-mapped IPv6 address: write it as IPv4`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEgressDeny(tt.values)
			if tt.errs != nil {
				require.Error(t, err)
				for _, e := range tt.errs {
					assert.Contains(t, err.Error(), e)
				}
				return
			}
			require.NoError(t, err)
			var strs []string
			for _, p := range got {
				strs = append(strs, p.String())
			}
			assert.Equal(t, tt.want, strs)
		})
	}
	def, err := ParseEgressDeny([]string{"169.254.169.254/32", "fd00:ec2::254/128"})
	require.NoError(t, err)
	assert.Equal(t, DefaultEgressDeny(), def, "the default, as the flag prints it, reads back as itself")
}

// TestNetworkPolicyEgress: with addresses to deny, the policy keeps its
// ingress rule and gains egress rules: anywhere of both families but the
// denied addresses, DNS to any pod, the sidecars of the target's own step
// pods; without, it is the ingress-only policy of before.
func TestNetworkPolicyEgress(t *testing.T) {
	steps := metav1.LabelSelector{MatchLabels: map[string]string{"org.concourse-ci.worker": "prod"}}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	block := func(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
	}
	dnsAndSteps := []networkingv1.NetworkPolicyEgressRule{
		{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}, Ports: append(ports(udp, 53), ports(tcp, 53)...)},
		{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: ports(tcp, 7788)},
	}
	tests := []struct {
		name   string
		deny   []string
		egress []networkingv1.NetworkPolicyEgressRule // nil: no Egress policy type
	}{
		{"default", []string{"169.254.169.254/32", "fd00:ec2::254/128"}, append([]networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{block("0.0.0.0/0", "169.254.169.254/32"), block("::/0", "fd00:ec2::254/128")}},
		}, dnsAndSteps...)},
		{"one family denied, the other open", []string{"10.0.0.0/8", "192.168.0.0/16"}, append([]networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{block("0.0.0.0/0", "10.0.0.0/8", "192.168.0.0/16"), block("::/0")}},
		}, dnsAndSteps...)},
		{"all of IPv6", []string{"::/0", "10.0.0.0/8"}, append([]networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{block("0.0.0.0/0", "10.0.0.0/8")}},
		}, dnsAndSteps...)},
		{"all of both: only DNS and the step pods", []string{"0.0.0.0/0", "::/0"}, dnsAndSteps},
		{"none", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deny, err := ParseEgressDeny(tt.deny)
			require.NoError(t, err)
			p := Access{Target: "prod", Namespace: "ci"}.NetworkPolicy(deny)
			assert.Equal(t, metav1.LabelSelector{MatchLabels: steps.MatchLabels, MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "jetway-ci.dev/hermetic", Operator: metav1.LabelSelectorOpDoesNotExist}}}, p.Spec.PodSelector, "all but the hermetic ones")
			assert.Equal(t, []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: ports(tcp, 7788)},
				{Ports: ports(tcp, 7789)}, // the holder's images, pulled by the nodes
			}, p.Spec.Ingress, "the ingress rules are the same either way")
			types := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if tt.egress != nil {
				types = append(types, networkingv1.PolicyTypeEgress)
			}
			assert.Equal(t, types, p.Spec.PolicyTypes)
			assert.Equal(t, tt.egress, p.Spec.Egress)
		})
	}
}

// TestNetworkPolicyWithoutTarget: printed without a target name, the
// policy selects every step pod, in both directions.
func TestNetworkPolicyWithoutTarget(t *testing.T) {
	p := Access{Namespace: "ci"}.NetworkPolicy(DefaultEgressDeny())
	every := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "org.concourse-ci.worker", Operator: metav1.LabelSelectorOpExists}}}
	assert.Equal(t, metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{every.MatchExpressions[0],
		{Key: "jetway-ci.dev/hermetic", Operator: metav1.LabelSelectorOpDoesNotExist}}}, p.Spec.PodSelector)
	assert.Equal(t, &every, p.Spec.Ingress[0].From[0].PodSelector)
	require.Len(t, p.Spec.Egress, 3)
	assert.Equal(t, &every, p.Spec.Egress[2].To[0].PodSelector)
	assert.Equal(t, "jetway", p.Name)

	h := Access{Namespace: "ci"}.HermeticPolicy()
	assert.Equal(t, metav1.LabelSelector{MatchLabels: map[string]string{"jetway-ci.dev/hermetic": "true"}, MatchExpressions: every.MatchExpressions},
		h.Spec.PodSelector)
	assert.Equal(t, &every, h.Spec.Egress[0].To[0].PodSelector)
	assert.Equal(t, "jetway-hermetic", h.Name)
}

// TestHermeticPolicy: the target's hermetic step pods (and only they) are
// let in and out only through the sidecars' port of the target's own step
// pods: no DNS, nothing else, whatever --egress-deny says.
func TestHermeticPolicy(t *testing.T) {
	steps := metav1.LabelSelector{MatchLabels: map[string]string{"org.concourse-ci.worker": "prod"}}
	tcp := corev1.ProtocolTCP
	p := Access{Target: "prod", Namespace: "ci"}.HermeticPolicy()
	assert.Equal(t, "jetway-prod-hermetic", p.Name)
	assert.Equal(t, map[string]string{"app.kubernetes.io/managed-by": "jetway", "jetway-ci.dev/access-for": "prod"}, p.Labels)
	assert.Equal(t, metav1.LabelSelector{MatchLabels: map[string]string{"org.concourse-ci.worker": "prod", "jetway-ci.dev/hermetic": "true"}},
		p.Spec.PodSelector)
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, p.Spec.PolicyTypes)
	assert.Equal(t, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: ports(tcp, 7788)}},
		p.Spec.Ingress)
	assert.Equal(t, []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: ports(tcp, 7788)}},
		p.Spec.Egress)
	assert.NotContains(t, steps.MatchLabels, "jetway-ci.dev/hermetic", "the selector of its peers is not changed")
}
