package cluster

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TargetOptions describe a namespace prepared for jetway.
type TargetOptions struct {
	// Namespace is created if missing.
	Namespace string
	// ServiceAccount is jetway's identity there; default "jetway".
	ServiceAccount string
	// Rules are granted to the service account in the namespace by a Role.
	Rules []rbacv1.PolicyRule
	// TokenTTL is the lifetime of the issued token; default 24h.
	TokenTTL time.Duration
}

// Target is a prepared namespace and the credentials to act in it.
type Target struct {
	Namespace      string
	ServiceAccount string
	Token          string
	// Kubeconfig selects the namespace, carries the token and embeds the
	// cluster CA: what an operator would put in jetway's targets Secret.
	Kubeconfig []byte
}

// CreateTarget creates the namespace, service account, Role and RoleBinding
// of opts and issues a token (TokenRequest) for the service account.
func (c *Cluster) CreateTarget(ctx context.Context, opts TargetOptions) (*Target, error) {
	if opts.ServiceAccount == "" {
		opts.ServiceAccount = "jetway"
	}
	if opts.TokenTTL == 0 {
		opts.TokenTTL = 24 * time.Hour
	}
	ns, sa := opts.Namespace, opts.ServiceAccount
	core, rbac := c.Client.CoreV1(), c.Client.RbacV1()
	_, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", ns, err)
	}
	// Pods are refused until the controller manager has created the new
	// namespace's default service account.
	if err := poll(ctx, c.controllerManager, "service account "+ns+"/default", func(ctx context.Context) (bool, error) {
		_, err := core.ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	}); err != nil {
		return nil, err
	}
	meta := metav1.ObjectMeta{Name: sa, Namespace: ns}
	if _, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create service account %s/%s: %w", ns, sa, err)
	}
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: meta, Rules: opts.Rules}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create role %s/%s: %w", ns, sa, err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: meta,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create role binding %s/%s: %w", ns, sa, err)
	}
	token, err := c.Token(ctx, ns, sa, opts.TokenTTL)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := c.Kubeconfig(ns, token)
	if err != nil {
		return nil, err
	}
	return &Target{Namespace: ns, ServiceAccount: sa, Token: token, Kubeconfig: kubeconfig}, nil
}

// Token issues a new token for a service account, as a rotation would.
func (c *Cluster) Token(ctx context.Context, namespace, serviceAccount string, ttl time.Duration) (string, error) {
	seconds := int64(ttl / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}
	resp, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("issue token for %s/%s: %w", namespace, serviceAccount, err)
	}
	return resp.Status.Token, nil
}

// Kubeconfig renders a kubeconfig for this cluster with a bearer token and
// the given namespace on its current context.
func (c *Cluster) Kubeconfig(namespace, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos[namespace] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: namespace, Namespace: namespace}
	cfg.CurrentContext = c.Name
	return clientcmd.Write(*cfg)
}

// Release frees what a target's namespace holds on the cluster's nodes at
// once: its pods are deleted without a grace period (a scheduler counts a
// terminating pod's requests until it is gone), then the namespace. It
// does not wait for the kubelet to stop their containers.
func (c *Cluster) Release(ctx context.Context, namespace string) error {
	now := int64(0)
	err := c.Client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now}, metav1.ListOptions{})
	if err := ignoreNotFound(err); err != nil {
		return fmt.Errorf("delete the pods of %s: %w", namespace, err)
	}
	if err := ignoreNotFound(c.Client.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})); err != nil {
		return fmt.Errorf("delete namespace %s: %w", namespace, err)
	}
	return nil
}
