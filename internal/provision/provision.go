// Package provision gives jetway access to a namespace with an operator's
// admin credentials, and takes it away again: a service account, a Role
// holding exactly targets.Required, its binding, NetworkPolicies around
// the step pods and the hermetic ones (networkpolicy.go) and a token, and the target kubeconfig
// built from them. `gateway target add`, `remove` and `rbac` run it.
package provision

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/jetway-ci/jetway/targets"
)

// Labels and annotations that mark what `gateway target add` created, so
// that `remove` deletes exactly that.
const (
	// AccessLabel names the target an object grants access for.
	AccessLabel = "jetway-ci.dev/access-for"
	// ManagedByLabel is the usual app.kubernetes.io marker.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// CreatedNamespaceAnnotation marks a namespace `add` created, so
	// `remove` deletes it too; a namespace that was there before stays.
	CreatedNamespaceAnnotation = "jetway-ci.dev/namespace-created-for"
	managedBy                  = "jetway"
)

// DefaultTokenDuration is how long a token from TokenRequest lives unless
// the operator asks otherwise: run `target add` again to rotate it.
const DefaultTokenDuration = 30 * 24 * time.Hour

// tokenSecretTimeout bounds the wait for the token controller to fill a
// long-lived token Secret.
const tokenSecretTimeout = 30 * time.Second

// Access names the objects that give jetway a target's namespace.
type Access struct {
	Target    string
	Namespace string
}

// AccountName is the service account, Role and RoleBinding's name:
// jetway-TARGET, or jetway for printed RBAC that names no target.
func (a Access) AccountName() string {
	if a.Target == "" {
		return "jetway"
	}
	return "jetway-" + a.Target
}

// TokenSecretName is the long-lived token Secret's name.
func (a Access) TokenSecretName() string { return a.AccountName() + "-token" }

// Validate says what is wrong with the target or namespace name.
func (a Access) Validate() error {
	var errs []error
	if a.Target == "" {
		// printed RBAC only
	} else if msgs := validation.IsDNS1123Label(a.Target); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("target name %q: %s", a.Target, msgs[0]))
	} else if msgs := validation.IsDNS1123Label(a.TokenSecretName()); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("target name %q is too long for its objects (%s): %s", a.Target, a.TokenSecretName(), msgs[0]))
	}
	if msgs := validation.IsDNS1123Label(a.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s", a.Namespace, msgs[0]))
	}
	return errors.Join(errs...)
}

func (a Access) meta() metav1.ObjectMeta {
	labels := map[string]string{ManagedByLabel: managedBy}
	if a.Target != "" {
		labels[AccessLabel] = a.Target
	}
	return metav1.ObjectMeta{Name: a.AccountName(), Namespace: a.Namespace, Labels: labels}
}

// Objects are the service account, the Role granting targets.Required and
// the binding between them: what `add` creates and `rbac` prints.
func (a Access) Objects() (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	sa := &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: a.meta()}
	role := &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "Role"},
		ObjectMeta: a.meta(), Rules: targets.RBACRules(targets.Required)}
	binding := &rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
		ObjectMeta: a.meta(),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: a.AccountName()},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: a.AccountName(), Namespace: a.Namespace}},
	}
	return sa, role, binding
}

// AddOptions say how to add access.
type AddOptions struct {
	// CreateNamespace creates the namespace when it does not exist.
	CreateNamespace bool
	// TokenDuration is the lifetime asked of TokenRequest (the API server
	// may shorten it); default DefaultTokenDuration.
	TokenDuration time.Duration
	// LongLivedToken makes a service-account-token Secret instead: a token
	// that lives until the Secret is deleted.
	LongLivedToken bool
	// EgressDeny are the addresses the NetworkPolicy keeps step pods
	// from reaching (Access.NetworkPolicy); none: no egress rules.
	EgressDeny []netip.Prefix
	// Progress hears one line per object made or changed.
	Progress func(string)
}

// Credentials are what `add` obtained.
type Credentials struct {
	Token string
	// Expires is when the token ends; zero for a long-lived one.
	Expires time.Time
}

