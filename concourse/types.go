package concourse

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/jetway-ci/jetway/wire"
)

// LoadResourceTypes reads the base resource types the workers offer
// (--concourse-resource-types): a YAML map of type name to its image
// reference, e.g. `registry-image: docker.io/concourse/registry-image-resource:1.14.2`,
// or to what a stock worker's resource_metadata.json says of it beside
// its image (version, privileged, unique_version_history):
//
//	time:
//	  image: docker.io/concourse/time-resource:1.8.0
//	  version: 1.8.0
//	  unique_version_history: true
//
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
	var m map[string]json.RawMessage
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		return nil, fmt.Errorf("resource types %s: want a map of type to image reference: %w", path, err)
	}
	var out []wire.ResourceType
	var probs []string
	for typ, raw := range m {
		rt, err := resourceType(typ, raw)
		if err != nil {
			probs = append(probs, err.Error())
			continue
		}
		out = append(out, rt)
	}
	if len(probs) > 0 {
		slices.Sort(probs)
		return nil, fmt.Errorf("resource types %s: %s", path, strings.Join(probs, "; "))
	}
	slices.SortFunc(out, func(a, b wire.ResourceType) int { return strings.Compare(a.Type, b.Type) })
	return out, nil
}

// resourceType is type typ as raw declares it: an image reference, or an
// object of resource_metadata.json's fields but type.
func resourceType(typ string, raw json.RawMessage) (wire.ResourceType, error) {
	rt := wire.ResourceType{Type: typ}
	if typ == "" || strings.ContainsAny(typ, " \t/") {
		return rt, fmt.Errorf("%q is not a resource type name", typ)
	}
	if err := json.Unmarshal(raw, &rt.Image); err != nil {
		var meta struct {
			Image                string `json:"image"`
			Version              string `json:"version"`
			Privileged           bool   `json:"privileged"`
			UniqueVersionHistory bool   `json:"unique_version_history"`
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&meta); err != nil {
			return rt, fmt.Errorf("%s: want an image reference, or image with version, privileged and unique_version_history: %v", typ, err)
		}
		rt.Image, rt.Version, rt.Privileged, rt.UniqueVersionHistory = meta.Image, meta.Version, meta.Privileged, meta.UniqueVersionHistory
	}
	if strings.TrimSpace(rt.Image) == "" {
		return rt, fmt.Errorf("%s: no image", typ)
	}
	return rt, nil
}
