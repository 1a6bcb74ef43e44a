// Package golist asks the go command what a package depends on, for the
// tests that keep jetway's packages apart (the client from Kubernetes,
// wire from everything, the pod library from the step engine).
package golist

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Deps lists the packages pkg depends on, itself included; with
// nonStandard, those outside the standard library only. It runs the go
// command offline (GOPROXY=off): the module's dependencies are in the
// module cache once it builds.
func Deps(t testing.TB, pkg string, nonStandard bool) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command must be on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := []string{"list", "-deps"}
	if nonStandard {
		args = append(args, "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}")
	}
	cmd := exec.CommandContext(ctx, goCmd, append(args, pkg)...)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}
