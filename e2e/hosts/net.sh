#!/usr/bin/env bash
# The hosts' network: network namespaces made and removed by the run itself.
#
#   net.sh up ID N      a switch namespace (bridge br0), a decode host and N prefill hosts
#   net.sh down ID      kill what runs in them, delete them
#   net.sh stale        delete the namespaces of runs whose process is gone
#   net.sh can          exit 0 if network namespaces can be made here
#
# Names: kvfh<ID>sw (switch), kvfh<ID>d (decode, 10.213.0.1), kvfh<ID>p<i> (prefill i,
# 10.213.0.<10+i>); ID is the pid of the run (e2e/run). Addresses are the project's test
# network 10.213.0.0/24 and exist only inside these namespaces: every veth pair is made with
# both ends already in a namespace (nothing is ever put in the caller's namespace), the
# hosts have no default route, so no packet can leave toward any outside address.
set -uo pipefail
PREFIX=kvfh
NET=10.213.0

nsname() { printf '%s%s%s' "$PREFIX" "$1" "$2"; }

down() {
    local id=$1 ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}${id}(sw|d|p[0-9]+)\$"); do
        # processes left in a host of this run (ours: started by this run's scripts)
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
}

stale() {
    local ns id
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+(sw|d|p[0-9]+)\$"); do
        id=$(printf '%s' "$ns" | sed -E "s/^${PREFIX}([0-9]+).*/\1/")
        # gone, or a zombie (killed -9, not yet reaped): kill -0 would still succeed
        if [ ! -e "/proc/$id/stat" ] || [ "$(awk '{print $3}' "/proc/$id/stat" 2>/dev/null)" = Z ]; then
            echo "net.sh: removing stale namespace $ns (run $id is gone)" >&2
            down "$id"
        fi
    done
}

host() {  # host ID NAME ADDR: a host namespace joined to the switch
    local id=$1 name=$2 addr=$3 ns sw
    ns=$(nsname "$id" "$name"); sw=$(nsname "$id" sw)
    ip netns add "$ns" || return 1
    ip -n "$ns" link set lo up
    # both ends created inside namespaces: "v$name" on the switch, eth0 on the host
    ip -n "$sw" link add name "v$name" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$sw" link set "v$name" master br0 up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    # a short minimum RTO so that a healed link resumes within a second, not minutes
    ip -n "$ns" route replace "$NET.0/24" dev eth0 proto kernel scope link src "$addr" rto_min 20ms
}

up() {
    local id=$1 n=$2 i sw
    sw=$(nsname "$id" sw)
    ip netns add "$sw" || return 1
    ip -n "$sw" link set lo up
    ip -n "$sw" link add name br0 type bridge || return 1
    ip -n "$sw" link set br0 up
    host "$id" d "$NET.1" || return 1
    for ((i = 0; i < n; i++)); do host "$id" "p$i" "$NET.$((10 + i))" || return 1; done
}

can() {
    local t="${PREFIX}probe$$"
    ip netns add "$t" 2>/dev/null || return 1
    ip -n "$t" link add name kva type veth peer name kvb 2>/dev/null; local rc=$?
    ip netns del "$t" 2>/dev/null
    return $rc
}

case "${1:-}" in
    up) stale; up "$2" "$3" ;;
    down) down "$2" ;;
    stale) stale ;;
    can) can ;;
    *) echo "usage: net.sh up ID N | down ID | stale | can" >&2; exit 2 ;;
esac
