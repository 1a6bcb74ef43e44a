package lifecycle

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The claims a target owns (a Concourse volume holder's, where it keeps
// its volumes on one: Options.Claims) are named, not listed: only such a
// target grants jetway persistentvolumeclaims, and then get and delete,
// not list (targets.ClaimPermissions).

// deleteClaims deletes the claims Options.Claims names for the target
// that carry its ownership labels (another's, or one planted without
// them, stays); each delete is of the claim read (its UID). The API
// server keeps a claim until no pod uses it (its pvc-protection
// finalizer): the target's pods are deleted first.
func (c *Controller) deleteClaims(ctx context.Context, k *kube) error {
	for _, name := range c.claims(k) {
		claim, err := k.core.PersistentVolumeClaims(k.ns).Get(ctx, name, metav1.GetOptions{})
		if gone(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("claim %s/%s: %w", k.ns, name, err)
		}
		if !owns(k, claim.Labels) {
			continue
		}
		if err := k.core.PersistentVolumeClaims(k.ns).Delete(ctx, name, uidPrecondition(claim.UID)); !gone(err) && err != nil {
			return fmt.Errorf("delete claim %s/%s: %w", k.ns, name, err)
		}
	}
	return nil
}

// claimsLeft names the target's claims still there.
func (c *Controller) claimsLeft(ctx context.Context, k *kube) ([]string, error) {
	var left []string
	for _, name := range c.claims(k) {
		claim, err := k.core.PersistentVolumeClaims(k.ns).Get(ctx, name, metav1.GetOptions{})
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: %w", k.ns, name, err)
		}
		if owns(k, claim.Labels) {
			left = append(left, "persistentvolumeclaim/"+name)
		}
	}
	return left, nil
}

func (c *Controller) claims(k *kube) []string {
	if c.opts.Claims == nil {
		return nil
	}
	return c.opts.Claims(k.t)
}

// owns reports whether labels carry every one of the target's ownership
// labels.
func owns(k *kube, labels map[string]string) bool {
	for key, v := range k.labels {
		if labels[key] != v {
			return false
		}
	}
	return true
}
