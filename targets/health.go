package targets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
)

// Health is the outcome of one check of a target.
type Health struct {
	At            time.Time
	Latency       time.Duration // of the readiness probe
	Duration      time.Duration // of the whole check
	ServerVersion string
	// VersionAt is when ServerVersion was read from the server.
	VersionAt time.Time
	// Missing lists required permissions the target does not grant.
	Missing []Permission
	// Err says why the target could not be checked (nil when it could).
	Err error
	// Reason classifies a failure for metrics: one of the Reason* values.
	Reason string
}

// OK reports whether the target answered and granted every permission.
func (h Health) OK() bool { return h.Err == nil && len(h.Missing) == 0 }

// Failure reasons, the label values of the failed-checks metric.
const (
	ReasonInvalid      = "invalid_config"
	ReasonUnreachable  = "unreachable"
	ReasonTimeout      = "timeout"
	ReasonUnauthorized = "unauthorized"
	ReasonNotReady     = "not_ready"
	ReasonPermissions  = "missing_permissions"
	ReasonError        = "error"
)

// checker runs health checks.
type checker struct {
	required []Permission
	// holderClass is the gateway's volume-holder-storage-class: a target
	// whose holder keeps its volumes on a claim is asked for
	// ClaimPermissions too.
	holderClass string
	now         func() time.Time
}

// check probes readiness, reads the server version when it is not known,
// and reviews every required permission. The caller bounds it with ctx.
func (c *checker) check(ctx context.Context, t *Target, knownVersion string) (h Health) {
	h = Health{At: c.now(), ServerVersion: knownVersion}
	start := time.Now()
	defer func() { h.Duration = time.Since(start) }()
	if err := ready(ctx, t.raw); err != nil {
		h.Err, h.Reason = classify(ctx, err)
		return h
	}
	h.Latency = time.Since(start)
	if h.ServerVersion == "" {
		if v, err := serverVersion(ctx, t.raw); err == nil {
			h.ServerVersion = v
		}
	}
	missing, err := c.review(ctx, t)
	if err != nil {
		h.Err, h.Reason = classify(ctx, err)
		h.Err = fmt.Errorf("review permissions: %w", h.Err)
		return h
	}
	h.Missing = missing
	if len(missing) > 0 {
		h.Reason = ReasonPermissions
	}
	return h
}

// review asks the API server which required permissions are missing.
// One SelfSubjectRulesReview answers for all of them in one request; each
// permission it does not show as granted (or all, when the server says its
// list is incomplete) is asked again with a SelfSubjectAccessReview, whose
// answer decides: only "allowed" counts, "no opinion" is denied.
func (c *checker) review(ctx context.Context, t *Target) ([]Permission, error) {
	rules, err := t.authz.SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: t.Namespace()},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var missing []Permission
	for _, p := range RequiredFor(t, c.required, c.holderClass) {
		if !rules.Status.Incomplete && p.grantedBy(rules.Status.ResourceRules) {
			continue
		}
		review, err := t.authz.SelfSubjectAccessReviews().Create(ctx, p.accessReview(t.Namespace()), metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		if !review.Status.Allowed || review.Status.Denied {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// ready probes /readyz, falling back to /healthz on servers without it.
// A not-ready server answers 500 with the failing checks, which client-go
// returns as an internal error.
func ready(ctx context.Context, rc rest.Interface) error {
	_, err := rc.Get().AbsPath("/readyz").Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		_, err = rc.Get().AbsPath("/healthz").Do(ctx).Raw()
	}
	if apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) {
		return fmt.Errorf("%w: %v", errNotReady, err)
	}
	return err
}

var errNotReady = errors.New("API server not ready")

func serverVersion(ctx context.Context, rc rest.Interface) (string, error) {
	body, err := rc.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return "", err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return "", err
	}
	return info.GitVersion, nil
}

// classify names a failure for operators and metrics.
func classify(ctx context.Context, err error) (error, string) {
	var netErr net.Error
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		return fmt.Errorf("API server did not answer in time: %w", err), ReasonTimeout
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("credentials rejected (401): %w", err), ReasonUnauthorized
	case errors.Is(err, errNotReady), apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err):
		return err, ReasonNotReady
	case errors.As(err, &netErr):
		return fmt.Errorf("API server unreachable: %w", err), ReasonUnreachable
	case apierrors.IsForbidden(err):
		return err, ReasonPermissions
	}
	return err, ReasonError
}

// Check checks one target once, with the same probe and reviews as the
// registry: what `gateway check` runs before a Secret is mounted.
// holderClass is the gateway's volume-holder-storage-class.
func Check(ctx context.Context, cfg *Config, timeout time.Duration, holderClass string) Health {
	t, err := NewTarget(cfg, "")
	if err != nil {
		return Health{At: time.Now(), Err: err, Reason: ReasonInvalid}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := checker{required: Required, holderClass: holderClass, now: time.Now}
	return c.check(ctx, t, "")
}

// Describe says in one line what is wrong with a check, or "" when nothing.
func (h Health) Describe() string { return describe(h) }
