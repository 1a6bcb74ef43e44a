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
#    cgroups (integration/cluster/node.go).
set -u
dir=${JETWAY_CLUSTER_DIR:?JETWAY_CLUSTER_DIR must name the clusters folder}
bridge=jetway0
cgroup=jetway-node
lock=@jetway-node
status=0
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
if ! awk -v l="$lock" '$NF == l { found = 1 } END { exit !found }' /proc/net/unix; then
	if ip link show "$bridge" >/dev/null 2>&1; then
		for veth in $(ip -o link show master "$bridge" | awk -F': ' '{ split($2, n, "@"); print n[1] }'); do
			echo "leftover veth $veth" >&2
			ip link del "$veth" 2>/dev/null
		done
		echo "leftover bridge $bridge" >&2
		ip link del "$bridge" 2>/dev/null
		status=1
	fi
	for d in /sys/fs/cgroup/*/"$cgroup"; do
		[ -d "$d" ] || continue
		echo "leftover cgroup $d" >&2
		find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
		status=1
	done
fi
[ $status = 0 ] && echo "no cluster process, mount, bridge or cgroup left behind"
exit $status
