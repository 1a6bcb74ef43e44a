package concourse

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/wire"
)

// LoadResourceTypes reads the base resource types the workers offer
// (--concourse-resource-types): a YAML map of type name to image
// reference, e.g. `registry-image: docker.io/concourse/registry-image-resource:1.14.2`.
// The web node passes the image back when it runs the type; jetway runs
// it as that image.
func LoadResourceTypes(path string) ([]wire.ResourceType, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("resource types: %w", err)
	}
	var m map[string]string
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		return nil, fmt.Errorf("resource types %s: want a map of type to image reference: %w", path, err)
	}
	var out []wire.ResourceType
	var probs []string
	for typ, image := range m {
		switch {
		case typ == "" || strings.ContainsAny(typ, " \t/"):
			probs = append(probs, fmt.Sprintf("%q is not a resource type name", typ))
		case strings.TrimSpace(image) == "":
			probs = append(probs, fmt.Sprintf("%s: no image", typ))
		default:
			out = append(out, wire.ResourceType{Type: typ, Image: image})
		}
	}
	if len(probs) > 0 {
		slices.Sort(probs)
		return nil, fmt.Errorf("resource types %s: %s", path, strings.Join(probs, "; "))
	}
	slices.SortFunc(out, func(a, b wire.ResourceType) int { return strings.Compare(a.Type, b.Type) })
	return out, nil
}
