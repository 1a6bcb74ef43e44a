package steps

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/jetway-ci/jetway/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func validRequest() wire.Request {
	return wire.Request{Handle: "build-1", Type: "task", Image: "busybox", Run: wire.Run{Path: "sh", Args: []string{"-c", "true"}}}
}

func TestResourceStepsRunTheScripts(t *testing.T) {
	res := func(typ string) wire.Request {
		return wire.Request{Handle: "r", Type: typ, Image: "git-resource", Resource: &wire.Resource{Source: json.RawMessage(`{"uri":"x"}`)}}
	}
	get := res("get")
	get.Resource.Version = json.RawMessage(`{"ref":"b"}`)
	require.Nil(t, get.Validate())
	resourceRun(&get, "/opt/resource")
	assert.Equal(t, "/opt/resource/in", get.Run.Path)
	assert.Equal(t, []string{"resource"}, get.Run.Args)
	assert.Equal(t, []wire.Output{{Name: "resource", Path: "resource"}}, get.Outputs)
	assert.JSONEq(t, `{"source":{"uri":"x"},"version":{"ref":"b"},"params":{}}`, get.Stdin)
	put := res("put")
	resourceRun(&put, "/opt/resource")
	assert.Equal(t, []string{"."}, put.Run.Args, "out gets the build dir holding the inputs")
	assert.JSONEq(t, `{"source":{"uri":"x"},"params":{}}`, put.Stdin)
}

func TestResourceAnswers(t *testing.T) {
	for _, tt := range []struct {
		typ, out, err string
	}{
		{"check", `[{"ref":"a"}]`, ""},
		{"check", `[]`, ""},
		{"check", `{"ref":"a"}`, `check printed "{\"ref\":\"a\"}", not a JSON array of versions`},
		{"get", `{"version":{"ref":"a"},"metadata":[{"name":"n","value":"v"}]}`, ""},
		{"get", `{"metadata":[]}`, `in printed "{\"metadata\":[]}", not {"version": {...}, "metadata": [...]}`},
		{"put", "", `out printed "", not {"version": {...}, "metadata": [...]}`},
		{"put", strings.Repeat("x", 300), `out printed "` + strings.Repeat("x", 200) + `", not {"version": {...}, "metadata": [...]}`},
	} {
		_, err := resourceResult(tt.typ, []byte(tt.out))
		if tt.err == "" {
			assert.NoError(t, err, tt.out)
		} else {
			assert.EqualError(t, err, tt.err)
		}
	}
}

// wire checks quantities, label values and DNS labels without
// Kubernetes' packages: it must take what Kubernetes takes, or a step
// wire accepted would fail at its pod's creation.
func TestWireQuantitiesAreKubernetesQuantities(t *testing.T) {
	quantities := []string{"1", "0", "00", "-1", "+1", "500m", "0.5", ".5", "5.", ".", "", "+", "-",
		"2Gi", "1.5Gi", "1Ki", "1ki", "1k", "1K", "1M", "1Mi", "1E", "1Ei", "1P", "1n", "1u", "0.000001n",
		"1e3", "1E3", "1e-3", "1e+3", "1e", "1e+", "1Ee", "1e99999999999", "1e2147483647", "1e9999999999999999999", "1i", "1m+5",
		"lots", "1 ", " 1", "1.5.5", "0x10", "1_000", "0m", "0.0Gi", "-0.5", "+.5Ki", "99999999999999999999999",
		"1Gi1", "1GiB", "١"}
	for _, q := range quantities {
		v, err := resource.ParseQuantity(q)
		want := err == nil && v.Sign() > 0
		r := validRequest()
		r.Resources.CPU = q
		ferr := r.Validate()
		if q == "" {
			continue // empty: no request, valid by design
		}
		assert.Equal(t, want, ferr == nil, "quantity %q: kubernetes says %v (%v), wire says %v", q, want, err, ferr)
	}
	names := []string{"a", "main", "a-b", "a_b", "a.b", "A", "-a", "a-", "1", strings.Repeat("a", 63), strings.Repeat("a", 64), "a b", "é", ""}
	for _, name := range names {
		r := validRequest()
		r.Team = name
		ferr := r.Validate()
		assert.Equal(t, len(validation.IsValidLabelValue(name)) == 0, ferr == nil, "team %q: %v", name, ferr)
		r = validRequest()
		r.Outputs = []wire.Output{{Name: name, Path: "out"}}
		ferr = r.Validate()
		assert.Equal(t, len(validation.IsDNS1123Label(name)) == 0, ferr == nil, "output name %q: %v", name, ferr)
	}
}
