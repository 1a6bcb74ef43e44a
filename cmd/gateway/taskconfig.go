package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/util/validation"
)

// taskConfig is a Concourse task config, what `fly execute -c` reads.
type taskConfig struct {
	Platform      string                  `yaml:"platform"`
	ImageResource *imageResource          `yaml:"image_resource"`
	RootfsURI     string                  `yaml:"rootfs_uri"`
	Inputs        []taskInput             `yaml:"inputs"`
	Outputs       []taskOutput            `yaml:"outputs"`
	Caches        []struct{ Path string } `yaml:"caches"`
	Params        map[string]yaml.Node    `yaml:"params"`
	Run           taskRun                 `yaml:"run"`
	Limits        map[string]any          `yaml:"container_limits"`
}

type imageResource struct {
	Type    string            `yaml:"type"`
	Source  map[string]any    `yaml:"source"`
	Params  map[string]any    `yaml:"params"`
	Version map[string]string `yaml:"version"`
}

type taskInput struct {
	Name     string `yaml:"name"`
	Path     string `yaml:"path"`
	Optional bool   `yaml:"optional"`
}

type taskOutput struct {
	Name string `yaml:"name"`
	Path string `yaml:"path"`
}

type taskRun struct {
	Path string   `yaml:"path"`
	Args []string `yaml:"args"`
	Dir  string   `yaml:"dir"`
	User string   `yaml:"user"`
}

// varRef is ((name)) in a config.
var varRef = regexp.MustCompile(`\(\(([A-Za-z0-9_.-]+)\)\)`)

// parseTaskConfig reads a task config strictly (an unknown key is an
// error naming it and its line), filling ((name)) from vars first.
func parseTaskConfig(raw []byte, vars map[string]string) (*taskConfig, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("task config: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("task config: not a mapping of keys (platform, image_resource, run, ...)")
	}
	var missing []string
	fill(doc.Content[0], vars, &missing)
	if len(missing) > 0 {
		slices.Sort(missing)
		missing = slices.Compact(missing)
		var refs, flags []string
		for _, m := range missing {
			refs, flags = append(refs, "(("+m+"))"), append(flags, "-v "+m+"=VALUE")
		}
		return nil, fmt.Errorf("task config needs values for %s: give %s", strings.Join(refs, ", "), strings.Join(flags, " "))
	}
	// Unknown keys first, with their lines in the file as written.
	if err := unknownKeys(doc.Content[0]); err != nil {
		return nil, err
	}
	filled, err := yaml.Marshal(doc.Content[0])
	if err != nil {
		return nil, fmt.Errorf("task config: %w", err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(filled)))
	dec.KnownFields(true)
	var c taskConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("task config: %s", strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n  "))
	}
	return &c, c.validate()
}

// unknownKeys reports the first unknown key with its line in the
// original document (the decoder's line is of the re-encoded one).
func unknownKeys(top *yaml.Node) error {
	known := map[string][]string{
		"":               {"platform", "image_resource", "rootfs_uri", "inputs", "outputs", "caches", "params", "run", "container_limits"},
		"image_resource": {"type", "source", "params", "version"},
		"inputs":         {"name", "path", "optional"},
		"outputs":        {"name", "path"},
		"caches":         {"path"},
		"run":            {"path", "args", "dir", "user"},
	}
	check := func(n *yaml.Node, where string) error {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if !slices.Contains(known[where], k.Value) {
				in := ""
				if where != "" {
					in = " in " + where
				}
				return fmt.Errorf("task config line %d: unknown key %q%s", k.Line, k.Value, in)
			}
		}
		return nil
	}
	if err := check(top, ""); err != nil {
		return err
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		key, val := top.Content[i].Value, top.Content[i+1]
		switch key {
		case "image_resource", "run":
			if err := check(val, key); err != nil {
				return err
			}
		case "inputs", "outputs", "caches":
			for _, item := range val.Content {
				if err := check(item, key); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// fill replaces ((name)) in the scalar values under n; names without a
// value go to missing.
func fill(n *yaml.Node, vars map[string]string, missing *[]string) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			fill(n.Content[i], vars, missing)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			fill(c, vars, missing)
		}
	case yaml.ScalarNode:
		if !varRef.MatchString(n.Value) {
			return
		}
		whole := varRef.FindString(n.Value) == n.Value
		n.Value = varRef.ReplaceAllStringFunc(n.Value, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := vars[name]
			if !ok {
				*missing = append(*missing, name)
			}
			return v
		})
		if whole {
			n.Tag, n.Style = "!!str", 0
		}
	}
}

