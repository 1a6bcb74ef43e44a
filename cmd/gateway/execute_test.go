package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fullTask = `platform: linux
image_resource:
  type: registry-image
  source: {repository: golang, tag: ((tag)), username: u}
inputs:
- name: src
- {name: lib, path: deps/lib, optional: true}
outputs: [{name: out}]
caches: [{path: .cache}]
container_limits: {cpu: 1024}
params:
  GOFLAGS: -mod=mod
  N: 3
  DEBUG: true
  EMPTY:
  MAP: {a: 1}
  MSG: ((msg))
run: {path: go, args: [test, "((pkg))"], dir: src, user: root}
`

func TestTaskConfig(t *testing.T) {
	cfg, err := parseTaskConfig([]byte(fullTask), map[string]string{"tag": "1.26", "msg": "a: b\nc", "pkg": "./..."})
	require.NoError(t, err)
	assert.Equal(t, "golang:1.26", cfg.image())
	assert.Equal(t, []taskInput{{Name: "src", Path: "src"}, {Name: "lib", Path: "deps/lib", Optional: true}}, cfg.Inputs)
	assert.Equal(t, []taskOutput{{Name: "out", Path: "out"}}, cfg.Outputs)
	assert.Equal(t, taskRun{Path: "go", Args: []string{"test", "./..."}, Dir: "src", User: "root"}, cfg.Run)
	env := cfg.env(func(name string) (string, bool) { return "from-env", name == "N" })
	assert.Equal(t, map[string]string{"GOFLAGS": "-mod=mod", "N": "from-env", "DEBUG": "true", "EMPTY": "",
		"MAP": `{"a":1}`, "MSG": "a: b\nc"}, env)
	assert.Equal(t, []string{"caches are not supported by jetway; ignoring cache .cache", "container_limits are ignored by jetway"}, cfg.warnings())

	digest := "platform: linux\nimage_resource: {type: docker-image, source: {repository: r}, version: {digest: 'sha256:ab'}}\nrun: {path: x}\n"
	cfg, err = parseTaskConfig([]byte(digest), nil)
	require.NoError(t, err)
	assert.Equal(t, "r@sha256:ab", cfg.image())
	cfg, err = parseTaskConfig([]byte("platform: linux\nimage_resource: {type: registry-image, source: {repository: r}}\nrun: {path: x}\n"), nil)
	require.NoError(t, err)
	assert.Equal(t, "r:latest", cfg.image())
	cfg, err = parseTaskConfig([]byte("platform: darwin\nrun: {path: xcodebuild}\n"), nil)
	require.NoError(t, err, "a task for an agent needs no image")
	assert.Empty(t, cfg.image())
}

func TestTaskConfigErrors(t *testing.T) {
	const image = "image_resource: {type: registry-image, source: {repository: r}}\n"
	for want, doc := range map[string]string{
		"needs values for ((msg)), ((pkg)), ((tag)): give -v msg=VALUE -v pkg=VALUE -v tag=VALUE": fullTask,
		`line 1: unknown key "plaform"`:                                "plaform: linux\n",
		`line 4: unknown key "pth" in run`:                             "platform: linux\n" + image + "run:\n  pth: x\n",
		`line 5: unknown key "nme" in inputs`:                          "platform: linux\n" + image + "inputs:\n- name: a\n- nme: b\nrun: {path: x}\n",
		"platform is required":                                         image + "run: {path: x}\n",
		"rootfs_uri is not supported by jetway":                        "platform: linux\nrootfs_uri: docker:///x\nrun: {path: x}\n",
		"image_resource is required (only a task for another platform": "platform: linux\nrun: {path: x}\n",
		`image_resource.type "git" is not supported`:                   "platform: linux\nimage_resource: {type: git, source: {repository: r}}\nrun: {path: x}\n",
		"image_resource.source.repository is required":                 "platform: linux\nimage_resource: {type: registry-image, source: {}}\nrun: {path: x}\n",
		"run.path is required":                                         "platform: linux\n" + image + "run: {}\n",
		`input name "Src" must be lower-case`:                          "platform: linux\n" + image + "inputs: [{name: Src}]\nrun: {path: x}\n",
		`output name "a" is used twice`:                                "platform: linux\n" + image + "inputs: [{name: a}]\noutputs: [{name: a}]\nrun: {path: x}\n",
		`path "../up" must be a clean relative path`:                   "platform: linux\n" + image + "inputs: [{name: a, path: ../up}]\nrun: {path: x}\n",
		`path "a/b" overlaps input a`:                                  "platform: linux\n" + image + "inputs: [{name: a}]\noutputs: [{name: b, path: a/b}]\nrun: {path: x}\n",
		`param "BAD-NAME" is not an environment variable name`:         "platform: linux\n" + image + "params: {BAD-NAME: x}\nrun: {path: x}\n",
		"not a mapping":                                                "- a\n",
	} {
		_, err := parseTaskConfig([]byte(doc), nil)
		assert.ErrorContains(t, err, want)
	}
}

// TestExecuteChecksBeforeCreating: bad configs and command lines are
// refused with status 2 before the gateway is called (its URL answers
// nothing here).
func TestExecuteChecksBeforeCreating(t *testing.T) {
	work := t.TempDir()
	task := `platform: linux
image_resource: {type: registry-image, source: {repository: busybox}}
inputs: [{name: src}, {name: lib}]
outputs: [{name: out}]
run: {path: sh}
`
	require.NoError(t, os.WriteFile(filepath.Join(work, "task.yml"), []byte(task), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "bad.yml"), []byte("platform: linux\nimage: x\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(work, "src"), 0o755))
	cfg := filepath.Join(work, "task.yml")
	src := filepath.Join(work, "src")
	for want, args := range map[string][]string{
		`the task needs input "lib": give -i lib=DIR`:                    {"-c", cfg, "-i", "src=" + src},
		`input lib: ` + filepath.Join(work, "nope") + ` is not a folder`: {"-c", cfg, "-i", "src=" + src, "-i", "lib=" + filepath.Join(work, "nope")},
		`-i docs: the task has no input "docs" (it has: src, lib)`:       {"-c", cfg, "-i", "docs=" + src},
		`-o bin: the task has no output "bin" (it has: out)`:             {"-c", cfg, "-i", "src=" + src, "-i", "lib=" + src, "-o", "bin=x"},
		`line 2: unknown key "image"`:                                    {"-c", filepath.Join(work, "bad.yml")},
		`-v "novalue": want name=value`:                                  {"-c", cfg, "-v", "novalue"},
		"-c task.yml is required":                                        {},
		`--max-output-size "lots": want a positive size like 32Gi`:       {"-c", cfg, "-i", "src=" + src, "-i", "lib=" + src, "--max-output-size", "lots"},
		`--max-output-entries 0: want a positive number`:                 {"-c", cfg, "-i", "src=" + src, "-i", "lib=" + src, "--max-output-entries", "0"},
	} {
		var stdout, stderr bytes.Buffer
		code := execute(append([]string{"execute", "--url", "http://127.0.0.1:1"}, args...), &stdout, &stderr)
		assert.Equal(t, exitUsage, code, "%v: %s", args, stderr.String())
		assert.Contains(t, stderr.String(), want)
		assert.NotContains(t, stderr.String(), "127.0.0.1:1", "nothing was asked of the gateway")
	}
}
