// Package helm renders jetway's Helm chart (the jetway folder beside this
// file) with Helm's own library, as `helm install` does, for the tests that
// lint it, check the objects it makes and apply them to a real API server.
// The gateway does not use it.
package helm

import (
	"bufio"
	"cmp"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// chartDir is the chart's folder, beside this file.
const chartDir = "jetway"

// KubeVersion is the Kubernetes version Render assumes when the release
// names none: that of the control planes the integration tests run
// (KUBE_VERSION in the Makefile).
const KubeVersion = "v1.36.3"

//go:embed all:jetway
var files embed.FS

// Load returns the chart as Helm loads it from its files.
func Load() (*chart.Chart, error) {
	var buffered []*loader.BufferedFile
	err := fs.WalkDir(files, chartDir, func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := files.ReadFile(name)
		if err != nil {
			return err
		}
		buffered = append(buffered, &loader.BufferedFile{Name: strings.TrimPrefix(name, chartDir+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read chart: %w", err)
	}
	ch, err := loader.LoadFiles(buffered)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	return ch, nil
}

// CIValues returns the chart's test value sets (ci/*-values.yaml, the
// convention of Helm's chart-testing) by file name.
func CIValues() (map[string]map[string]any, error) {
	entries, err := files.ReadDir(path.Join(chartDir, "ci"))
	if err != nil {
		return nil, err
	}
	sets := make(map[string]map[string]any, len(entries))
	for _, e := range entries {
		data, err := files.ReadFile(path.Join(chartDir, "ci", e.Name()))
		if err != nil {
			return nil, err
		}
		vals, err := chartutil.ReadValues(data)
		if err != nil {
			return nil, fmt.Errorf("ci/%s: %w", e.Name(), err)
		}
		sets[e.Name()] = vals.AsMap()
	}
	return sets, nil
}

// Release is one rendering of the chart.
type Release struct {
	Name, Namespace string
	// Values are the user's values, over the chart's values.yaml.
	Values map[string]any
	// Upgrade renders an upgrade of an installed release, else an install.
	Upgrade bool
	// Cluster, when set, is what the chart's lookup calls read (the mesh CA
	// it keeps across upgrades). Nil finds nothing, as `helm template`.
	Cluster *rest.Config
	// KubeVersion is the cluster's version; default KubeVersion.
	KubeVersion string
}

// Rendered is what Render makes of a release.
type Rendered struct {
	// Objects are the manifests in the order `helm install` applies them.
	Objects []*unstructured.Unstructured
	// Notes is NOTES.txt as `helm install` prints it.
	Notes string
}

// Render renders r as Helm would install it: values checked against the
// chart's schema, the chart's kubeVersion against r's, templates rendered,
// manifests split and sorted into install order.
func Render(r Release) (*Rendered, error) {
	ch, err := Load()
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(cmp.Or(r.KubeVersion, KubeVersion))
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	if c := ch.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kv.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, the cluster runs %s", c, kv)
	}
	opts := chartutil.ReleaseOptions{Name: r.Name, Namespace: r.Namespace, Revision: 1, IsInstall: !r.Upgrade, IsUpgrade: r.Upgrade}
	if r.Upgrade {
		opts.Revision = 2
	}
	vals, err := chartutil.ToRenderValues(ch, r.Values, opts, caps)
	if err != nil {
		return nil, err
	}
	var e engine.Engine
	if r.Cluster != nil {
		e = engine.New(r.Cluster)
	}
	out, err := e.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	var res Rendered
	for name, content := range out {
		if strings.HasSuffix(name, "NOTES.txt") {
			res.Notes = content
			delete(out, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(out, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return nil, err
	}
	if len(hooks) > 0 {
		return nil, errors.New("the chart has hooks, which Render does not return")
	}
	for _, m := range manifests {
		objs, err := decode(m.Content)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
		res.Objects = append(res.Objects, objs...)
	}
	return &res, nil
}

// decode parses the YAML documents of one manifest, skipping empty ones.
func decode(manifest string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, err
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}
