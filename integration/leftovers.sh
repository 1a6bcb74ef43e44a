#!/usr/bin/env bash
# Fails, and kills them, if any process still runs whose command line names
# $JETWAY_CLUSTER_DIR: a control-plane process a test failed to stop.
# (Reads /proc rather than pgrep so the check itself never matches.)
set -u
dir=${JETWAY_CLUSTER_DIR:?JETWAY_CLUSTER_DIR must name the clusters folder}
status=0
for f in /proc/[0-9]*/cmdline; do
	pid=${f#/proc/}
	pid=${pid%/cmdline}
	[ "$pid" = "$$" ] && continue
	cmd=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
	if [[ $cmd == *"$dir"* ]]; then
		echo "leftover process $pid: $cmd" >&2
		kill -9 "$pid" 2>/dev/null
		status=1
	fi
done
[ $status = 0 ] && echo "no cluster process left behind"
exit $status
