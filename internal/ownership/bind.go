package ownership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// bindTimeout bounds Bind's tries: the pod was made a moment ago, by the
// same API server.
const bindTimeout = 30 * time.Second

// ErrNotBound is a pod Bind could not bind: it went, or another pod has
// its name now. Nothing may be sent to whatever has the name.
var ErrNotBound = errors.New("pod not bound to jetway's create")

// Bind writes the binding of created, the pod jetway's own create just
// returned, onto it: its BoundAnnotation, for its UID alone (the patch
// tests the UID, so it never lands on another pod of the name). Failed
// tries are made again for a while; a pod gone or replaced is
// ErrNotBound. It finishes what the create began even once ctx ends (a
// gateway asked to stop): a pod made and left unbound is one the next
// owner cannot tell from a planted one, and makes again.
func Bind(ctx context.Context, pods corev1client.PodInterface, key Key, target string, created *corev1.Pod) (*corev1.Pod, error) {
	if created.UID == "" {
		return nil, fmt.Errorf("bind pod %s: %w: the create returned no UID", created.Name, ErrNotBound)
	}
	patch := bindPatch(key.binding(target, created), created.UID)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bindTimeout)
	defer cancel()
	wait := 50 * time.Millisecond
	for {
		p, err := pods.Patch(ctx, created.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return p, nil
		case !transient(err):
			// The pod is gone, or another has its name (the UID test
			// failed: 422), or the patch is refused.
			return nil, fmt.Errorf("bind pod %s (uid %s): %w: %v", created.Name, created.UID, ErrNotBound, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("bind pod %s (uid %s): %w: %v", created.Name, created.UID, ErrNotBound, err)
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// bindPatch is the JSON patch that adds binding as the BoundAnnotation of
// the pod whose UID is uid, and of no other.
func bindPatch(binding string, uid types.UID) []byte {
	key := strings.NewReplacer("~", "~0", "/", "~1").Replace(BoundAnnotation)
	b, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": string(uid)},
		{"op": "add", "path": "/metadata/annotations/" + key, "value": binding},
	})
	return b
}

// transient reports whether a failed call may work if made again: the
// API server unreachable, overloaded or failing, not refusing it.
func transient(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // no answer: the connection
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
}
