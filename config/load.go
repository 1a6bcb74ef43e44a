package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cast"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/jetway-ci/jetway/selection"
)

// FileFlag names the flag (and JETWAY_CONFIG) that points at the YAML file.
const FileFlag = "config"

// envPrefix prefixes every environment variable jetway reads.
const envPrefix = "JETWAY"

// RegisterFlags adds one flag per Config field to fs, with the field's
// default from Default and its help text, plus --config.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String(FileFlag, "", "optional YAML file with any of these settings (keys are the flag names)")
	def := reflect.ValueOf(Default())
	for _, f := range fields() {
		v := def.FieldByIndex(f.index)
		switch v.Interface().(type) {
		case string:
			fs.String(f.key, v.String(), f.help)
		case time.Duration:
			fs.Duration(f.key, time.Duration(v.Int()), f.help)
		case bool:
			fs.Bool(f.key, v.Bool(), f.help)
		case int:
			fs.Int(f.key, int(v.Int()), f.help)
		case []string:
			fs.StringSlice(f.key, v.Interface().([]string), f.help)
		case selection.Chain:
			fs.String(f.key, chainString(v.Interface().(selection.Chain)), f.help)
		case Bytes:
			fs.String(f.key, v.Interface().(Bytes).String(), f.help)
		default:
			panic(fmt.Sprintf("config: field %s has unsupported type %s", f.key, v.Type()))
		}
	}
}

// Load reads the configuration from fs (already parsed, with the flags of
// RegisterFlags), the environment and the file named by --config, then
// validates it. Every bad key is reported in one *Error.
func Load(fs *pflag.FlagSet) (Config, error) {
	v := viper.New()
	v.SetEnvPrefix(envPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	if err := v.BindPFlags(fs); err != nil {
		return Config{}, fmt.Errorf("bind flags: %w", err)
	}

	var probs []Problem
	if file := v.GetString(FileFlag); file != "" {
		probs = append(probs, readFile(v, file)...)
	}

	var c Config
	out := reflect.ValueOf(&c).Elem()
	for _, f := range fields() {
		if err := decode(out.FieldByIndex(f.index), v.Get(f.key)); err != nil {
			probs = append(probs, Problem{Key: f.key, Message: err.Error()})
		}
	}
	for _, d := range derived {
		if !v.IsSet(d.key) {
			d.derive(&c)
		}
	}
	if err := c.Validate(); err != nil {
		probs = append(probs, err.(*Error).Problems...)
	}
	if len(probs) > 0 {
		return Config{}, &Error{Problems: dedupe(probs)}
	}
	c.NoInputPlacementStrategy = c.NoInputChain()
	return c, nil
}

// derived are the defaults that follow another setting: a key the
// operator did not set (by flag, environment or file) is derived from the
// configuration as it is, so only values the operator set are judged
// against each other.
var derived = []struct {
	key    string
	derive func(*Config)
}{
	// A check must end before the next is due.
	{"health-timeout", func(c *Config) { c.HealthTimeout = min(Default().HealthTimeout, c.HealthInterval) }},
}

// readFile merges the YAML file into v and reports unknown keys, which are
// almost always typos an operator wants to hear about.
func readFile(v *viper.Viper, file string) []Problem {
	fv := viper.New()
	fv.SetConfigFile(file)
	fv.SetConfigType("yaml")
	if err := fv.ReadInConfig(); err != nil {
		return []Problem{{Key: FileFlag, Message: fmt.Sprintf("read %s: %v", file, err)}}
	}
	known := make(map[string]bool)
	for _, f := range fields() {
		known[f.key] = true
	}
	var probs []Problem
	for _, k := range fv.AllKeys() {
		if !known[k] {
			probs = append(probs, Problem{Key: k, Message: fmt.Sprintf("unknown key in %s", file)})
		}
	}
	if err := v.MergeConfigMap(fv.AllSettings()); err != nil {
		probs = append(probs, Problem{Key: FileFlag, Message: fmt.Sprintf("merge %s: %v", file, err)})
	}
	return probs
}

func decode(dst reflect.Value, raw any) error {
	var (
		val any
		err error
	)
	switch dst.Interface().(type) {
	case string:
		val, err = cast.ToStringE(raw)
	case time.Duration:
		val, err = cast.ToDurationE(raw)
		if err != nil {
			err = fmt.Errorf("%q is not a duration like 10s or 1m30s", fmt.Sprint(raw))
		}
	case bool:
		val, err = cast.ToBoolE(raw)
	case int:
		val, err = cast.ToIntE(raw)
	case []string:
		val, err = toStrings(raw)
	case selection.Chain:
		val, err = toChain(raw)
	case Bytes:
		val, err = toBytes(raw)
	}
	if err != nil {
		return err
	}
	dst.Set(reflect.ValueOf(val))
	return nil
}

// Bytes is a size in bytes, given as a whole number or with a suffix as
// Kubernetes quantities take them (64Mi, 32Gi, 1G).
type Bytes int64

// String is the size as a quantity: 32Gi.
func (b Bytes) String() string { return resource.NewQuantity(int64(b), resource.BinarySI).String() }

func toBytes(raw any) (Bytes, error) {
	s, err := cast.ToStringE(raw)
	if err != nil {
		return 0, err
	}
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a size like 32Gi or 1073741824", s)
	}
	return Bytes(q.Value()), nil
}

// toStrings accepts a YAML list or a comma-separated string (flags, env).
func toStrings(raw any) ([]string, error) {
	if s, ok := raw.(string); ok {
		if s == "" {
			return nil, nil
		}
		parts := strings.Split(s, ",")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		return parts, nil
	}
	return cast.ToStringSliceE(raw)
}

// toChain parses a strategy chain from a comma list (flags, env) or a YAML
// list. Empty is a nil chain, which Validate and NoInputChain interpret.
func toChain(raw any) (selection.Chain, error) {
	parts, err := toStrings(raw)
	if err != nil {
		return nil, err
	}
	if len(parts) == 0 {
		return nil, nil
	}
	chain, err := selection.ParseChain(strings.Join(parts, ","))
	if err != nil {
		return nil, err
	}
	return chain, nil
}

func chainString(c selection.Chain) string {
	parts := make([]string, len(c))
	for i, s := range c {
		parts[i] = string(s)
	}
	return strings.Join(parts, ",")
}

type field struct {
	key, help string
	index     []int
}

func fields() []field {
	t := reflect.TypeFor[Config]()
	out := make([]field, 0, t.NumField())
	for i := range t.NumField() {
		sf := t.Field(i)
		out = append(out, field{key: sf.Tag.Get("mapstructure"), help: sf.Tag.Get("help"), index: sf.Index})
	}
	return out
}

// dedupe drops a validation problem for a key that already failed to decode.
func dedupe(probs []Problem) []Problem {
	var out []Problem
	for _, p := range probs {
		if !slices.ContainsFunc(out, func(q Problem) bool { return q.Key == p.Key }) {
			out = append(out, p)
		}
	}
	return out
}
