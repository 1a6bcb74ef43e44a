package helm_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// TestStateNamespace: the gateway's pods mount their service account token
// (the gateway reaches its state namespace with it), and a Role in the
// state namespace grants that ServiceAccount the state permissions, no
// more; state.namespace moves both and passes the flag.
func TestStateNamespace(t *testing.T) {
	noAuth := map[string]any{"noAuth": true}
	for _, tc := range []struct {
		name   string
		values map[string]any
		// stateNamespace is where the Role is; "" when there is none.
		stateNamespace, role, subject string
		// flag is --state-namespace's value; "" when not given.
		flag string
	}{
		{name: "release namespace", values: map[string]any{},
			stateNamespace: namespace, role: fullname, subject: fullname},
		{name: "another namespace", values: map[string]any{"state": map[string]any{"namespace": "jetway-state"}},
			stateNamespace: "jetway-state", role: namespace + "-" + fullname, subject: fullname, flag: "jetway-state"},
		{name: "the release namespace named", values: map[string]any{"state": map[string]any{"namespace": namespace}},
			stateNamespace: namespace, role: fullname, subject: fullname, flag: namespace},
		{name: "a ServiceAccount of the operator's", values: map[string]any{"serviceAccount": map[string]any{"create": false, "name": "gateways"}},
			stateNamespace: namespace, role: fullname, subject: "gateways"},
		{name: "the default ServiceAccount", values: map[string]any{"serviceAccount": map[string]any{"create": false}},
			stateNamespace: namespace, role: fullname, subject: "default"},
		{name: "no RBAC", values: map[string]any{"state": map[string]any{"rbac": map[string]any{"create": false}}},
			subject: fullname},
		{name: "no RBAC, another namespace", values: map[string]any{"state": map[string]any{"namespace": "jetway-state", "rbac": map[string]any{"create": false}}},
			subject: fullname, flag: "jetway-state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.values["auth"] = noAuth
			o, r := render(t, tc.values)
			d, c := deployment(t, o, fullname)
			pod := d.Spec.Template.Spec
			assert.Equal(t, tc.subject, pod.ServiceAccountName)
			require.NotNil(t, pod.AutomountServiceAccountToken)
			assert.True(t, *pod.AutomountServiceAccountToken, "the gateway reaches its state namespace with the pod's token")
			assertMeshInit(t, pod, fullname+"-mesh-ca")
			if tc.flag == "" {
				assert.NotContains(t, flags(t, c.Args), "state-namespace")
			} else {
				assert.Equal(t, tc.flag, flags(t, c.Args)["state-namespace"])
			}
			assert.NotContains(t, flags(t, c.Args), "state-kubeconfig", "the gateway's own cluster, through its token")

			if tc.stateNamespace == "" {
				for _, k := range o.keys() {
					assert.NotRegexp(t, "^(Role|RoleBinding)/", k)
				}
				assert.Contains(t, r.Notes, "state.rbac.create is false: grant the ServiceAccount "+tc.subject+" of "+namespace)
				return
			}
			assert.Contains(t, r.Notes, "state namespace "+tc.stateNamespace)
			role := get[rbacv1.Role](t, o, "Role", tc.role)
			assert.Equal(t, tc.stateNamespace, role.Namespace)
			assert.Equal(t, d.Labels, role.Labels)
			assert.Equal(t, sortedRules(targets.RBACRules(steps.StatePermissions)), sortedRules(role.Rules))

			rb := get[rbacv1.RoleBinding](t, o, "RoleBinding", tc.role)
			assert.Equal(t, tc.stateNamespace, rb.Namespace)
			assert.Equal(t, d.Labels, rb.Labels)
			assert.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: tc.role}, rb.RoleRef)
			assert.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: tc.subject, Namespace: namespace}}, rb.Subjects)
		})
	}
}

// sortedRules orders rules, and the verbs of each, so that two grants of
// the same permissions compare equal.
func sortedRules(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, len(rules))
	for i, r := range rules {
		r.Verbs = slices.Sorted(slices.Values(r.Verbs))
		out[i] = r
	}
	slices.SortFunc(out, func(a, b rbacv1.PolicyRule) int {
		return cmp.Or(slices.Compare(a.APIGroups, b.APIGroups), slices.Compare(a.Resources, b.Resources))
	})
	return out
}