func (c *taskConfig) validate() error {
	switch {
	case c.Platform == "":
		return errors.New("task config: platform is required (linux)")
	case c.RootfsURI != "":
		return errors.New("task config: rootfs_uri is not supported by jetway: give image_resource")
	case c.ImageResource == nil && c.Platform == "linux":
		return errors.New("task config: image_resource is required (only a task for another platform, which an agent runs, may omit it)")
	case c.ImageResource == nil:
	case c.ImageResource.Type != "registry-image" && c.ImageResource.Type != "docker-image":
		return fmt.Errorf("task config: image_resource.type %q is not supported: registry-image (or docker-image)", c.ImageResource.Type)
	case c.ImageResource.repository() == "":
		return errors.New("task config: image_resource.source.repository is required")
	case c.Run.Path == "":
		return errors.New("task config: run.path is required")
	}
	if c.Run.Dir != "" && !localPath(c.Run.Dir) {
		return fmt.Errorf("task config: run.dir %q must be a clean relative path inside the task's folder", c.Run.Dir)
	}
	names, paths := map[string]bool{}, map[string]string{}
	claim := func(field, name, p string) error {
		if len(validation.IsDNS1123Label(name)) > 0 {
			return fmt.Errorf("task config: %s name %q must be lower-case letters, digits and '-' (a DNS label; jetway names volumes after it)", field, name)
		}
		if names[name] {
			return fmt.Errorf("task config: %s name %q is used twice", field, name)
		}
		if !localPath(p) || p == "." {
			return fmt.Errorf("task config: %s %s: path %q must be a clean relative path inside the task's folder", field, name, p)
		}
		for q, other := range paths {
			if q == p || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return fmt.Errorf("task config: %s %s: path %q overlaps %s", field, name, p, other)
			}
		}
		names[name], paths[p] = true, field+" "+name
		return nil
	}
	for i := range c.Inputs {
		in := &c.Inputs[i]
		in.Path = cmp.Or(in.Path, in.Name)
		if err := claim("input", in.Name, in.Path); err != nil {
			return err
		}
	}
	for i := range c.Outputs {
		out := &c.Outputs[i]
		out.Path = cmp.Or(out.Path, out.Name)
		if err := claim("output", out.Name, out.Path); err != nil {
			return err
		}
	}
	for name := range c.Params {
		if !envVar.MatchString(name) {
			return fmt.Errorf("task config: param %q is not an environment variable name", name)
		}
	}
	return nil
}

var envVar = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func localPath(p string) bool {
	return !path.IsAbs(p) && path.Clean(p) == p && p != ".." && !strings.HasPrefix(p, "../")
}

func (r *imageResource) repository() string { s, _ := r.Source["repository"].(string); return s }

// image is the step's image: repository@digest, or repository:tag
// (default latest); none for a task without image_resource (an agent's).
func (c *taskConfig) image() string {
	r := c.ImageResource
	if r == nil {
		return "" // a task for an agent: a process on its machine
	}
	if d := r.Version["digest"]; d != "" {
		return r.repository() + "@" + d
	}
	tag := "latest"
	if t, ok := r.Source["tag"]; ok && fmt.Sprint(t) != "" {
		tag = fmt.Sprint(t)
	}
	return r.repository() + ":" + tag
}

// env is the process's environment: the params, each overridden by an
// environment variable of its name where set, as fly does. Scalars are
// taken as written; maps and lists as JSON.
func (c *taskConfig) env(lookup func(string) (string, bool)) map[string]string {
	out := map[string]string{}
	for name, n := range c.Params {
		if v, ok := lookup(name); ok {
			out[name] = v
			continue
		}
		switch {
		case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
			out[name] = ""
		case n.Kind == yaml.ScalarNode:
			out[name] = n.Value
		default:
			var v any
			_ = n.Decode(&v)
			b, _ := json.Marshal(v)
			out[name] = string(b)
		}
	}
	return out
}

// warnings name what the config asks that jetway ignores.
func (c *taskConfig) warnings() []string {
	var w []string
	for _, cache := range c.Caches {
		w = append(w, "caches are not supported by jetway; ignoring cache "+cache.Path)
	}
	if len(c.Limits) > 0 {
		w = append(w, "container_limits are ignored by jetway")
	}
	return w
}
