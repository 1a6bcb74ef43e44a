package targets

import (
	"slices"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// Permission is one verb on one resource (or subresource) that jetway needs
// in a target's namespace.
type Permission struct {
	Group       string
	Resource    string
	Subresource string
	Verb        string
}

// String renders the permission as operators read it: "create pods/portforward".
func (p Permission) String() string {
	r := p.Resource
	if p.Subresource != "" {
		r += "/" + p.Subresource
	}
	if p.Group != "" {
		r += "." + p.Group
	}
	return p.Verb + " " + r
}

// Required is every permission jetway uses in a target namespace: the one
// list the health check reviews. Add here whatever new code needs.
var Required = []Permission{
	{Resource: "pods", Verb: "create"},
	{Resource: "pods", Verb: "get"},
	{Resource: "pods", Verb: "list"},
	{Resource: "pods", Verb: "watch"},
	{Resource: "pods", Verb: "delete"},
	{Resource: "pods", Verb: "patch"}, // a step's end, recorded on its pod
	{Resource: "pods", Subresource: "log", Verb: "get"},
	// Steps run through exec: POST (create) over SPDY, GET over WebSocket.
	{Resource: "pods", Subresource: "exec", Verb: "create"},
	{Resource: "pods", Subresource: "exec", Verb: "get"},
	// Port-forward upgrades with POST (create) over SPDY and GET over
	// WebSocket; the API server authorizes each as that verb.
	{Resource: "pods", Subresource: "portforward", Verb: "create"},
	{Resource: "pods", Subresource: "portforward", Verb: "get"},
	// Lifecycle: the record of land/retire is a ConfigMap (watched, like
	// the step pods, so every replica sees it change), and a Lease picks
	// the one replica that acts on the target.
	{Resource: "configmaps", Verb: "get"},
	{Resource: "configmaps", Verb: "list"},
	{Resource: "configmaps", Verb: "watch"},
	{Resource: "configmaps", Verb: "create"},
	{Resource: "configmaps", Verb: "update"},
	{Resource: "configmaps", Verb: "delete"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "get"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "list"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "create"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "update"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "delete"},
	// A Concourse container whose image a get fetched with its source's
	// registry credentials gets a pull secret of its own, owned by its
	// pod (deleted with it by the garbage collector): create alone, jetway
	// reads no Secret of the namespace.
	{Resource: "secrets", Verb: "create"},
}

// ClaimPermissions are what a target whose Concourse volume holder keeps
// its volumes on a PersistentVolumeClaim (steps.volumeHolder.storage, or
// the gateway's volume-holder-storage-class) needs besides Required: the
// claim is made, read as the holder is made again, and deleted when the
// target is retired or goes back to an emptyDir. Only such a target is
// asked for them (RequiredFor).
var ClaimPermissions = []Permission{
	{Resource: "persistentvolumeclaims", Verb: "create"},
	{Resource: "persistentvolumeclaims", Verb: "get"},
	{Resource: "persistentvolumeclaims", Verb: "delete"},
}

// ImagePermissions are what a target whose Concourse volume holder serves
// the rootfs it keeps as images (steps.volumeHolder.images) needs besides
// Required: the holder's Service and the EndpointSlice that names the
// holder pod's address alone (no selector, which a planted pod could
// match). Both are owned by the holder pod, so they go with it.
var ImagePermissions = []Permission{
	{Resource: "services", Verb: "create"},
	{Resource: "services", Verb: "get"},
	{Resource: "services", Verb: "delete"},
	{Group: "discovery.k8s.io", Resource: "endpointslices", Verb: "create"},
	{Group: "discovery.k8s.io", Resource: "endpointslices", Verb: "get"},
	{Group: "discovery.k8s.io", Resource: "endpointslices", Verb: "update"},
}

// RequiredFor is what t needs of required (Required, or what a test
// asks): ClaimPermissions too when its volume holder keeps its volumes on
// a claim, holderClass being the gateway's volume-holder-storage-class.
func RequiredFor(t *Target, required []Permission, holderClass string) []Permission {
	holder := t.Config.Meta.Steps.VolumeHolder
	if holder.StorageClass(holderClass) != "" {
		required = append(slices.Clip(required), ClaimPermissions...)
	}
	if holder.Images != "" {
		required = append(slices.Clip(required), ImagePermissions...)
	}
	return required
}

// RBACRules returns the Role rules that grant perms: what an operator binds
// to jetway's service account (docs and tests use it).
func RBACRules(perms []Permission) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	for _, p := range perms {
		res := p.Resource
		if p.Subresource != "" {
			res += "/" + p.Subresource
		}
		i := slices.IndexFunc(rules, func(r rbacv1.PolicyRule) bool {
			return r.APIGroups[0] == p.Group && r.Resources[0] == res
		})
		if i < 0 {
			rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{p.Group}, Resources: []string{res}})
			i = len(rules) - 1
		}
		rules[i].Verbs = append(rules[i].Verbs, p.Verb)
	}
	return rules
}

// accessReview is the SelfSubjectAccessReview that asks for p in namespace.
// The subresource goes in its own field: "pods/portforward" as a resource
// would ask about a resource that does not exist.
func (p Permission) accessReview(namespace string) *authorizationv1.SelfSubjectAccessReview {
	return &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace:   namespace,
			Verb:        p.Verb,
			Group:       p.Group,
			Resource:    p.Resource,
			Subresource: p.Subresource,
		},
	}}
}

// grantedBy reports whether one of rules (from a SelfSubjectRulesReview)
// grants p on every object, with RBAC's matching: "*" wildcards for groups,
// verbs and resources, "*/sub" for a subresource of any resource, and no
// resourceNames restriction.
func (p Permission) grantedBy(rules []authorizationv1.ResourceRule) bool {
	resource := p.Resource
	if p.Subresource != "" {
		resource += "/" + p.Subresource
	}
	for _, r := range rules {
		if len(r.ResourceNames) > 0 {
			continue
		}
		if !matches(r.APIGroups, p.Group) || !matches(r.Verbs, p.Verb) {
			continue
		}
		if slices.Contains(r.Resources, "*") || slices.Contains(r.Resources, resource) ||
			(p.Subresource != "" && slices.Contains(r.Resources, "*/"+p.Subresource)) {
			return true
		}
	}
	return false
}

func matches(values []string, want string) bool {
	return slices.Contains(values, "*") || slices.Contains(values, want)
}

// missingNames renders permissions for the API's missing_permissions.
func missingNames(perms []Permission) []string {
	out := make([]string, len(perms))
	for i, p := range perms {
		out[i] = p.String()
	}
	return out
}
