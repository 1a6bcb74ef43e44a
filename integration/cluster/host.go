package cluster

import (
	"os"
	"slices"
	"strings"
	"time"
)

// Host clean-up helpers the real node's teardown uses, for other harnesses
// that change the machine too (integration/concourse's stock worker).

// KillProcesses SIGKILLs every process but this one whose command line
// (its arguments joined by spaces) matches.
func KillProcesses(match func(pid int, cmdline string) bool) { killProcesses(match) }

// UnmountUnder detaches every mount at or below dir, deepest first.
func UnmountUnder(dir string) { unmountUnder(dir) }

// CgroupHierarchies are the folders of the machine's cgroup hierarchies
// (each v1 controller's, and the v2 one of a hybrid machine).
func CgroupHierarchies() []string { return cgroupHierarchies() }

// KillCgroup SIGKILLs every process in the cgroup root (a path in each
// hierarchy) and below, again until none is left or 2 s have passed.
func KillCgroup(root string) {
	for range 20 {
		if killCgroupProcesses(root) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RemoveCgroup removes the cgroup root and every cgroup below it, in every
// hierarchy, deepest first.
func RemoveCgroup(root string) { removeCgroups(root) }

// NodeRunning reports whether a real node holds NodeLock on this machine
// (in this process or another): the abstract socket is in /proc/net/unix.
func NodeRunning() bool { return abstractSocketHeld(NodeLock) }

// abstractSocketHeld reports whether a socket is bound to the abstract
// name (written "@name") in this network namespace.
func abstractSocketHeld(name string) bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

// NodeKubeletDir is the real node's kubelet root, which holds its pods'
// emptyDir volumes; "" for a cluster without a real node.
func (c *Cluster) NodeKubeletDir() string {
	if c.node == nil {
		return ""
	}
	return c.node.path("kubelet")
}

// MissingPackages are the packages, sorted, of the programs (path:
// package) that are not there.
func MissingPackages(programs map[string]string) []string {
	var missing []string
	for path, pkg := range programs {
		if _, err := os.Stat(path); err != nil && !slices.Contains(missing, pkg) {
			missing = append(missing, pkg)
		}
	}
	slices.Sort(missing)
	return missing
}
