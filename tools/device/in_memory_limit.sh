#!/usr/bin/env bash
# Run a command in a memory cgroup of its own, limited to LIMIT (the page cache it uses counts), then print the
# group's peak usage and whether the kernel had to kill for memory. Needs root; cgroup v2 or v1. Pages already
# cached are charged to the group that read them first: evict the files first (python -m tools.device.evict).
# LIMIT: bytes, or with an IEC suffix (6G = 6 GiB).
# Usage: bash tools/device/in_memory_limit.sh LIMIT command [args...]
set -euo pipefail
if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then
    sed -n '2,6p' "$0" | sed 's/^# //'
    [[ $# -ge 1 && ( $1 == -h || $1 == --help ) ]] && exit 0 || exit 2
fi
if ! limit=$(numfmt --from=iec "$1" 2>/dev/null) || [[ ! $limit =~ ^[0-9]+$ ]] || (( limit == 0 )); then
    echo "in_memory_limit.sh: LIMIT '$1' is not a size (bytes, or 6G for 6 GiB)" >&2
    exit 2
fi
shift
name="yolofeed-limit-$$"
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then  # v2
    group=/sys/fs/cgroup/$name
    limit_file=memory.max peak_file=memory.peak
else  # v1
    group=/sys/fs/cgroup/memory/$name
    limit_file=memory.limit_in_bytes peak_file=memory.max_usage_in_bytes
fi
if ! mkdir "$group" 2>/dev/null; then
    echo "in_memory_limit.sh: cannot make the cgroup $group (needs root and a writable cgroup tree)" >&2
    exit 1
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
    # the script stopped alone (SIGTERM from timeout, SIGHUP) while its command ran: bash runs this trap at once,
    # so the command is still in the group; stop it (TERM, KILL after 5 s), else the group could not be removed
    local pids tries
    pids=$(cat "$group/cgroup.procs" 2>/dev/null || true)
    if [[ -n $pids ]]; then
        echo "in_memory_limit.sh: stopping the command still running in $group (pids ${pids//$'\n'/ })" >&2
        kill -TERM $pids 2>/dev/null || true
        for tries in $(seq 100); do
            pids=$(cat "$group/cgroup.procs" 2>/dev/null || true)
            [[ -z $pids ]] && break
            (( tries == 50 )) && { kill -KILL $pids 2>/dev/null || true; }
            sleep 0.1
        done
    fi
    rmdir "$group" 2>/dev/null || echo "in_memory_limit.sh: could not remove $group (rmdir it by hand)" >&2
}
trap cleanup EXIT
if [[ ! -f "$group/$limit_file" ]]; then
    echo "in_memory_limit.sh: $group has no $limit_file: the memory controller is not enabled for child groups" \
         "(cgroup v2: echo +memory > $(dirname "$group")/cgroup.subtree_control)" >&2
    exit 1
fi
echo "$limit" > "$group/$limit_file"
[[ $limit_file == memory.max ]] && { echo 0 > "$group/memory.swap.max"; } 2>/dev/null || true
set +e
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' limit-runner "$group" "$@"
rc=$?
set -e
exit $rc
