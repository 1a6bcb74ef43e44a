package bench

import (
	"context"
	"net/http"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/jetway-ci/jetway/integration/cluster"
	"github.com/jetway-ci/jetway/targets"
)

// BenchmarkCheckPaths compares, in one run against one real API server,
// jetway's check (readiness, then one SelfSubjectRulesReview) with the
// direct way (readiness, then one SelfSubjectAccessReview per required
// permission), and reports the ratio of their times.
func BenchmarkCheckPaths(b *testing.B) {
	ctx := context.Background()
	c := cluster.ForTest(b, 1)[0]
	tg, err := c.CreateTarget(ctx, cluster.TargetOptions{Namespace: "paths", Rules: targets.RBACRules(targets.Required)})
	if err != nil {
		b.Fatal(err)
	}
	src := targets.NewSource(targets.SourceOptions{Dir: writeTarget(b, tg.Kubeconfig)}, nil)
	results, _, err := src.Read()
	if err != nil || results["t"].Err != nil {
		b.Fatalf("read target: %v %v", err, results["t"].Err)
	}
	cfg := results["t"].Config
	rc, err := clientcmd.RESTConfigFromKubeConfig(tg.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	rc.QPS, rc.Burst = -1, 0
	client := kubernetes.NewForConfigOrDie(rc)

	jetway := func() {
		if h := targets.Check(ctx, cfg, 5*time.Second, ""); !h.OK() {
			b.Fatalf("check: %s", h.Describe())
		}
	}
	direct := func() {
		var code int
		client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&code)
		if code != http.StatusOK {
			b.Fatalf("readyz: %d", code)
		}
		for _, p := range targets.Required {
			r, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: "paths", Verb: p.Verb, Group: p.Group, Resource: p.Resource, Subresource: p.Subresource}},
			}, metav1.CreateOptions{})
			if err != nil || !r.Status.Allowed {
				b.Fatalf("review %s: %v", p, err)
			}
		}
	}
	jetway() // warm connections
	direct()
	b.ResetTimer()
	var tj, td time.Duration
	for range b.N {
		start := time.Now()
		jetway()
		tj += time.Since(start)
		start = time.Now()
		direct()
		td += time.Since(start)
	}
	b.ReportMetric(float64(tj.Microseconds())/float64(b.N), "jetway-µs/check")
	b.ReportMetric(float64(td.Microseconds())/float64(b.N), "direct-µs/check")
	b.ReportMetric(float64(td)/float64(tj), "direct/jetway")
	b.ReportMetric(float64(1+len(targets.Required))/2, "requests-saved-x")
}

func writeTarget(b *testing.B, kubeconfig []byte) string {
	dir := b.TempDir()
	if err := writeFile(dir+"/t.kubeconfig", kubeconfig); err != nil {
		b.Fatal(err)
	}
	return dir
}
