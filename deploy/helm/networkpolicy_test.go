package helm_test

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestNetworkPolicy: over the REST API the chart's NetworkPolicy selects
// exactly the Deployment's pods, for ingress alone. Every port the pods
// declare (the API, the mesh when on) is open to anyone; every other TCP
// port, the workers' listeners among them, only to the web node: an
// ipBlock for each network the gateway's own loader reads from the
// rendered flags (a bare IP as /32 or /128, every CIDR a network address)
// and the peers given.
func TestNetworkPolicy(t *testing.T) {
	tcp := corev1.ProtocolTCP
	webPods := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "concourse"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/component": "web"}},
	}
	block := func(cidr string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}
	}
	sets := ciValues(t)
	for name, tc := range map[string]struct {
		values map[string]any
		open   []string
		from   []networkingv1.NetworkPolicyPeer
		notes  string
	}{
		"ci/concourse-rest-values.yaml": {values: sets["concourse-rest-values.yaml"], open: []string{"http", "mesh"},
			from:  []networkingv1.NetworkPolicyPeer{block("10.42.0.0/16"), block("192.168.7.1/32"), block("fd00:42::7/128"), webPods},
			notes: "admits to these pods the API port and the mesh port from anywhere and every other TCP port only from the web node (concourse.webNodeNetworks, concourse.webNodePeers)"},
		"without the mesh, IPv6 first, no peers": {values: map[string]any{
			"auth": map[string]any{"noAuth": true}, "mesh": map[string]any{"enabled": false},
			"concourse": map[string]any{"url": "https://ci.example.com", "clientId": "jetway",
				"clientSecret":    map[string]any{"existingSecret": "jetway-concourse-client"},
				"webNodeNetworks": []any{"fd00:42::/64", "10.0.0.7", "0.0.0.0/0"}},
		}, open: []string{"http"},
			from:  []networkingv1.NetworkPolicyPeer{block("fd00:42::/64"), block("10.0.0.7/32"), block("0.0.0.0/0")},
			notes: "admits to these pods the API port from anywhere and every other TCP port only from the web node (concourse.webNodeNetworks);"},
	} {
		t.Run(name, func(t *testing.T) {
			o, r := render(t, tc.values)
			assert.Contains(t, r.Notes, "The NetworkPolicy "+fullname+" "+tc.notes)
			d, c := deployment(t, o, fullname)
			np := get[networkingv1.NetworkPolicy](t, o, "NetworkPolicy", fullname)
			assertSelectsPods(t, np.Spec.PodSelector, d.Spec.Selector, d.Spec.Template.Labels)
			assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, np.Spec.PolicyTypes)
			assert.Empty(t, np.Spec.Egress)

			require.Len(t, np.Spec.Ingress, 2)
			anyone, web := np.Spec.Ingress[0], np.Spec.Ingress[1]
			assert.Empty(t, anyone.From, "the API and the mesh are open to anyone")
			var open []networkingv1.NetworkPolicyPort
			for _, p := range tc.open {
				port := intstr.FromString(p)
				open = append(open, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &port})
			}
			assert.Equal(t, open, anyone.Ports)
			assert.ElementsMatch(t, tc.open, portNames(c.Ports), "every port the pod declares is open, and no other")
			for _, k := range o.keys() {
				if svc, ok := strings.CutPrefix(k, "Service/"); ok {
					for _, sp := range get[corev1.Service](t, o, "Service", svc).Spec.Ports {
						assert.Contains(t, tc.open, sp.TargetPort.String(), "%s targets a port the policy closes", k)
					}
				}
			}

			assert.Equal(t, []networkingv1.NetworkPolicyPort{{Protocol: &tcp}}, web.Ports, "every TCP port: the kernel picks the listeners'")
			assert.Equal(t, tc.from, web.From)
			assertBlocksAreTheGateways(t, o, d.Spec.Template.Spec, c, web.From)
		})
	}
}

// assertSelectsPods checks that a NetworkPolicy's pod selector is the
// Deployment's own and matches the pods it makes.
func assertSelectsPods(t *testing.T, sel metav1.LabelSelector, deployment *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	assert.Equal(t, *deployment, sel)
	s, err := metav1.LabelSelectorAsSelector(&sel)
	require.NoError(t, err)
	assert.False(t, s.Empty(), "a policy selecting every pod of the namespace")
	assert.True(t, s.Matches(labels.Set(podLabels)))
}

// assertBlocksAreTheGateways checks the ipBlocks among from against the
// networks the gateway reads from its rendered flags: the same networks,
// each written as a network address (what the API server takes, and what
// no plugin can read otherwise).
func assertBlocksAreTheGateways(t *testing.T, o objects, pod corev1.PodSpec, c *corev1.Container, from []networkingv1.NetworkPolicyPeer) {
	t.Helper()
	args, _ := layOut(t, o, pod, c, t.TempDir())
	setEnv(t, *c)
	nets, err := loadConfig(t, args).WebNodeNetworks()
	require.NoError(t, err)
	var blocks []netip.Prefix
	for _, p := range from {
		if p.IPBlock == nil {
			continue
		}
		assert.Empty(t, p.IPBlock.Except)
		b, err := netip.ParsePrefix(p.IPBlock.CIDR)
		require.NoError(t, err)
		assert.Equal(t, b.Masked(), b, "%s is no network address", p.IPBlock.CIDR)
		blocks = append(blocks, b)
	}
	assert.Equal(t, nets, blocks)
}

func portNames(ports []corev1.ContainerPort) []string {
	var out []string
	for _, p := range ports {
		out = append(out, p.Name)
	}
	return out
}

// TestNetworkPolicyOnlyOverREST: no value set but the REST API's makes a
// NetworkPolicy (through the TSA the web node calls over the
// registration's own SSH connection, and nothing else listens); nor does
// the REST API with concourse.networkPolicy.enabled false, whose notes
// say what a policy of the operator's must do.
func TestNetworkPolicyOnlyOverREST(t *testing.T) {
	for name, vals := range ciValues(t) {
		t.Run(name, func(t *testing.T) {
			o, _ := render(t, vals)
			policies := slices.DeleteFunc(o.keys(), func(k string) bool { return o[k].GetKind() != "NetworkPolicy" })
			if name == "concourse-rest-values.yaml" {
				assert.Equal(t, []string{"NetworkPolicy/" + fullname}, policies)
			} else {
				assert.Empty(t, policies)
			}
		})
	}
	t.Run("disabled", func(t *testing.T) {
		vals := maps.Clone(ciValues(t)["concourse-rest-values.yaml"])
		cc := maps.Clone(vals["concourse"].(map[string]any))
		cc["networkPolicy"] = map[string]any{"enabled": false}
		vals["concourse"] = cc
		o, r := render(t, vals)
		for _, k := range o.keys() {
			assert.NotEqual(t, "NetworkPolicy", o[k].GetKind(), k)
		}
		assert.Contains(t, r.Notes, "concourse.networkPolicy.enabled is false: no NetworkPolicy of the chart's keeps others from the workers' listeners; where one of yours selects these pods, it must admit the web node on every TCP port.")
	})
}
