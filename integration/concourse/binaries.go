package concourse

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
			root, err := moduleRoot()
			if err != nil {
				problems = append(problems, err)
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

// moduleRoot is the folder of jetway's go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/jetway-ci/jetway\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no jetway go.mod above the working directory; set %s and %s", ErrMissing, EnvConcourseBin, EnvFlyBin)
		}
		dir = parent
	}
}
