package concourse

import (
	"cmp"
	"fmt"
	"strings"
)

// ArtifactJob is one job of ArtifactPipeline: its name, the tags its
// tasks carry (the worker they run on) and their image's rootfs_uri
// (`raw://` + StockWorker.Rootfs on a stock worker, `docker:///repo#tag`
// of an image the node holds on jetway).
type ArtifactJob struct {
	Name      string
	Tags      []string
	RootfsURI string
	// CheckTags, if set, are task check's tags, and CheckRootfsURI its
	// rootfs: the artifact streams from make's worker to check's.
	CheckTags      []string
	CheckRootfsURI string
}

// ArtifactMarker is what task check prints when the artifact it read is
// the one task make wrote (sha256sum -c).
const ArtifactMarker = "blob: OK"

// ArtifactPipeline is a pipeline of one job per ArtifactJob, each two
// tasks on the job's worker: make writes size bytes of incompressible
// data (from /dev/urandom) into its output, with their sha256, and prints
// its pid 1's command line (Concourse's init, /tmp/gdn-init, in a Garden
// container); check reads them as its input and checks the sum.
func ArtifactPipeline(size int64, jobs ...ArtifactJob) string {
	var b strings.Builder
	b.WriteString("jobs:\n")
	for _, j := range jobs {
		tags, checkTags := taskTags(j.Tags), taskTags(j.Tags)
		if j.CheckTags != nil {
			checkTags = taskTags(j.CheckTags)
		}
		fmt.Fprintf(&b, `- name: %[1]s
  plan:
  - task: make%[2]s
    config:
      platform: linux
      rootfs_uri: %[3]s
      outputs: [{name: data}]
      run: {path: sh, args: [-ec, 'echo "pid 1: $(tr "\000" " " </proc/1/cmdline)"; head -c %[4]d /dev/urandom >data/blob; cd data; sha256sum blob >sum; echo "made $(wc -c <blob) bytes"']}
  - task: check%[5]s
    config:
      platform: linux
      rootfs_uri: %[6]s
      inputs: [{name: data}]
      run: {path: sh, args: [-ec, 'cd data; sha256sum -c sum']}
`, j.Name, tags, j.RootfsURI, size, checkTags, cmp.Or(j.CheckRootfsURI, j.RootfsURI))
	}
	return b.String()
}

// taskTags is a task's tags line, "" for none.
func taskTags(tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	return fmt.Sprintf("\n    tags: [%s]", strings.Join(tags, ", "))
}
