package concourse

import (
	"slices"
	"strings"

	"github.com/jetway-ci/jetway/wire"
)

// BundledResourceTypes are the base resource types a stock Concourse
// v8.2.5 worker offers, at the versions that release bundles (the 8.2.x
// release pipeline's pins in concourse/ci's pipelines/reconfigure.yml),
// each as Docker Hub's image of that version: what a stock worker
// registers from its resource_metadata.json files. docker-image runs its
// own Docker daemon (privileged); time keeps a version history per
// resource (unique_version_history).
var BundledResourceTypes = []wire.ResourceType{
	bundled("bosh-io-release", "1.3.4"),
	bundled("bosh-io-stemcell", "1.5.4"),
	{Type: "docker-image", Image: bundledImage("docker-image", "1.13.1"), Version: "1.13.1", Privileged: true},
	bundled("git", "1.22.3"),
	bundled("github-release", "1.14.0"),
	bundled("hg", "1.5.4"),
	bundled("mock", "0.14.5"),
	bundled("pool", "1.8.1"),
	bundled("registry-image", "1.17.0"),
	bundled("s3", "2.5.4"),
	bundled("semver", "2.0.1"),
	{Type: "time", Image: bundledImage("time", "1.11.3"), Version: "1.11.3", UniqueVersionHistory: true},
}

func bundled(typ, version string) wire.ResourceType {
	return wire.ResourceType{Type: typ, Image: bundledImage(typ, version), Version: version}
}

// bundledImage is Docker Hub's image of version of Concourse's resource
// type typ.
func bundledImage(typ, version string) string {
	return "docker.io/concourse/" + typ + "-resource:" + version
}

// WithBundled is types and the bundled ones they do not name: a type
// the operator maps is theirs, whatever it bundles.
func WithBundled(types []wire.ResourceType) []wire.ResourceType {
	out := slices.Clone(types)
	for _, b := range BundledResourceTypes {
		if !slices.ContainsFunc(types, func(rt wire.ResourceType) bool { return rt.Type == b.Type }) {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b wire.ResourceType) int { return strings.Compare(a.Type, b.Type) })
	return out
}
