package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The stand-in for Concourse's registry-image resource
// (../testdata/registry-image, the scripts of jetway.test/registry-image:1),
// run by the busybox the image holds against the registry: with the
// source's username and password it reads NodeRegistry/private/; without
// them, or with a wrong password, check and in fail saying what the
// registry answered, and the password is never in what they print.
func TestRegistryImageStandIn(t *testing.T) {
	r := testRegistry(t)
	srv := httptest.NewServer(r)
	defer srv.Close()
	digest := digestOf(r.manifests["busybox:1"])
	run := busyboxScripts(t)
	source := func(repository, user, password string) map[string]any {
		s := map[string]any{"repository": NodeRegistry + "/" + repository, "tag": "1", "mirror": srv.URL}
		if user != "" {
			s["username"], s["password"] = user, password
		}
		return s
	}

	t.Run("with the credentials", func(t *testing.T) {
		private := source(PrivateRepository+"busybox", PrivateUser, PrivatePassword)
		out, errs, err := run("check", "", map[string]any{"source": private})
		require.NoError(t, err, errs)
		assert.JSONEq(t, `[{"digest":"`+digest+`"}]`, out)

		dest := t.TempDir()
		out, errs, err = run("in", dest, map[string]any{"source": private, "version": map[string]string{"digest": digest}})
		require.NoError(t, err, errs)
		assert.Contains(t, out, `"digest":"`+digest+`"`)
		assert.Contains(t, errs, "with its layers")
		hello, err := os.ReadFile(filepath.Join(dest, "rootfs", "etc", "hello"))
		require.NoError(t, err)
		assert.Equal(t, "hi\n", string(hello), "the layer, unpacked")
		assert.NotContains(t, out+errs, PrivatePassword)
	})
	t.Run("public without credentials", func(t *testing.T) {
		out, errs, err := run("in", t.TempDir(), map[string]any{"source": source("busybox", "", ""),
			"version": map[string]string{"digest": digest}})
		require.NoError(t, err, errs)
		assert.Contains(t, out, `"digest":"`+digest+`"`)
	})
	for name, s := range map[string]map[string]any{
		"without credentials": source(PrivateRepository+"busybox", "", ""),
		"wrong password":      source(PrivateRepository+"busybox", PrivateUser, "not-the-password"),
	} {
		t.Run(name, func(t *testing.T) {
			_, errs, err := run("check", "", map[string]any{"source": s})
			require.Error(t, err)
			assert.Equal(t, `check: registry.jetway.test answered 401 Unauthorized for private/busybox/manifests/1`+"\n", errs)

			out, errs, err := run("in", t.TempDir(), map[string]any{"source": s, "version": map[string]string{"digest": digest}})
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s%s", out, errs)
			assert.Equal(t, 1, exit.ExitCode())
			assert.Equal(t, `in: registry.jetway.test answered 401 Unauthorized for private/busybox/manifests/`+digest+"\n", errs)
			assert.Empty(t, out)
		})
	}
	t.Run("registry unreachable", func(t *testing.T) {
		gone := httptest.NewServer(r)
		gone.Close()
		s := source("busybox", "", "")
		s["mirror"] = gone.URL
		_, errs, err := run("check", "", map[string]any{"source": s})
		require.Error(t, err)
		assert.Regexp(t, `^check: cannot read busybox/manifests/1 from registry.jetway.test at `+regexp.QuoteMeta(gone.URL)+`: wget: can't connect .*refused\n$`, errs)
	})
}

// busyboxScripts runs the stand-in's scripts with the machine's busybox
// (Debian's busybox-static, the one the image holds) for each command:
// the script's stdout and stderr, and how it exited.
func busyboxScripts(t *testing.T) func(script, dest string, request map[string]any) (string, string, error) {
	t.Helper()
	require.FileExists(t, "/bin/busybox", "Debian's busybox-static: make tools installs it")
	applets := t.TempDir()
	install := exec.Command("/bin/busybox", "--install", "-s", applets)
	out, err := install.CombinedOutput()
	require.NoError(t, err, string(out))
	scripts, err := filepath.Abs("../testdata/registry-image")
	require.NoError(t, err)
	return func(script, dest string, request map[string]any) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		input, err := json.Marshal(request)
		require.NoError(t, err)
		cmd := exec.CommandContext(ctx, "/bin/busybox", "sh", filepath.Join(scripts, script), dest)
		cmd.Env = []string{"PATH=" + applets, "TMPDIR=" + t.TempDir()}
		cmd.Stdin = bytes.NewReader(input)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		return stdout.String(), stderr.String(), err
	}
}
