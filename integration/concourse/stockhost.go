package concourse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jetway-ci/jetway/integration/cluster"
)

// What a stock worker changes on the machine besides its own folder, and
// puts back (../shared/concourse/STOCK-WORKER.md): its containerd's
// socket and state in /run/containerd (Concourse's default containerd
// config keeps the state there) and /opt/containerd; the CNI plugins'
// IP allocations and caches in /var/lib/cni; the bridge StockBridge and
// its veths; the nft tables the worker and the CNI plugins fill through
// iptables (filter, nat, for IPv4 and IPv6); the forwarding sysctls the
// bridge plugin turns on; the cgroup garden/ in every hierarchy; its
// containers' processes, shims and mounts.
var (
	stockHostPaths = []string{"/run/containerd", "/var/lib/cni", "/opt/containerd"}
	stockSysctls   = []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"}
	// stockEntries are the stock worker's own entries in paths the real
	// node shares: removed even when a running node keeps the paths.
	stockEntries = []string{StockSocket, StockSocket + ".ttrpc", "/run/containerd/io.containerd.runtime.v1.linux",
		"/run/containerd/io.containerd.runtime.v2.task", "/run/containerd/runc/concourse",
		"/var/lib/cni/networks/concourse", "/var/lib/cni/results/concourse-*"}
	// stockStateDirs hold its containers' rootfs mounts.
	stockStateDirs = []string{"/run/containerd/io.containerd.runtime.v1.linux", "/run/containerd/io.containerd.runtime.v2.task"}
)

// stockCgroup is Concourse's containers' cgroup parent.
const stockCgroup = "garden"

// stockHost is the machine as it was before a stock worker started, saved
// in its folder's state.json so that the next start can put it back after
// a test process that was killed.
type stockHost struct {
	Dir      string            `json:"dir"`
	NewPaths []string          `json:"newPaths"` // stockHostPaths that did not exist
	Sysctls  map[string]string `json:"sysctls"`
	// Tables are `nft list table` of each table that existed, by
	// "family name".
	Tables map[string]string `json:"tables"`
}

func recordStockHost(dir string) (stockHost, error) {
	h := stockHost{Dir: dir, Sysctls: map[string]string{}}
	for _, p := range stockHostPaths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			h.NewPaths = append(h.NewPaths, p)
		}
	}
	for _, s := range stockSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			h.Sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	var err error
	if h.Tables, err = nftTables(); err != nil {
		return h, err
	}
	b, err := json.Marshal(h)
	if err != nil {
		return h, err
	}
	return h, os.WriteFile(filepath.Join(dir, "state.json"), b, 0o600)
}

func loadStockHost(dir string) (stockHost, error) {
	var h stockHost
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return h, err
	}
	return h, json.Unmarshal(b, &h)
}

// nftTables lists each nft table with its rules, by "family name".
func nftTables() (map[string]string, error) {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return nil, errors.New("nft list tables: " + err.Error())
	}
	tables := map[string]string{}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "table" {
			continue
		}
		rules, err := exec.Command("nft", "list", "table", f[1], f[2]).Output()
		if err != nil {
			return nil, errors.New("nft list table " + f[1] + " " + f[2] + ": " + err.Error())
		}
		tables[f[1]+" "+f[2]] = string(rules)
	}
	return tables, nil
}

// restore puts the machine back: it kills the containers' shims and
// processes, unmounts their mounts, removes the garden cgroups, the
// bridge and its veths, the tables the worker made and its rules in the
// tables that were there, its paths, and writes the sysctls back. While a
// real node runs, the paths it shares (/run/containerd, /var/lib/cni)
// keep all but the worker's own entries, and the sysctls it needs stay.
func (h stockHost) restore() {
	cluster.KillProcesses(func(_ int, cmdline string) bool {
		return strings.Contains(cmdline, StockSocket) || (h.Dir != "" && strings.Contains(cmdline, h.Dir))
	})
	cluster.KillCgroup(stockCgroup)
	for _, d := range append([]string{h.Dir}, stockStateDirs...) {
		if d != "" {
			cluster.UnmountUnder(d)
		}
	}
	cluster.RemoveCgroup(stockCgroup)
	deleteStockBridge()
	h.restoreTables()
	nodeRuns := cluster.NodeRunning()
	if !nodeRuns {
		for s, v := range h.Sysctls {
			_ = os.WriteFile("/proc/sys/"+s, []byte(v), 0o644)
		}
	}
	for _, pattern := range stockEntries {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			_ = os.RemoveAll(m)
		}
	}
	for _, p := range h.NewPaths {
		if nodeRuns {
			removeEmptyDirs(p)
		} else {
			cluster.UnmountUnder(p)
			_ = os.RemoveAll(p)
		}
	}
	if h.Dir != "" {
		_ = os.Remove(filepath.Join(h.Dir, "state.json"))
	}
}

// restoreTables deletes the nft tables made since h was recorded and
// loads back those that changed, but the real node's (jetway-*: its
// policy enforcer's and its guard, which may come and go while the worker
// runs, and are the node's to remove).
func (h stockHost) restoreTables() {
	now, err := nftTables()
	if err != nil || h.Tables == nil { // nil: never recorded, nothing to compare
		return
	}
	for name, rules := range now {
		before, existed := h.Tables[name]
		fam, table, _ := strings.Cut(name, " ")
		if (existed && before == rules) || strings.HasPrefix(table, "jetway-") {
			continue
		}
		_ = exec.Command("nft", "delete", "table", fam, table).Run()
		if existed {
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = strings.NewReader(before)
			_ = cmd.Run()
		}
	}
}

// stopStockContainers kills and deletes the containers of the stock
// worker's containerd while it runs, so that their shims exit and
// unmount their rootfs.
func stopStockContainers(ctx context.Context) {
	if _, err := os.Stat(StockSocket); err != nil {
		return
	}
	ctr := func(args ...string) string {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(cctx, "ctr", append([]string{"--address", StockSocket, "--namespace", "concourse"}, args...)...).Output()
		return string(out)
	}
	for id := range strings.FieldsSeq(ctr("tasks", "ls", "-q")) {
		ctr("tasks", "kill", "--all", "--signal", "SIGKILL", id)
		ctr("tasks", "delete", "--force", id)
	}
	for id := range strings.FieldsSeq(ctr("containers", "ls", "-q")) {
		ctr("containers", "delete", id)
	}
}

// deleteStockBridge deletes the veths on StockBridge and the bridge.
func deleteStockBridge() {
	out, _ := exec.Command("ip", "-o", "link", "show", "master", StockBridge).Output()
	for line := range bytes.SplitSeq(out, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		_ = exec.Command("ip", "link", "del", name).Run()
	}
	_ = exec.Command("ip", "link", "del", StockBridge).Run()
}

// removeEmptyDirs removes dir and the folders under it that are empty,
// deepest first, and leaves the rest.
func removeEmptyDirs(dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}
