#!/bin/sh
# hosts.sh: emulated hosts on shaped links, for cddp's multi-node tests and benchmarks.
#
#   hosts.sh start NAME N RATE   N hosts NAME0..NAME(N-1): each a network namespace with one
#                                veth link to a bridge, addresses 10.K.0.1..N (K from NAME's
#                                subnet file), every link shaped with tbf to RATE (tc's units:
#                                1gbit, 500mbit; none: unshaped) in both directions. Prints each
#                                host's address.
#   hosts.sh exec NAME I CMD...  runs CMD on host I: in its namespace, with its own hostname
#                                (NAME-hostI, a UTS namespace), so that cddp tells the hosts apart
#                                as it tells machines apart, and its own /etc/hosts as Debian
#                                writes one (ip netns exec mounts /etc/netns/NAMEI/hosts): its
#                                own name on 127.0.1.1, the other hosts' names on their addresses;
#                                and its own TMPDIR (as hosts have their own /tmp)
#   hosts.sh addr NAME I         host I's address
#   hosts.sh addr6 NAME I        host I's IPv6 address (fd00:K::I+1, on the same links)
#   hosts.sh stop NAME           ends every process left in the hosts' namespaces (all of them
#                                started through exec), removes the links, the bridge and the
#                                namespaces. Safe to call twice, or after a failed start.
#
# Needs root (or CAP_NET_ADMIN) and iproute2's ip and tc; traffic stays on the bridge, between
# addresses of the namespaces made here. NAME: at most 8 letters and digits (interface names are
# short). The kernel may lack netem, so links have a rate, not a delay.
set -eu
usage() { echo "usage: $0 start NAME N RATE | exec NAME I CMD... | addr NAME I | addr6 NAME I | stop NAME" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 name=$2
shift 2
case "$name" in *[!a-z0-9]* | "") usage ;; esac
[ ${#name} -le 8 ] || usage
state="/run/cddp-hosts-$name"

# The hosts' /24: 10.K.0.0 with K in 100..199, one not used by any interface now.
pick_subnet() {
    for _ in $(seq 100); do
        k=$(( $(od -An -N1 -tu1 /dev/urandom) % 100 + 100 ))
        ip -4 -o addr show | grep -q " 10\.$k\." && continue
        ls /run/cddp-hosts-*/subnet 2>/dev/null | xargs -r cat | grep -qx "$k" && continue
        echo "$k"
        return 0
    done
    echo "hosts.sh: no free 10.K.0.0/24 for K in 100..199" >&2
    return 1
}

addr() { echo "10.$(cat "$state/subnet").0.$(($1 + 1))"; }
addr6() { echo "fd00:$(cat "$state/subnet")::$(($1 + 1))"; }

stop() {
    [ -d "$state" ] || return 0
    n=$(cat "$state/n" 2>/dev/null || echo 0)
    i=0
    while [ "$i" -lt "$n" ]; do
        ns="$name$i"
        if ip netns list | grep -qw "$ns"; then
            # Every process in the namespace was started through exec, by the caller.
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        fi
        ip link del "${name}v$i" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
        i=$((i + 1))
    done
    ip link del "${name}br" 2>/dev/null || true
    rmdir /etc/netns 2>/dev/null || true
    rm -rf "$state"
}

start() {
    n=$1 rate=$2
    case "$n" in *[!0-9]* | "" | 0) usage ;; esac
    [ "$n" -le 16 ] || { echo "hosts.sh: at most 16 hosts" >&2; exit 2; }
    [ ! -d "$state" ] || { echo "hosts.sh: $name is up already (hosts.sh stop $name)" >&2; exit 1; }
    mkdir -p "$state"
    echo 0 > "$state/n"
    pick_subnet > "$state/subnet"
    k=$(cat "$state/subnet")
    ip link add "${name}br" type bridge
    ip link set "${name}br" up
    i=0
    while [ "$i" -lt "$n" ]; do
        ns="$name$i" v="${name}v$i"
        ip netns add "$ns"
        echo $((i + 1)) > "$state/n"
        ip link add "$v" type veth peer name eth0 netns "$ns"
        ip link set "$v" master "${name}br" up
        ip -n "$ns" addr add "10.$k.0.$((i + 1))/24" dev eth0
        ip -n "$ns" addr add "fd00:$k::$((i + 1))/64" dev eth0 nodad
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        # The link's rate both ways: out of the host (its eth0) and into it (the bridge's port).
        # The burst lets a sender run at line rate for a few hundred microseconds; the latency
        # bounds the queue, as a switch's buffer would.
        if [ "$rate" != none ]; then
            tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 20ms
            tc qdisc add dev "$v" root tbf rate "$rate" burst 256kb latency 20ms
        fi
        addr "$i"
        i=$((i + 1))
    done
    i=0
    while [ "$i" -lt "$n" ]; do
        mkdir -p "/etc/netns/$name$i"
        {
            echo "127.0.0.1 localhost"
            echo "127.0.1.1 $name-host$i"
            j=0
            while [ "$j" -lt "$n" ]; do
                [ "$j" = "$i" ] || echo "$(addr "$j") $name-host$j"
                j=$((j + 1))
            done
        } > "/etc/netns/$name$i/hosts"
        i=$((i + 1))
    done
}

case "$cmd" in
start)
    [ $# = 2 ] || usage
    trap 'rc=$?; [ $rc = 0 ] || stop; exit $rc' EXIT
    start "$@"
    trap - EXIT ;;
exec)
    [ $# -ge 2 ] || usage
    i=$1
    shift
    [ -d "$state" ] || { echo "hosts.sh: $name is not up" >&2; exit 1; }
    mkdir -p "$state/tmp$i"
    TMPDIR="$state/tmp$i" exec ip netns exec "$name$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name-host$i" "$@" ;;
addr)
    [ $# = 1 ] || usage
    addr "$1" ;;
addr6)
    [ $# = 1 ] || usage
    addr6 "$1" ;;
stop) stop ;;
*) usage ;;
esac
