#!/bin/sh
# two_hosts.sh [--any-exit] BUILD_DIR NPROC PROGRAM ARGS...: runs PROGRAM as a job of 2 nodes x
# NPROC ranks started by two cddprun, one per "host": node 0 on 127.0.0.1 and node 1 on
# 127.0.0.2, each with its own CDDP_HOST_ID, so cddp groups the ranks as it would on two machines
# and the traffic between the nodes goes over TCP, and its own TMPDIR (TWO_HOSTS_TMPDIR/nodeI,
# default a folder of this script's), as two machines have their own /tmp. Prints both nodes'
# output (the workers' lines included); exits 0 when both launchers did, or always with
# --any-exit (a job meant to fail).
set -u
any_exit=0
[ "$1" = --any-exit ] && { any_exit=1; shift; }
build=$1 nproc=$2
shift 2
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token")
common="--nnodes 2 --nproc_per_node $nproc --master_addr 127.0.0.1 --master_port $port"
common="$common --token_file $work/token"
common="$common --grace_period 10"
tmp=${TWO_HOSTS_TMPDIR:-$work}
mkdir -p "$tmp/node0" "$tmp/node1"
TMPDIR=$tmp/node0 CDDP_HOST_ID=host-a "$build/bin/cddprun" $common --node_rank 0 --local_addr 127.0.0.1 "$@" \
    > "$work/n0" 2>&1 &
p0=$!
TMPDIR=$tmp/node1 CDDP_HOST_ID=host-b "$build/bin/cddprun" $common --node_rank 1 --local_addr 127.0.0.2 "$@" \
    > "$work/n1" 2>&1
rc1=$?
wait $p0
rc0=$?
cat "$work/n0" "$work/n1"
[ $any_exit = 1 ] && exit 0
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "FAIL: node 0 exited $rc0, node 1 exited $rc1"; exit 1; }
