package concourse

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// binaries finds concourse, fly and PostgreSQL, naming everything missing
// at once.
func binaries(opts Options) (concourseBin, flyBin, pgBin string, err error) {
	var problems []error
	find := func(given, env, name, makeVar string) string {
		path := given
		if path == "" {
			path = os.Getenv(env)
		}
		if path == "" {
			root, err := cluster.ModuleRoot()
			if err != nil {
				problems = append(problems, fmt.Errorf("%w: %w; set %s and %s", ErrMissing, err, EnvConcourseBin, EnvFlyBin))
				return ""
			}
			path = filepath.Join(filepath.Dir(root), "shared", "concourse", "bin", name)
		}
		if _, err := os.Stat(path); err != nil {
			problems = append(problems, fmt.Errorf("%w: Concourse v8.2.5's %s is not at %s: set %s (make) or %s (go test) to it",
				ErrMissing, name, path, makeVar, env))
		}
		return path
	}
	concourseBin = find(opts.ConcourseBin, EnvConcourseBin, "concourse", "CONCOURSE_BIN")
	flyBin = find(opts.FlyBin, EnvFlyBin, "fly", "FLY_BIN")
	pgBin, err = postgresBinDir(opts.PostgresBinDir)
	if err != nil {
		problems = append(problems, err)
	}
	return concourseBin, flyBin, pgBin, errors.Join(problems...)
}
