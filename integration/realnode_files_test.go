package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cwn "github.com/jetway-ci/jetway/integration/concourse"
	"github.com/jetway-ci/jetway/wire"
)

// filesScript, run as root in a task, leaves in tree what real pipelines
// carry and the tests' images never did: a root-only folder and file, a
// file owned by uid 1000, setuid, setgid and sticky modes, a hard link, a
// relative and an absolute symbolic link, an empty folder, an old
// modification time, a FIFO; then it writes each entry's stat line
// (filesStat) to expect/stat.
const filesScript = `cd tree
mkdir d700; echo secret > d700/key; chmod 600 d700/key; chmod 700 d700
echo key > k600; chmod 600 k600
echo theirs > u1000; chown 1000:1001 u1000
mkdir home; echo cfg > home/cfg; chown -R 1000:1000 home; chmod 750 home
echo s > suid; chmod 4755 suid
echo g > sgid; chmod 2750 sgid
mkdir sticky; chmod 1777 sticky
echo linked > a; ln a hard
ln -s a sym; ln -s /etc/passwd abs
mkdir empty
echo old > old; touch -t 200102030405.06 old
mkfifo fifo
cd ..
` + filesStat + ` > expect/stat
cat expect/stat
`

// filesStat prints each entry under tree (not tree itself: the folder is
// its volume's): name, type, mode (setuid, setgid, sticky included),
// owner, group, links and modification time.
const filesStat = `find tree -mindepth 1 | sort | while read f; do stat -c '%n %F %a %u %g %h %Y' "$f"; done`

// filesPipeline: a job whose first task leaves the tree and whose second
// gets it as its input and sees it exactly (the stat lines, the hard link
// one inode, the root-only file read); and a job whose task runs as uid
// 1000 and owns its cache: the next build finds the cache's file its own.
const filesPipeline = `
jobs:
- name: files
  plan:
  - task: make
    config: &make
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      outputs: [{name: tree}, {name: expect}]
      run: {path: sh, args: [-ec, SCRIPT]}
  - task: check
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: tree}, {name: expect}]
      run:
        path: sh
        args:
        - -ec
        - |
          STAT > /tmp/got
          diff expect/stat /tmp/got
          test "$(stat -c %i tree/a)" = "$(stat -c %i tree/hard)"
          echo "root-only: $(cat tree/d700/key)"
- name: intercept
  plan:
  - task: make
    config: *make
  - task: keep
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: tree}, {name: expect}]
      run: {path: sh, args: [-ec, 'echo kept for fly intercept; exit 1']}
- name: cache
  plan:
  - task: own
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      caches: [{path: cache}]
      run:
        user: "1000"
        path: sh
        args:
        - -ec
        - |
          if [ -e cache/mine ]; then echo "again, owner $(stat -c %u cache/mine)"; fi
          echo $(id -u) >> cache/mine
          chmod 600 cache/mine
          echo "lines $(wc -l < cache/mine)"
`

