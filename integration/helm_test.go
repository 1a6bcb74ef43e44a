package integration

import (
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/jetway-ci/jetway/deploy/helm"
	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/steps"
	"github.com/jetway-ci/jetway/targets"
)

// TestHelmChart installs the chart into a real API server as Helm would:
// for each value set of the chart's ci folder, every object it renders is
// applied with server-side apply (strict field validation) into a
// namespace of its own that enforces the restricted Pod Security Standard,
// and read back as applied; the pod the Deployment would make is admitted
// there (a dry run). The pods' ServiceAccount may use the state namespace
// (the release's or the one state.namespace names, where the Role goes)
// as the gateway does, and nothing more. Objects of kinds the cluster does
// not serve are skipped and named: first without CRDs, then with
// prometheus-operator's and cert-manager's (testdata/crds) installed, which
// apply too. An upgrade keeps the mesh CA the install generated.
func TestHelmChart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newApplier(clusters[0])
	sets, err := helm.CIValues()
	require.NoError(t, err)

	t.Run("without CRDs", func(t *testing.T) {
		skipped := a.install(t, ctx, "helm-no-crds", sets["monitoring-values.yaml"])
		assert.ElementsMatch(t, []string{"PrometheusRule/jw-jetway", "ServiceMonitor/jw-jetway"}, skipped)
	})

	a.installCRDs(t, ctx, "testdata/crds")
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		t.Run(name, func(t *testing.T) {
			assert.Empty(t, a.install(t, ctx, "helm-"+strings.TrimSuffix(name, "-values.yaml"), sets[name]))
		})
	}

	t.Run("upgrade keeps the mesh CA", func(t *testing.T) {
		const ns = "helm-default"
		ca, err := a.c.Client.CoreV1().Secrets(ns).Get(ctx, "jw-jetway-mesh-ca", metav1.GetOptions{})
		require.NoError(t, err, "installed by the default-values.yaml run")
		r, err := helm.Render(helm.Release{Name: "jw", Namespace: ns, Values: sets["default-values.yaml"],
			Upgrade: true, Cluster: a.c.AdminConfig()})
		require.NoError(t, err)
		for _, obj := range r.Objects {
			if obj.GetKind() == "Secret" && obj.GetName() == ca.Name {
				assert.Equal(t, base64Data(ca.Data), obj.Object["data"], "the upgrade renders the CA it found")
			}
			_, err := a.apply(ctx, ns, obj)
			require.NoError(t, err, "%s/%s", obj.GetKind(), obj.GetName())
		}

		// helm template cannot look the CA up: a new one each time, which
		// is why the chart's README sends GitOps users elsewhere.
		r, err = helm.Render(helm.Release{Name: "jw", Namespace: ns, Values: sets["default-values.yaml"], Upgrade: true})
		require.NoError(t, err)
		for _, obj := range r.Objects {
			if obj.GetKind() == "Secret" && obj.GetName() == ca.Name {
				assert.NotEqual(t, base64Data(ca.Data), obj.Object["data"])
			}
		}
	})
}

// applier applies objects to one cluster with server-side apply, as Helm
// and kubectl do: the REST mapping from the server's discovery, so a kind
// the server does not serve is known as such.
type applier struct {
	c      *cluster.Cluster
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(c *cluster.Cluster) *applier {
	return &applier{c: c, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))}
}

// install renders the chart with values as release "jw" in a new namespace
// ns, applies every object (one the chart puts in another namespace, the
// state namespace, there: created if missing, as an operator must), checks
// each, the pod the Deployment makes and what its ServiceAccount may do,
// and returns the kind/name of the objects skipped for want of their CRD.
func (a *applier) install(t *testing.T, ctx context.Context, ns string, values map[string]any) (skipped []string) {
	t.Helper()
	_, err := a.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}},
		metav1.CreateOptions{})
	require.NoError(t, err)
	r, err := helm.Render(helm.Release{Name: "jw", Namespace: ns, Values: values, Cluster: a.c.AdminConfig()})
	require.NoError(t, err)
	var deployment *unstructured.Unstructured
	var stateNamespace string // the RoleBinding's, if the chart makes one
	for _, obj := range r.Objects {
		what := obj.GetKind() + "/" + obj.GetName()
		if other := obj.GetNamespace(); other != "" && other != ns {
			_, err := a.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
			if !apierrors.IsAlreadyExists(err) {
				require.NoError(t, err, what)
			}
		}
		if obj.GetKind() == "RoleBinding" {
			stateNamespace = cmp.Or(obj.GetNamespace(), ns)
		}
		live, err := a.apply(ctx, ns, obj)
		if meta.IsNoMatchError(err) {
			t.Logf("%s skipped: the cluster does not serve %s (its CRD is not installed)", what, obj.GroupVersionKind())
			skipped = append(skipped, what)
			continue
		}
		require.NoError(t, err, what)
		assert.Empty(t, diffApplied(what, obj.Object, live.Object), "the server changed what was applied")
		if obj.GetKind() == "Deployment" {
			deployment = live
		}
	}
	require.NotNil(t, deployment)
	a.admitsPod(t, ctx, ns, deployment)
	if stateNamespace != "" {
		a.grantsState(t, ctx, ns, stateNamespace, deployment)
	}
	return skipped
}

// apply applies obj to its namespace, else ns, (if namespaced) and reads
// it back.
func (a *applier) apply(ctx context.Context, ns string, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	var ri dynamic.ResourceInterface = a.c.Dynamic.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.c.Dynamic.Resource(m.Resource).Namespace(cmp.Or(obj.GetNamespace(), ns))
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	if _, err := ri.Patch(ctx, obj.GetName(), k8stypes.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: "helm", FieldValidation: metav1.FieldValidationStrict}); err != nil {
		return nil, err
	}
	return ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
}

