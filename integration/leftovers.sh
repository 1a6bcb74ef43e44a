#!/usr/bin/env bash
# Fails, and cleans them up, if the tests left behind:
#  - a process whose command line names $JETWAY_CLUSTER_DIR: a
#    control-plane process, kubelet, containerd or a containerd shim a test
#    failed to stop (reads /proc rather than pgrep so the check itself
#    never matches);
#  - a mount under $JETWAY_CLUSTER_DIR (the real node's overlays, netns,
#    shm, projected volumes, kubelet's root);
#  - unless a real node holds the machine's lock (an abstract unix socket,
#    the network namespace's, so a run in a container with a /run of its
#    own sees it too): the real node's bridge, a veth on it, or its
#    cgroups (integration/cluster/node.go);
#  - unless a stock Concourse worker holds its lock (@jetway-stock-worker):
#    its bridge concourse0 and its veths, its garden cgroups, its
#    containerd's socket (integration/concourse/stockhost.go).
# With --own, only the first two: what a run under $JETWAY_CLUSTER_DIR
# made. A test that starts no real node nor stock worker (TestDemo) checks
# only its own; the machine-wide parts are the real node's and the stock
# worker's, whose next holder cleans up after one that was killed.
set -u
own=false
[ "${1:-}" = --own ] && own=true
dir=${JETWAY_CLUSTER_DIR:?JETWAY_CLUSTER_DIR must name the clusters folder}
bridge=jetway0
cgroup=jetway-node
lock=@jetway-node
status=0
# leftover_bridge deletes the bridge $1 and its veths, if there, saying so.
leftover_bridge() {
	ip link show "$1" >/dev/null 2>&1 || return 0
	for veth in $(ip -o link show master "$1" | awk -F': ' '{ split($2, n, "@"); print n[1] }'); do
		echo "leftover veth $veth" >&2
		ip link del "$veth" 2>/dev/null
	done
	echo "leftover bridge $1" >&2
	ip link del "$1" 2>/dev/null
	status=1
}
# leftover_cgroups removes the cgroup $1 in every hierarchy, saying so.
leftover_cgroups() {
	for d in /sys/fs/cgroup/*/"$1"; do
		[ -d "$d" ] || continue
		echo "leftover cgroup $d" >&2
		find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
		status=1
	done
}
for f in /proc/[0-9]*/cmdline; do
	pid=${f#/proc/}
	pid=${pid%/cmdline}
	[ "$pid" = "$$" ] && continue
	cmd=$(tr '\0' ' ' 2>/dev/null <"$f") || continue
	if [[ $cmd == *"$dir"* ]]; then
		echo "leftover process $pid: $cmd" >&2
		kill -9 "$pid" 2>/dev/null
		status=1
	fi
done
mounts=$(awk -v d="$dir" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
for m in $mounts; do
	echo "leftover mount $m" >&2
	umount -l "$m" 2>/dev/null
	status=1
done
if $own; then
	:
elif ! awk -v l="$lock" '$NF == l { found = 1 } END { exit !found }' /proc/net/unix; then
	leftover_bridge "$bridge"
	leftover_cgroups "$cgroup"
fi
if ! $own && ! awk '$NF == "@jetway-stock-worker" { found = 1 } END { exit !found }' /proc/net/unix; then
	leftover_bridge concourse0
	leftover_cgroups garden
	if [ -e /run/containerd/containerd.sock ]; then
		echo "leftover socket /run/containerd/containerd.sock" >&2
		status=1
	fi
fi
if [ $status = 0 ]; then
	if $own; then
		echo "no cluster process or mount left behind"
	else
		echo "no cluster process, mount, bridge or cgroup left behind"
	fi
fi
exit $status