// Add creates (or brings up to date, when run again) a's namespace, service
// account, Role and binding, and issues a token. An object of that name
// that `add` did not make is left alone and reported.
func Add(ctx context.Context, admin *rest.Config, a Access, opts AddOptions) (Credentials, error) {
	if err := a.Validate(); err != nil {
		return Credentials{}, err
	}
	if opts.TokenDuration <= 0 {
		opts.TokenDuration = DefaultTokenDuration
	}
	say := opts.Progress
	if say == nil {
		say = func(string) {}
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return Credentials{}, fmt.Errorf("admin kubeconfig: %w", err)
	}
	if err := ensureNamespace(ctx, cs, a, opts.CreateNamespace, say); err != nil {
		return Credentials{}, err
	}
	sa, role, binding := a.Objects()
	core, rbac := cs.CoreV1().ServiceAccounts(a.Namespace), cs.RbacV1()
	if err := ensure(ctx, a, "service account", sa, core.Get, core.Create, nil, say); err != nil {
		return Credentials{}, err
	}
	if err := ensure(ctx, a, "role", role, rbac.Roles(a.Namespace).Get, rbac.Roles(a.Namespace).Create,
		func(old *rbacv1.Role) (bool, func(context.Context) error) {
			if equalRules(old.Rules, role.Rules) {
				return false, nil
			}
			old.Rules = role.Rules
			return true, func(ctx context.Context) error {
				_, err := rbac.Roles(a.Namespace).Update(ctx, old, metav1.UpdateOptions{})
				return err
			}
		}, say); err != nil {
		return Credentials{}, err
	}
	if err := ensure(ctx, a, "role binding", binding, rbac.RoleBindings(a.Namespace).Get, rbac.RoleBindings(a.Namespace).Create,
		nil, say); err != nil {
		return Credentials{}, err
	}
	policies := cs.NetworkingV1().NetworkPolicies(a.Namespace)
	for _, policy := range a.NetworkPolicies(opts.EgressDeny) {
		if err := ensure(ctx, a, "network policy", policy, policies.Get, policies.Create,
			func(old *networkingv1.NetworkPolicy) (bool, func(context.Context) error) {
				if equality.Semantic.DeepEqual(old.Spec, policy.Spec) {
					return false, nil
				}
				old.Spec = policy.Spec
				return true, func(ctx context.Context) error {
					_, err := policies.Update(ctx, old, metav1.UpdateOptions{})
					return err
				}
			}, say); err != nil {
			return Credentials{}, err
		}
	}
	if opts.LongLivedToken {
		return longLivedToken(ctx, cs, a, say)
	}
	seconds := int64(opts.TokenDuration / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}
	resp, err := core.CreateToken(ctx, a.AccountName(), req, metav1.CreateOptions{})
	if err != nil {
		return Credentials{}, fmt.Errorf("issue a token for service account %s/%s: %w", a.Namespace, a.AccountName(), err)
	}
	say(fmt.Sprintf("issued a token for service account %s/%s, valid until %s", a.Namespace, a.AccountName(),
		resp.Status.ExpirationTimestamp.UTC().Format(time.RFC3339)))
	return Credentials{Token: resp.Status.Token, Expires: resp.Status.ExpirationTimestamp.Time}, nil
}

func ensureNamespace(ctx context.Context, cs kubernetes.Interface, a Access, create bool, say func(string)) error {
	_, err := cs.CoreV1().Namespaces().Get(ctx, a.Namespace, metav1.GetOptions{})
	switch {
	case err == nil:
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("read namespace %s: %w", a.Namespace, err)
	case !create:
		return fmt.Errorf("namespace %s does not exist (create it, or pass --create-namespace)", a.Namespace)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: a.Namespace,
		Labels:      map[string]string{ManagedByLabel: managedBy},
		Annotations: map[string]string{CreatedNamespaceAnnotation: a.Target}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", a.Namespace, err)
	}
	say("created namespace " + a.Namespace)
	return nil
}

// ensure creates obj, or, when one of its name exists, checks that `add`
// made it for this target and brings it up to date with update (nil: no
// field of it changes).
func ensure[T metav1.Object](ctx context.Context, a Access, kind string, obj T,
	get func(context.Context, string, metav1.GetOptions) (T, error),
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	update func(old T) (bool, func(context.Context) error),
	say func(string),
) error {
	what := fmt.Sprintf("%s %s/%s", kind, a.Namespace, obj.GetName())
	_, err := create(ctx, obj, metav1.CreateOptions{})
	if err == nil {
		say("created " + what)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %s: %w", what, err)
	}
	old, err := get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	if err := madeFor(old, a, what); err != nil {
		return err
	}
	if update == nil {
		say(what + " is up to date")
		return nil
	}
	changed, apply := update(old)
	if !changed {
		say(what + " is up to date")
		return nil
	}
	if err := apply(ctx); err != nil {
		return fmt.Errorf("update %s: %w", what, err)
	}
	say("updated " + what)
	return nil
}

// madeFor refuses an object `add` did not make for a's target.
func madeFor(obj metav1.Object, a Access, what string) error {
	if got := obj.GetLabels()[AccessLabel]; got != a.Target {
		return fmt.Errorf("%s exists and was not made by `gateway target add %s` (label %s=%q); it is left alone: remove it or choose another target name",
			what, a.Target, AccessLabel, got)
	}
	return nil
}

func equalRules(a, b []rbacv1.PolicyRule) bool {
	return slices.EqualFunc(a, b, func(x, y rbacv1.PolicyRule) bool {
		return slices.Equal(x.APIGroups, y.APIGroups) && slices.Equal(x.Resources, y.Resources) &&
			slices.Equal(x.Verbs, y.Verbs) && slices.Equal(x.ResourceNames, y.ResourceNames) &&
			slices.Equal(x.NonResourceURLs, y.NonResourceURLs)
	})
}