// admitsPod creates, as a dry run, the pod the Deployment d would make:
// admission, the restricted Pod Security Standard included, must accept
// it, and mount the gateway its ServiceAccount's token where
// rest.InClusterConfig reads it, though the ServiceAccount asks for none.
// To show the namespace enforces it, the same pod with a container
// that may escalate its privileges must be refused.
func (a *applier) admitsPod(t *testing.T, ctx context.Context, ns string, d *unstructured.Unstructured) {
	t.Helper()
	var dep appsv1.Deployment
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object, &dep))
	pods := a.c.Client.CoreV1().Pods(ns)
	sa := dep.Spec.Template.Spec.ServiceAccountName
	eventually(t, 30*time.Second, func() error { // the controller manager makes "default"
		_, err := a.c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{})
		return err
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: dep.Name + "-", Labels: dep.Spec.Template.Labels},
		Spec: dep.Spec.Template.Spec}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	admitted, err := pods.Create(ctx, pod, dryRun)
	require.NoError(t, err, "the Deployment's pod is refused")
	var token bool
	for _, m := range admitted.Spec.Containers[0].VolumeMounts {
		token = token || m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
	}
	assert.True(t, token, "the gateway has no service account token: %v", admitted.Spec.Containers[0].VolumeMounts)

	escalate := true
	pod.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &escalate
	_, err = pods.Create(ctx, pod, dryRun)
	require.True(t, apierrors.IsForbidden(err), "a pod allowed to escalate privileges was not refused: %v", err)
	assert.Contains(t, err.Error(), `violates PodSecurity "restricted:latest"`)
}

// grantsState asks the API server (SubjectAccessReviews) what the
// ServiceAccount of the Deployment d in ns may do: every state permission
// (steps.StatePermissions) in stateNs, none outside them, nor anything in
// ns when the state is elsewhere (the targets and tokens Secrets are
// mounted, never read through the API).
func (a *applier) grantsState(t *testing.T, ctx context.Context, ns, stateNs string, d *unstructured.Unstructured) {
	t.Helper()
	sa, _, err := unstructured.NestedString(d.Object, "spec", "template", "spec", "serviceAccountName")
	require.NoError(t, err)
	may := func(namespace string, p targets.Permission) bool {
		review, err := a.c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:" + ns + ":" + sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: p.Verb, Group: p.Group,
					Resource: p.Resource, Subresource: p.Subresource},
			}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return review.Status.Allowed
	}
	for _, p := range steps.StatePermissions {
		assert.True(t, may(stateNs, p), "%s may not %s in %s", sa, p, stateNs)
	}
	for _, p := range []targets.Permission{
		{Resource: "secrets", Verb: "update"},
		{Resource: "configmaps", Verb: "get"},
		{Resource: "pods", Verb: "list"},
		{Group: "coordination.k8s.io", Resource: "leases", Verb: "patch"},
	} {
		assert.False(t, may(stateNs, p), "%s may %s in %s", sa, p, stateNs)
	}
	if stateNs != ns {
		for _, p := range steps.StatePermissions {
			assert.False(t, may(ns, p), "%s may %s in %s, not its state namespace", sa, p, ns)
		}
	}
}

// installCRDs applies the gzipped CRD manifests of dir, waits until the
// server serves them and removes them when the test ends.
func (a *applier) installCRDs(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml.gz"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	crds := a.c.Dynamic.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, f := range files {
		for _, crd := range readManifests(t, f) {
			_, err := a.apply(ctx, "", crd)
			require.NoError(t, err, f)
			t.Cleanup(func() { _ = crds.Delete(context.Background(), crd.GetName(), metav1.DeleteOptions{}) })
			eventually(t, 30*time.Second, func() error {
				live, err := crds.Get(ctx, crd.GetName(), metav1.GetOptions{})
				if err != nil {
					return err
				}
				conds, _, _ := unstructured.NestedSlice(live.Object, "status", "conditions")
				for _, c := range conds {
					if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
						return nil
					}
				}
				return fmt.Errorf("CRD %s not established yet", crd.GetName())
			})
		}
	}
	a.mapper.Reset()
}

// readManifests decodes the objects of a gzipped YAML file.
func readManifests(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	dec := utilyaml.NewYAMLOrJSONDecoder(gz, 1<<16)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, path)
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// diffApplied lists the fields of want that got lacks or holds otherwise:
// the server may add fields (defaults, status), never drop or change one.
func diffApplied(path string, want, got any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: applied an object, read %v", path, got)}
		}
		var out []string
		for _, k := range slices.Sorted(maps.Keys(w)) {
			out = append(out, diffApplied(path+"."+k, w[k], g[k])...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: applied %d items, read %v", path, len(w), got)}
		}
		var out []string
		for i := range w {
			out = append(out, diffApplied(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
		}
		return out
	}
	if wn, ok := number(want); ok {
		if gn, ok := number(got); ok && wn == gn {
			return nil
		}
	} else if reflect.DeepEqual(want, got) {
		return nil
	}
	return []string{fmt.Sprintf("%s: applied %v, read %v", path, want, got)}
}

// number converts a decoded JSON number (float64 from YAML, int64 from the
// server's answer) to float64.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int64:
		return float64(n), true
	}
	return 0, false
}

// base64Data is a Secret's data as a manifest carries it.
func base64Data(data map[string][]byte) map[string]any {
	u, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&corev1.Secret{Data: data})
	return u["data"].(map[string]any)
}
