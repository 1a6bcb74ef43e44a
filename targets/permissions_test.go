package targets

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	authorizationv1 "k8s.io/api/authorization/v1"
)

func TestGrantedBy(t *testing.T) {
	pf := Permission{Resource: "pods", Subresource: "portforward", Verb: "create"}
	list := Permission{Resource: "pods", Verb: "list"}
	rule := func(groups, resources, verbs []string, names ...string) authorizationv1.ResourceRule {
		return authorizationv1.ResourceRule{APIGroups: groups, Resources: resources, Verbs: verbs, ResourceNames: names}
	}
	core := []string{""}
	tests := []struct {
		name  string
		perm  Permission
		rules []authorizationv1.ResourceRule
		want  bool
	}{
		{"exact", pf, []authorizationv1.ResourceRule{rule(core, []string{"pods/portforward"}, []string{"create"})}, true},
		{"other verb", pf, []authorizationv1.ResourceRule{rule(core, []string{"pods/portforward"}, []string{"get"})}, false},
		{"parent resource does not grant subresource", pf, []authorizationv1.ResourceRule{rule(core, []string{"pods"}, []string{"*"})}, false},
		{"subresource of any resource", pf, []authorizationv1.ResourceRule{rule(core, []string{"*/portforward"}, []string{"create"})}, true},
		{"all resources", pf, []authorizationv1.ResourceRule{rule([]string{"*"}, []string{"*"}, []string{"*"})}, true},
		{"other group", list, []authorizationv1.ResourceRule{rule([]string{"apps"}, []string{"pods"}, []string{"list"})}, false},
		{"named objects only", list, []authorizationv1.ResourceRule{rule(core, []string{"pods"}, []string{"list"}, "one")}, false},
		{"no rules", list, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.perm.grantedBy(tt.rules)) })
	}
}

func TestRBACRulesGrantRequired(t *testing.T) {
	var rules []authorizationv1.ResourceRule
	for _, r := range RBACRules(Required) {
		rules = append(rules, authorizationv1.ResourceRule{APIGroups: r.APIGroups, Resources: r.Resources, Verbs: r.Verbs})
	}
	for _, p := range Required {
		assert.True(t, p.grantedBy(rules), p.String())
	}
	assert.Equal(t, "create pods/portforward", Permission{Resource: "pods", Subresource: "portforward", Verb: "create"}.String())
	assert.Equal(t, "get leases.coordination.k8s.io", Permission{Group: "coordination.k8s.io", Resource: "leases", Verb: "get"}.String())
}

func TestAccessReviewUsesSubresourceField(t *testing.T) {
	r := Permission{Resource: "pods", Subresource: "portforward", Verb: "get"}.accessReview("ci")
	a := r.Spec.ResourceAttributes
	assert.Equal(t, "pods", a.Resource)
	assert.Equal(t, "portforward", a.Subresource)
	assert.Equal(t, "ci", a.Namespace)
}

// TestClaimPermissionsOnlyWithStorage: a target is asked for
// persistentvolumeclaims only when its volume holder keeps its volumes on
// a claim: its own steps.volumeHolder.storage, or the gateway's class
// where it says nothing; storage: {} opts out of the gateway's.
func TestClaimPermissionsOnlyWithStorage(t *testing.T) {
	target := func(storage *HolderStorage) *Target {
		return &Target{Config: &Config{Meta: Metadata{Steps: StepPolicy{VolumeHolder: VolumeHolderPolicy{Storage: storage}}}}}
	}
	claims := func(perms []Permission) []string {
		var out []string
		for _, p := range perms {
			if p.Resource == "persistentvolumeclaims" {
				out = append(out, p.Verb)
			}
		}
		return out
	}
	assert.Empty(t, claims(RequiredFor(target(nil), Required, "")), "an emptyDir")
	assert.Equal(t, []string{"create", "get", "delete"}, claims(RequiredFor(target(&HolderStorage{Class: "fast"}), Required, "")))
	assert.Equal(t, []string{"create", "get", "delete"}, claims(RequiredFor(target(nil), Required, "standard")), "the gateway's class")
	assert.Empty(t, claims(RequiredFor(target(&HolderStorage{}), Required, "standard")), "storage: {} on this target")
	assert.Len(t, Required, len(RequiredFor(target(nil), Required, "")), "Required itself unchanged")
	with := RequiredFor(target(nil), Required, "standard")
	assert.Empty(t, claims(Required), "appending did not write into Required")
	assert.Len(t, with, len(Required)+len(ClaimPermissions))
}

// TestImagePermissionsOnlyWithImages: services and endpointslices are
// asked for only of a target whose holder serves images.
func TestImagePermissionsOnlyWithImages(t *testing.T) {
	target := func(images string) *Target {
		return &Target{Config: &Config{Meta: Metadata{Steps: StepPolicy{VolumeHolder: VolumeHolderPolicy{Images: images}}}}}
	}
	assert.Equal(t, Required, RequiredFor(target(""), Required, ""))
	with := RequiredFor(target(ImagesNodePort), Required, "standard")
	assert.Equal(t, slices.Concat(Required, ClaimPermissions, ImagePermissions), with)
	assert.Contains(t, with, Permission{Group: "discovery.k8s.io", Resource: "endpointslices", Verb: "update"})
}