// longLivedToken makes the service-account-token Secret and waits for the
// token controller to fill it.
func longLivedToken(ctx context.Context, cs kubernetes.Interface, a Access, say func(string)) (Credentials, error) {
	secrets := cs.CoreV1().Secrets(a.Namespace)
	meta := a.meta()
	meta.Name = a.TokenSecretName()
	meta.Annotations = map[string]string{corev1.ServiceAccountNameKey: a.AccountName()}
	secret := &corev1.Secret{ObjectMeta: meta, Type: corev1.SecretTypeServiceAccountToken}
	if err := ensure(ctx, a, "token secret", secret, secrets.Get, secrets.Create, nil, say); err != nil {
		return Credentials{}, err
	}
	var token []byte
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, tokenSecretTimeout, true, func(ctx context.Context) (bool, error) {
		s, err := secrets.Get(ctx, a.TokenSecretName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		token = s.Data[corev1.ServiceAccountTokenKey]
		return len(token) > 0, nil
	})
	if err != nil {
		return Credentials{}, fmt.Errorf("token secret %s/%s: no token after %s (the cluster's token controller, in kube-controller-manager, fills it): %w",
			a.Namespace, a.TokenSecretName(), tokenSecretTimeout, err)
	}
	return Credentials{Token: string(token)}, nil
}

// Removed lists what Remove deleted and what it left alone.
type Removed struct {
	Deleted []string
	// Kept are objects of the target's names that `add` did not make.
	Kept []string
}

// Remove deletes what Add made for a: its token Secret, binding, Role,
// service account, and the namespace when Add created it. Objects of those
// names that Add did not make stay, and are listed in Kept.
func Remove(ctx context.Context, admin *rest.Config, a Access) (Removed, error) {
	var r Removed
	if err := a.Validate(); err != nil {
		return r, err
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return r, fmt.Errorf("admin kubeconfig: %w", err)
	}
	core, rbac := cs.CoreV1(), cs.RbacV1()
	steps := []struct {
		kind, name string
		get        func(context.Context, string, metav1.GetOptions) (metav1.Object, error)
		del        func(context.Context, string, metav1.DeleteOptions) error
	}{
		{"token secret", a.TokenSecretName(), objGet(core.Secrets(a.Namespace).Get), core.Secrets(a.Namespace).Delete},
		{"network policy", a.AccountName(), objGet(cs.NetworkingV1().NetworkPolicies(a.Namespace).Get), cs.NetworkingV1().NetworkPolicies(a.Namespace).Delete},
		{"network policy", a.HermeticPolicyName(), objGet(cs.NetworkingV1().NetworkPolicies(a.Namespace).Get), cs.NetworkingV1().NetworkPolicies(a.Namespace).Delete},
		{"role binding", a.AccountName(), objGet(rbac.RoleBindings(a.Namespace).Get), rbac.RoleBindings(a.Namespace).Delete},
		{"role", a.AccountName(), objGet(rbac.Roles(a.Namespace).Get), rbac.Roles(a.Namespace).Delete},
		{"service account", a.AccountName(), objGet(core.ServiceAccounts(a.Namespace).Get), core.ServiceAccounts(a.Namespace).Delete},
	}
	var errs []error
	for _, s := range steps {
		what := fmt.Sprintf("%s %s/%s", s.kind, a.Namespace, s.name)
		obj, err := s.get(ctx, s.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("read %s: %w", what, err))
			continue
		case madeFor(obj, a, what) != nil:
			r.Kept = append(r.Kept, what)
			continue
		}
		if err := deleteExact(ctx, s.del, obj); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", what, err))
			continue
		}
		r.Deleted = append(r.Deleted, what)
	}
	ns, err := core.Namespaces().Get(ctx, a.Namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		errs = append(errs, fmt.Errorf("read namespace %s: %w", a.Namespace, err))
	case ns.Annotations[CreatedNamespaceAnnotation] == a.Target && len(errs) == 0:
		if err := deleteExact(ctx, core.Namespaces().Delete, ns); err != nil {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", a.Namespace, err))
		} else {
			r.Deleted = append(r.Deleted, "namespace "+a.Namespace+" (and everything in it)")
		}
	}
	return r, errors.Join(errs...)
}

// deleteExact deletes obj only if it is still the object that was read.
func deleteExact(ctx context.Context, del func(context.Context, string, metav1.DeleteOptions) error, obj metav1.Object) error {
	uid := obj.GetUID()
	return del(ctx, obj.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

func objGet[T metav1.Object](get func(context.Context, string, metav1.GetOptions) (T, error)) func(context.Context, string, metav1.GetOptions) (metav1.Object, error) {
	return func(ctx context.Context, name string, o metav1.GetOptions) (metav1.Object, error) {
		return get(ctx, name, o)
	}
}
