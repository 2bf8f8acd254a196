#!/bin/sh
# local_slurm.sh start DIR | stop DIR: a real Slurm cluster of one node on this host, for the
# tests and for trying cddp's sbatch and srun recipes without a cluster.
#
#   start DIR   writes DIR/slurm.conf and a fresh munge key, starts munged (its own socket in
#               DIR), slurmctld and one slurmd (node "localhost", 4 CPUs, one partition "cddp"),
#               each on ports free now, and waits until the node is idle. Prints the line that
#               points Slurm's commands at it: export SLURM_CONF=DIR/slurm.conf
#   stop DIR    cancels the cluster's jobs and ends the daemons it started (by the PIDs in DIR).
#               Safe to call twice, or after a failed start.
#
# Needs root (slurmd starts tasks as their user) and Debian's slurmctld, slurmd, slurm-client and
# munge (`make test` installs them). Nothing outside DIR is written; the system's munged and
# slurm.conf, if any, are left alone.
set -eu
usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# = 2 ] || usage
cmd=$1
dir=$2

# A TCP port on 127.0.0.1 that no socket uses now (Slurm's daemons take fixed ports). Taken from
# 30000 up to the kernel's ephemeral range, which starts at 32768 on a stock host: a port there
# is never a client connection's local port, and cddp's ports derived from Slurm job ids lie
# below 30000. Another program may still bind the port before the daemon does; start() retries.
free_port() {
    lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    span=$((lo - 30000))
    [ "$span" -ge 256 ] || span=20000
    for _ in $(seq 200); do
        p=$(($(od -An -N2 -tu2 /dev/urandom) % span + 30000))
        ss -Htan "sport = :$p" | grep -q . || { echo "$p"; return 0; }
    done
    echo "local_slurm.sh: no free port from 30000 on" >&2
    return 1
}

# end_daemons NAME...: ends each daemon by the PID in DIR/NAME.pid, SIGKILL after 5 s.
end_daemons() {
    for d in "$@"; do
        [ -s "$dir/$d.pid" ] || continue
        pid=$(cat "$dir/$d.pid")
        kill "$pid" 2>/dev/null || true
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/$d.pid"
    done
}

stop() {
    [ -d "$dir" ] || return 0
    if [ -s "$dir/slurm.conf" ] && [ -s "$dir/slurmctld.pid" ]; then
        SLURM_CONF="$dir/slurm.conf" timeout 5 scancel --full --quiet --partition=cddp 2>/dev/null || true
        # The jobs' tasks end with their step daemons; give them a moment.
        i=0
        while [ $i -lt 50 ] && [ -n "$(SLURM_CONF="$dir/slurm.conf" timeout 2 squeue -h -o %i 2>/dev/null)" ]; do
            i=$((i + 1))
            sleep 0.1
        done
    fi
    end_daemons slurmd slurmctld munged
}

start() {
    [ "$(id -u)" = 0 ] || { echo "local_slurm.sh: slurmd must run as root" >&2; exit 1; }
    for b in munged slurmctld slurmd srun sbatch; do
        command -v "$b" >/dev/null || {
            echo "local_slurm.sh: $b is missing: apt-get install munge slurmctld slurmd slurm-client" >&2
            exit 1
        }
    done
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    chmod 755 "$dir"  # munged wants its socket's directory searchable by every user
    mkdir -p "$dir/state" "$dir/spool"
    head -c 1024 /dev/urandom > "$dir/munge.key"
    chmod 600 "$dir/munge.key"
    munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
        --log-file="$dir/munged.log" --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed"
    # Up to three sets of ports: a port free when chosen may be bound by someone else before
    # the daemon binds it.
    for attempt in 1 2 3; do
        start_slurm && return 0
        if [ $attempt -lt 3 ] && grep -qs "Address already in use" "$dir/slurmd.log" "$dir/slurmctld.log"; then
            echo "local_slurm.sh: a port was taken before Slurm bound it; trying other ports" >&2
            end_daemons slurmd slurmctld
            rm -f "$dir/slurmd.log" "$dir/slurmctld.log"
            continue
        fi
        echo "local_slurm.sh: the node did not become idle in 20 s; from its logs:" >&2
        tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 2>/dev/null || true
        stop
        exit 1
    done
}

# start_slurm: writes slurm.conf with new ports, starts slurmctld and slurmd, and waits until the
# node is idle; fails after 20 s.
start_slurm() {
    ctld_port=$(free_port)
    d_port=$(free_port)
    while [ "$d_port" = "$ctld_port" ]; do d_port=$(free_port); done
    cat > "$dir/slurm.conf" <<EOF
# A one-node cluster for cddp's tests (tests/slurm/local_slurm.sh).
ClusterName=cddp
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# No cgroups: processes are tracked by parentage, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
# Look at pending jobs every second, not every minute (sched_interval's default).
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
# 4 CPUs whatever this host has (config_overrides), so that two 2-task jobs run side by side.
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=cddp Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    slurmctld -f "$dir/slurm.conf" -i
    slurmd -f "$dir/slurm.conf" -N localhost
    i=0
    t0=$(date +%s)
    # sinfo retries for many seconds while no slurmctld answers: 2 s each, 20 s in all.
    until [ "$(SLURM_CONF="$dir/slurm.conf" timeout 2 sinfo -h -o %t 2>/dev/null)" = idle ]; do
        i=$((i + 1))
        [ $i -lt 200 ] && [ "$(date +%s)" -lt $((t0 + 20)) ] || return 1
        # A daemon that could not bind its port has exited: no need to wait the 20 s.
        ! grep -qs "Address already in use" "$dir/slurmd.log" "$dir/slurmctld.log" || return 1
        sleep 0.1
    done
    echo "export SLURM_CONF=$dir/slurm.conf"
}

case "$cmd" in
start)
    trap 'rc=$?; [ $rc = 0 ] || stop; exit $rc' EXIT
    start
    trap - EXIT ;;
stop) stop ;;
*) usage ;;
esac