// TestRealNodeConcourseCarriesFilesAsWritten: through a real web node and
// real fly, on the real node, a task's output arrives in the next task as
// it was written: modes with setuid, setgid and sticky, numeric owners,
// root-only files, a hard link as a link, symbolic links as written, an
// empty folder, modification times and, on a target that allows
// privileged steps, a FIFO; fly execute -o downloads the same tree; a
// task running as uid 1000 finds its cache its own in the next build.
func TestRealNodeConcourseCarriesFilesAsWritten(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	client := cwn.Client{ID: "jetway", Secret: "files-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	const name = "rn-files"
	nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		targetYAML: "steps: {allowPrivileged: true}\n"})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	fly := func(within time.Duration, args ...string) string {
		t.Helper()
		return flyOK(ctx, t, web, within, args...)
	}

	work := t.TempDir()
	pipeline := filepath.Join(work, "pipeline.yml")
	yaml := strings.ReplaceAll(filesPipeline, "SCRIPT", yamlQuote(filesScript))
	writeFile(t, pipeline, []byte(strings.ReplaceAll(yaml, "STAT", filesStat)))
	fly(time.Minute, "set-pipeline", "-n", "-p", "files", "-c", pipeline)
	fly(time.Minute, "unpause-pipeline", "-p", "files")

	assertFilesCarried(t, fly(3*time.Minute, "trigger-job", "-j", "files/files", "--watch"))

	// fly intercept into the next task's container (kept: its build
	// failed) sees the tree as the task did.
	out, err := web.FlyContext(ctx, "trigger-job", "-j", "files/intercept", "--watch")
	require.Error(t, err, out)
	assert.Contains(t, out, "kept for fly intercept")
	out = fly(time.Minute, "intercept", "-j", "files/intercept", "-s", "keep", "--",
		"sh", "-ec", "cd /tmp/build/*; "+filesStat+" > /tmp/got; diff expect/stat /tmp/got; echo same as written")
	assert.Contains(t, out, "same as written")

	// The cache of a task that is not root, its own in the next build.
	out = fly(3*time.Minute, "trigger-job", "-j", "files/cache", "--watch")
	assert.Contains(t, out, "lines 1")
	out = fly(3*time.Minute, "trigger-job", "-j", "files/cache", "--watch")
	assert.Contains(t, out, "again, owner 1000")
	assert.Contains(t, out, "lines 2")
	assert.Contains(t, out, "succeeded")

	// fly execute -o: the same tree, downloaded.
	task := filepath.Join(work, "task.yml")
	writeFile(t, task, []byte("platform: linux\nrootfs_uri: docker:///jetway.test/busybox#1\n"+
		"outputs: [{name: tree}, {name: expect}]\nrun: {path: sh, args: [-ec, "+yamlQuote(filesScript)+"]}\n"))
	tree, expect := filepath.Join(work, "tree"), filepath.Join(work, "expect")
	require.NoError(t, os.MkdirAll(tree, 0o755))
	require.NoError(t, os.MkdirAll(expect, 0o755))
	out = fly(3*time.Minute, "execute", "-c", task, "-o", "tree="+tree, "-o", "expect="+expect)
	want, err := os.ReadFile(filepath.Join(expect, "stat"))
	require.NoError(t, err, out)
	for _, line := range strings.Split(strings.TrimSpace(string(want)), "\n") {
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 7, line)
		rel, mode, uid, gid := f[0], f[len(f)-5], f[len(f)-4], f[len(f)-3]
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(filepath.Join(work, rel), &st), rel)
		assert.Equal(t, mode, fmt.Sprintf("%o", st.Mode&0o7777), "%s: mode", rel)
		assert.Equal(t, uid, fmt.Sprint(st.Uid), "%s: owner", rel)
		assert.Equal(t, gid, fmt.Sprint(st.Gid), "%s: group", rel)
	}
	var a, hard syscall.Stat_t
	require.NoError(t, syscall.Stat(filepath.Join(tree, "a"), &a))
	require.NoError(t, syscall.Stat(filepath.Join(tree, "hard"), &hard))
	assert.Equal(t, a.Ino, hard.Ino, "fly downloads the hard link as a link")
	link, err := os.Readlink(filepath.Join(tree, "abs"))
	require.NoError(t, err)
	assert.Equal(t, "/etc/passwd", link, "a symbolic link as written")
}

// assertFilesCarried: the files job's output (filesPipeline) shows the
// tree arrived in the next task as it was written.
func assertFilesCarried(t *testing.T, out string) {
	t.Helper()
	assert.Contains(t, out, "root-only: secret")
	assert.Contains(t, out, "tree/suid regular file 4755 0 0 1 ", "setuid")
	assert.Contains(t, out, "tree/u1000 regular file 644 1000 1001 1 ", "a numeric owner")
	assert.Contains(t, out, "tree/hard regular file 644 0 0 2 ", "a hard link")
	assert.Contains(t, out, "tree/old regular file 644 0 0 1 981173106", "a modification time")
	assert.Contains(t, out, "tree/fifo fifo 644 0 0 1 ", "a FIFO")
	assert.Contains(t, out, "succeeded")
}

// usernsPipeline: gets of Concourse's mock type, unprivileged and as a
// privileged custom type (each get writes whether its container looked
// privileged: its uid map is the node's); a task printing its uid map,
// unprivileged; a privileged task (its image a get: Concourse makes a
// task privileged only with an image artifact) printing its own and
// leaving files owned by ids a user namespace of 65536 does not map, for
// an unprivileged task to see.
const usernsPipeline = `
resource_types:
- name: mock-privileged
  type: mock
  privileged: true
  source: {mirror_self: true}
resources:
- name: plain
  type: mock
  source: {mirror_self: true, initial_version: v1}
- name: priv
  type: mock-privileged
  source: {initial_version: v1}
jobs:
- name: userns
  plan:
  - get: plain
  - get: priv
  - task: unprivileged
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: plain}, {name: priv}]
      run:
        path: sh
        args:
        - -ec
        - |
          echo "uid map: $(cat /proc/self/uid_map)"
          echo "get of mock: privileged $(cat plain/privileged)"
          echo "get of privileged mock: privileged $(cat priv/privileged)"
  - task: make
    image: plain
    privileged: true
    config:
      platform: linux
      outputs: [{name: tree}]
      run:
        path: sh
        args:
        - -ec
        - |
          echo "uid map: $(cat /proc/self/uid_map)"
          echo far > tree/far; chown 70000:70000 tree/far; chmod 4755 tree/far
          echo near > tree/near; chown 1000:1000 tree/near; chmod 4750 tree/near
  - task: see
    config:
      platform: linux
      rootfs_uri: docker:///jetway.test/busybox#1
      inputs: [{name: tree}]
      run: {path: sh, args: [-ec, 'stat -c "%n %a %u %g" tree/far tree/near; cat tree/far']}
`

