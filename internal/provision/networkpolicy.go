package provision

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/jetway-ci/jetway/internal/ownership"
	"github.com/jetway-ci/jetway/stepagent"
	"github.com/jetway-ci/jetway/targets"
)

// EgressDenyNone is the --egress-deny value that asks for no egress rules.
const EgressDenyNone = "none"

// DefaultEgressDeny are the addresses step pods may not reach unless the
// operator says otherwise: the cloud metadata services, which hand any pod
// on a node the node's cloud credentials (169.254.169.254 on AWS, GCP,
// Azure and others; fd00:ec2::254 is AWS's over IPv6).
func DefaultEgressDeny() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32"), netip.MustParsePrefix("fd00:ec2::254/128")}
}

// ParseEgressDeny reads the values of --egress-deny: each a CIDR or a bare
// IP address (one address: /32 or /128), or EgressDenyNone alone for no
// egress rules (nil). CIDRs are masked (10.1.2.3/8 is 10.0.0.0/8), as the
// API server wants an ipBlock's except entries; repeats are dropped. Every
// bad value is named.
func ParseEgressDeny(values []string) ([]netip.Prefix, error) {
	if slices.Contains(values, EgressDenyNone) {
		if len(values) > 1 {
			return nil, fmt.Errorf("--egress-deny %s drops every egress rule; it cannot be combined with addresses to deny", EgressDenyNone)
		}
		return nil, nil
	}
	var (
		deny []netip.Prefix
		errs []error
	)
	for _, v := range values {
		p, err := parseDeny(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("--egress-deny %q: %w", v, err))
			continue
		}
		if !slices.Contains(deny, p) {
			deny = append(deny, p)
		}
	}
	return deny, errors.Join(errs...)
}

func parseDeny(v string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(v)
	if err != nil {
		addr, addrErr := netip.ParseAddr(v)
		if addrErr != nil || addr.Zone() != "" {
			return netip.Prefix{}, errors.New("neither a CIDR nor an IP address")
		}
		p = netip.PrefixFrom(addr, addr.BitLen())
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, errors.New("an IPv4-mapped IPv6 address: write it as IPv4")
	}
	return p.Masked(), nil
}

// NetworkPolicy is the policy around the target's step pods but the
// hermetic ones (HermeticPolicy's).
//
// Ingress: only their volume sidecars' port, from the target's own step
// pods (a volume streamed straight from one pod to another within the
// target), and the volume holder's image port from anywhere: the nodes'
// container runtimes pull a rootfs the holder serves as an image through
// its NodePort, and a node other than the holder's reaches it from its
// own address, which a policy cannot name (plugins let a pod's own node
// in, not the others; the holder answers a pull only with a ticket for
// that volume). The
// gateway reaches them through the API server's port-forward, which
// policies do not see.
//
// Egress, unless egressDeny is empty: anywhere, IPv4 and IPv6, except
// egressDeny (the whole of a family when it holds that family's /0); and,
// whatever egressDeny says, DNS to any pod and the sidecars' port of the
// target's own step pods. Those two are rules of their own because some
// plugins (Cilium) match ipBlocks only against addresses outside the
// cluster: there, in-cluster destinations are reached through them alone.
// With egressDeny empty a step's traffic out is left alone.
//
// It takes effect only where the cluster's network plugin enforces
// NetworkPolicies.
func (a Access) NetworkPolicy(egressDeny []netip.Prefix) *networkingv1.NetworkPolicy {
	steps := a.stepPods()
	selected := *steps.DeepCopy()
	selected.MatchExpressions = append(selected.MatchExpressions,
		metav1.LabelSelectorRequirement{Key: targets.HermeticLabel, Operator: metav1.LabelSelectorOpDoesNotExist})
	sidecar := ports(corev1.ProtocolTCP, stepagent.VolumePort)
	spec := networkingv1.NetworkPolicySpec{
		PodSelector: selected,
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{
			{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: sidecar},
			{Ports: ports(corev1.ProtocolTCP, stepagent.ImagePort)},
		},
	}
	if len(egressDeny) > 0 {
		spec.PolicyTypes = append(spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		if anywhere := anywhereExcept(egressDeny); len(anywhere) > 0 {
			spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: anywhere})
		}
		dns := append(ports(corev1.ProtocolUDP, 53), ports(corev1.ProtocolTCP, 53)...)
		spec.Egress = append(spec.Egress,
			networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}, Ports: dns},
			networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: sidecar})
	}
	return &networkingv1.NetworkPolicy{TypeMeta: metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: a.meta(), Spec: spec}
}

// HermeticPolicy is the policy around the target's hermetic step pods
// (targets.HermeticLabel: Concourse's `hermetic: true` steps), which
// NetworkPolicy leaves out: in, as into any step pod, only the sidecars'
// port from the target's own step pods; out, only that port of the
// target's own step pods (the volumes it is given and gives), whatever
// --egress-deny says. No DNS, nothing beyond the target's pods: a stock
// worker drops all of a hermetic container's traffic but its own.
//
// It takes effect only where the cluster's network plugin enforces
// NetworkPolicies.
func (a Access) HermeticPolicy() *networkingv1.NetworkPolicy {
	steps := a.stepPods()
	hermetic := *steps.DeepCopy()
	if hermetic.MatchLabels == nil {
		hermetic.MatchLabels = map[string]string{}
	}
	hermetic.MatchLabels[targets.HermeticLabel] = "true"
	sidecar := ports(corev1.ProtocolTCP, stepagent.VolumePort)
	meta := a.meta()
	meta.Name = a.HermeticPolicyName()
	return &networkingv1.NetworkPolicy{TypeMeta: metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: meta, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: hermetic,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: sidecar}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &steps}}, Ports: sidecar}},
		}}
}

// NetworkPolicies are the target's two policies, as `target add` makes
// them and `target rbac` prints them: NetworkPolicy(egressDeny) and
// HermeticPolicy.
func (a Access) NetworkPolicies(egressDeny []netip.Prefix) []*networkingv1.NetworkPolicy {
	return []*networkingv1.NetworkPolicy{a.NetworkPolicy(egressDeny), a.HermeticPolicy()}
}

// HermeticPolicyName is HermeticPolicy's name: jetway-TARGET-hermetic.
func (a Access) HermeticPolicyName() string { return a.AccountName() + "-hermetic" }

// stepPods selects the target's pods (every target's, for printed RBAC
// that names no target).
func (a Access) stepPods() metav1.LabelSelector {
	if a.Target == "" {
		return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: ownership.WorkerLabel, Operator: metav1.LabelSelectorOpExists}}}
	}
	return metav1.LabelSelector{MatchLabels: map[string]string{ownership.WorkerLabel: a.Target}}
}

// anywhereExcept is one ipBlock per address family, the whole family
// except deny's prefixes of it; a family deny holds a /0 of gets none (an
// ipBlock's except must be narrower than its cidr).
func anywhereExcept(deny []netip.Prefix) []networkingv1.NetworkPolicyPeer {
	var peers []networkingv1.NetworkPolicyPeer
	for _, family := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		block := &networkingv1.IPBlock{CIDR: family.String()}
		for _, p := range deny {
			if p.Addr().Is4() == family.Addr().Is4() {
				block.Except = append(block.Except, p.String())
			}
		}
		if !slices.Contains(block.Except, family.String()) {
			peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: block})
		}
	}
	return peers
}

func ports(protocol corev1.Protocol, port int32) []networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(port)
	return []networkingv1.NetworkPolicyPort{{Protocol: &protocol, Port: &p}}
}
