#!/usr/bin/env bash
# Run a command in a memory cgroup of its own, limited to LIMIT bytes (the page cache it uses counts), then
# print the group's peak usage and whether the kernel had to kill for memory. Needs root; cgroup v2 or v1.
#
# Usage: tools/device/in_memory_limit.sh LIMIT_BYTES command [args...]
set -euo pipefail
limit=$1
shift
name="yolofeed-limit-$$"
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then  # v2
    group=/sys/fs/cgroup/$name
    mkdir "$group"
    echo "$limit" > "$group/memory.max"
    echo 0 > "$group/memory.swap.max" 2>/dev/null || true
    peak_file=memory.peak
else  # v1
    group=/sys/fs/cgroup/memory/$name
    mkdir "$group"
    echo "$limit" > "$group/memory.limit_in_bytes"
    peak_file=memory.max_usage_in_bytes
fi
cleanup() {
    if [[ -f "$group/$peak_file" ]]; then
        echo "cgroup $group: limit $limit bytes, peak $(cat "$group/$peak_file") bytes"
    fi
    if [[ -f "$group/memory.events" ]]; then
        echo "memory.events: $(tr '\n' ' ' < "$group/memory.events")"
    elif [[ -f "$group/memory.oom_control" ]]; then
        echo "memory.oom_control: $(tr '\n' ' ' < "$group/memory.oom_control")"
    fi
    rmdir "$group" 2>/dev/null || true
}
trap cleanup EXIT
set +e
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' limit-runner "$group" "$@"
rc=$?
set -e
exit $rc