// TestRealNodeConcourseCarriesFilesInAUserNamespace: on a target with
// steps.userNamespaces, through a real web node and real fly on the real
// node, an unprivileged container runs in a user namespace of its own
// (root in it is a high uid on the node: the uid map a stock worker's
// unprivileged containers show, so Concourse's mock type tells a
// privileged resource type from another, as testflight asks) and a
// privileged one with the node's users; a task's output arrives in the
// next task as it was written (owners, root-only files, a hard link,
// setuid), and a task running as uid 1000 owns its cache in the next
// build, as without user namespaces; a file owned by an id the namespace
// does not map arrives root's, without setuid.
func TestRealNodeConcourseCarriesFilesInAUserNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	web := mockWorkerOnNode(ctx, t, "rn-userns", "steps:\n  allowPrivileged: true\n  userNamespaces: true\n  volumeHolder: {images: NodePort}\n")
	fly := func(within time.Duration, args ...string) string {
		t.Helper()
		return flyOK(ctx, t, web, within, args...)
	}
	work := t.TempDir()
	for pipeline, yaml := range map[string]string{
		"files":  strings.ReplaceAll(strings.ReplaceAll(filesPipeline, "SCRIPT", yamlQuote(filesScript)), "STAT", filesStat),
		"userns": usernsPipeline,
	} {
		file := filepath.Join(work, pipeline+".yml")
		writeFile(t, file, []byte(yaml))
		fly(time.Minute, "set-pipeline", "-n", "-p", pipeline, "-c", file)
		fly(time.Minute, "unpause-pipeline", "-p", pipeline)
	}

	out := fly(5*time.Minute, "trigger-job", "-j", "userns/userns", "--watch")
	maps := regexp.MustCompile(`uid map:\s+(\d+)\s+(\d+)\s+(\d+)`).FindAllStringSubmatch(out, -1)
	require.Len(t, maps, 2, out)
	assert.Equal(t, "0", maps[0][1], "unprivileged: root in the step...")
	assert.NotEqual(t, "0", maps[0][2], "...is not root on the node")
	assert.Equal(t, "65536", maps[0][3], "unprivileged: a range of 65536 ids")
	assert.Equal(t, []string{"0", "0", "4294967295"}, maps[1][1:], "privileged: the node's users")
	assert.Contains(t, out, "get of mock: privileged false")
	assert.Contains(t, out, "get of privileged mock: privileged true")
	assert.Contains(t, out, "tree/far 755 0 0", "an id the namespace does not map: root's, without setuid")
	assert.Contains(t, out, "tree/near 4750 1000 1000", "an id it maps: as written")
	assert.Contains(t, out, "succeeded")

	assertFilesCarried(t, fly(3*time.Minute, "trigger-job", "-j", "files/files", "--watch"))
	out = fly(3*time.Minute, "trigger-job", "-j", "files/cache", "--watch")
	assert.Contains(t, out, "lines 1")
	out = fly(3*time.Minute, "trigger-job", "-j", "files/cache", "--watch")
	assert.Contains(t, out, "again, owner 1000")
}

// mockWorkerOnNode starts a web node and a gateway registering target
// name on the real node as its worker, with target.yaml targetYAML, rootfs
// images served by its holder and Concourse's mock as its base resource
// type; it returns the web node once fly lists the worker running.
func mockWorkerOnNode(ctx context.Context, t *testing.T, name, targetYAML string) *cwn.WebNode {
	t.Helper()
	rn := startRealNode(t)
	client := cwn.Client{ID: "jetway", Secret: name + "-s3cret"}
	web := cwn.ForTest(t, cwn.Options{Clients: []cwn.Client{client}})
	nodeGateway(ctx, t, name, gatewayOptions{concourse: concourseREST(t, web, client, 2*time.Second), state: newState(t),
		keepGrace: 5 * time.Second, images: true,
		resourceTypes: []wire.ResourceType{{Type: "mock", Image: rn.NodeImage("mock-image.tar"), Version: "0.14.2"}},
		targetYAML:    targetYAML})
	flyWorker(t, web, name, time.Minute, workerIn("running"))
	return web
}

// yamlQuote is s as a YAML scalar: a JSON string is one.
func yamlQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
