#!/bin/sh
# launch_test.sh BUILD_DIR SCENARIO: what a group makes of each launcher's environment, through
# comm_check launch: the line rank 0 logs once (ranks, hosts, backend and why, launcher) and the
# math libraries' threads when ranks share the host.
#
#   cddprun        2 ranks under cddprun: shared memory; cddprun already set the threads
#   mpirun         2 ranks under Open MPI's mpirun: the MPI backend; threads set to 1, said once
#   srun           2 tasks with the variables srun gives a step on one node (SLURM_PROCID,
#                  SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_ID, ...) and no MASTER_*: they meet at
#                  the step's first host and the port derived from the job and step; threads 1
#   srun_threads   the same with OMP_NUM_THREADS=2 set by the user: left alone
#   srun_two_jobs  two jobs' tasks at the same MASTER_PORT: job B's is turned away by job A
#   srun_addr_only MASTER_ADDR alone: the port is still derived; MASTER_PORT alone: the address is
#                  still the step's first host; rank 0 says which is which
#   srun_port_taken the derived port in use on the first host: rank 0 names the port, how it was
#                  derived, why it can be taken, and says to export MASTER_PORT
#   sbatch         srun's variables without SLURM_STEP_ID (a batch script): one process, a warning
#   srun_pmi2      srun's variables and srun --mpi=pmi2's PMI_RANK/PMI_SIZE: cddp's own transport
#   srun_cddprun   one cddprun per node of a 2-node step (srun --ntasks-per-node=1 cddprun): the
#                  node count, node rank and node 0's store from the step; 2 tasks on one node
#                  are refused with the line to use instead
set -u
build=$1 scenario=$2
C="$build/bin/comm_check"
work=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill "$p" 2>/dev/null; done; rm -rf "$work"' EXIT
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS GOTO_NUM_THREADS RANK WORLD_SIZE LOCAL_RANK \
    LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT CDDP_STORE_PORT
export CDDP_LOG_LEVEL=info
PMI2=""
fail() { echo "FAIL: $*"; for f in "$work"/out* "$work"/err*; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
# once FILE TEXT: TEXT is on exactly one line of FILE.
once() { [ "$(grep -cF -- "$2" "$1")" = 1 ] || fail "'$2' is not on exactly one line of $1"; }
# none FILE TEXT
none() { grep -qF -- "$2" "$1" && fail "'$2' is in $1"; return 0; }
# oks N PATTERN: N "ok:" lines of the outputs match PATTERN (fixed text).
oks() { [ "$(cat "$work"/out* | grep '^ok: ' | grep -cF -- "$2")" = "$1" ] || fail "not $1 ok lines with '$2'"; }

# srun's variables for task $1 of $2 on one node, as a step of job $3 (with PMI2 set, also those
# of srun --mpi=pmi2).
srun_task() {
    env ${PMI2:+PMI_RANK="$1" PMI_SIZE="$2"} SLURM_PROCID="$1" SLURM_NTASKS="$2" \
        SLURM_LOCALID="$1" SLURM_NODEID=0 SLURM_NNODES=1 SLURM_STEP_NUM_NODES=1 \
        SLURM_STEP_NUM_TASKS="$2" SLURM_STEP_TASKS_PER_NODE="$2" SLURM_TASKS_PER_NODE="$2" \
        SLURM_STEP_NODELIST=localhost SLURM_JOB_NODELIST=localhost SLURM_JOB_ID="$3" \
        SLURM_STEP_ID=0 SLURMD_NODENAME=localhost "$C" launch
}
# A job id whose derived port (10000 + 10 (job mod 2000) + step) is free now.
free_job() {
    /usr/bin/python3 - <<'PY'
import random, socket
for _ in range(200):
    job = random.randrange(1, 2000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 10000 + 10 * job))
    except OSError:
        continue
    finally:
        s.close()
    print(job)
    break
PY
}
# The same outside a step, as a batch script has them (no SLURM_STEP_ID).
batch_task() {
    env SLURM_PROCID=0 SLURM_NTASKS="$1" SLURM_NNODES=1 SLURM_TASKS_PER_NODE="$1" \
        SLURM_JOB_NODELIST=localhost SLURM_JOB_ID="$2" "$C" launch
}
srun_pair() {
    job=$(free_job)
    [ -n "$job" ] || fail "no free port in 10000..29999"
    srun_task 0 2 "$job" > "$work/out0" 2> "$work/err0" &
    p0=$!
    srun_task 1 2 "$job" > "$work/out1" 2> "$work/err1" &
    p1=$!
    pids="$p0 $p1"
    wait $p0 || fail "task 0 exited $?"
    wait $p1 || fail "task 1 exited $?"
    pids=""
    cat "$work/err0" "$work/err1" > "$work/err"
}

case "$scenario" in
cddprun)
    "$build/bin/cddprun" --standalone --nproc_per_node 2 "$C" launch > "$work/out" 2> "$work/err" ||
        fail "cddprun exited $?"
    once "$work/err" "[cddp rank 0] I comm: 2 ranks on 1 host: shared memory (every rank on this host); started by cddprun"
    none "$work/err" "share this host"
    oks 2 "(shm backend), local rank"
    oks 2 "threads 1, OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1, cores of its own $(($(nproc) / 2))"
    once "$work/err" "cddprun: setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 for each worker (unset here)"
    # --bind_core: each worker on its share of the CPUs, with a thread for each.
    share=$(($(nproc) / 2))
    [ "$share" -ge 1 ] || share=1
    "$build/bin/cddprun" --standalone --nproc_per_node 2 --bind_core "$C" launch > "$work/out" \
        2> "$work/err" || fail "cddprun --bind_core exited $?"
    oks 2 "threads $share, OMP_NUM_THREADS=$share OPENBLAS_NUM_THREADS=$share, cores of its own $share"
    once "$work/err" "cddprun: --bind_core: each of the 2 workers is bound to $share CPU"
    # One worker bound to every CPU: as many threads.
    "$build/bin/cddprun" --standalone --nproc_per_node 1 --bind_core "$C" launch > "$work/out" \
        2> "$work/err" || fail "cddprun --bind_core, 1 worker, exited $?"
    oks 1 "threads $(nproc), OMP_NUM_THREADS=$(nproc) OPENBLAS_NUM_THREADS=$(nproc), cores of its own $(nproc)"
    echo "ok: cddprun: one backend line, threads from cddprun, bound or not" ;;
mpirun)
    # Unbound (--bind-to none): the ranks share the host's CPUs, one thread each.
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$C" launch > "$work/out" \
        2> "$work/err" || fail "mpirun exited $?"
    once "$work/err" "[cddp rank 0] I comm: 2 ranks on 1 host: mpi (OMPI_COMM_WORLD_SIZE set); started by mpirun"
    once "$work/err" "[cddp rank 0] I comm: 2 ranks share this host: setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (unset here)"
    oks 2 "(mpi backend), local rank"
    oks 2 "of 2, threads 1, OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
    if [ "$(nproc)" -ge 2 ]; then
        # Bound to a core each (mpirun's default for 2 ranks): CPUs of their own, as many
        # threads as each has (here 1), said so.
        mpirun --allow-run-as-root -np 2 --bind-to core "$C" launch > "$work/out" 2> "$work/err" ||
            fail "mpirun --bind-to core exited $?"
        once "$work/err" "[cddp rank 0] I comm: 2 ranks on this host, each bound to CPUs of its own: setting OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (unset here) to each rank's count of CPUs (1 on rank 0)"
        none "$work/err" "share this host"
        oks 2 "of 2, threads 1, OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1, cores of its own 1"
    fi
    # Both on one CPU: no core of its own for either.
    taskset -c 0 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$C" launch \
        > "$work/out" 2> "$work/err" || fail "mpirun on one CPU exited $?"
    oks 2 "of 2, threads 1, OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1, cores of its own 0"
    echo "ok: mpirun: the MPI backend and why, said once; one thread per rank, bound or not" ;;
srun)
    srun_pair
    once "$work/err" "[cddp rank 0] I comm: 2 ranks on 1 host: shared memory (every rank on this host); started by srun (SLURM_PROCID set)"
    once "$work/err" "[cddp rank 0] I comm: srun: meeting at localhost:$((10000 + 10 * job))"
    once "$work/err" "[cddp rank 0] I comm: 2 ranks share this host: setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (unset here)"
    oks 1 "ok: rank 0 of 2 (shm backend), local rank 0 of 2, threads 1, OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
    oks 1 "ok: rank 1 of 2 (shm backend), local rank 1 of 2, threads 1, OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
    echo "ok: srun's variables: rank 0's store on the derived address, the backend said once, one thread per task" ;;
srun_threads)
    export OMP_NUM_THREADS=2
    srun_pair
    none "$work/err" "share this host"
    oks 2 "threads 2, OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=unset"
    echo "ok: srun with OMP_NUM_THREADS=2: the user's choice stays" ;;
srun_two_jobs)
    # Two jobs' steps meet at one address (the same MASTER_PORT): job B's task 1 is turned away
    # by job A's rank 0 (another job's token), and job A's own task 1 then completes the group.
    job=$(free_job)
    port=$((10000 + 10 * job))
    export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CDDP_RDZV_TIMEOUT_S=30
    srun_task 0 2 "$job" > "$work/out0" 2> "$work/err0" &
    p0=$!
    pids="$p0"
    srun_task 1 2 $((job + 1)) > "$work/outB" 2> "$work/errB" && fail "job B's task joined job A"
    grep -q "wrong job token: this store belongs to another job" "$work/errB" ||
        fail "job B's task did not say it met another job"
    srun_task 1 2 "$job" > "$work/out1" 2> "$work/err1" || fail "job A's task 1 exited $?"
    wait $p0 || fail "job A's task 0 exited $?"
    pids=""
    oks 1 "ok: rank 0 of 2"
    oks 1 "ok: rank 1 of 2"
    echo "ok: two srun jobs at one address: the other job's task is turned away, each job whole" ;;
srun_addr_only)
    MASTER_ADDR=127.0.0.1 srun_pair
    once "$work/err" "[cddp rank 0] I comm: srun: meeting at 127.0.0.1:$((10000 + 10 * job)) (MASTER_ADDR; the port derived from the job and step; MASTER_PORT chooses another)"
    oks 2 "(shm backend)"
    port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    MASTER_PORT=$port srun_pair
    once "$work/err" "[cddp rank 0] I comm: srun: meeting at localhost:$port (the step's first host; MASTER_ADDR chooses another; MASTER_PORT)"
    oks 2 "(shm backend)"
    echo "ok: srun with MASTER_ADDR alone or MASTER_PORT alone: the other one derived, and said" ;;
srun_port_taken)
    job=$(free_job)
    port=$((10000 + 10 * job))
    # another program holds the derived port
    /usr/bin/python3 -c 'import socket, sys, time; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("held", flush=True); time.sleep(60)' "$port" > "$work/held" &
    holder=$!
    pids="$holder"
    for _ in $(seq 100); do grep -q held "$work/held" 2>/dev/null && break; sleep 0.1; done
    CDDP_RDZV_TIMEOUT_S=5 srun_task 0 2 "$job" > "$work/out0" 2> "$work/err0" && fail "rank 0 started its store on a port in use"
    kill "$holder"
    wait "$holder" 2>/dev/null
    pids=""
    once "$work/err0" "srun: port $port on localhost, derived from job $job step 0 (10000 + 10 x (job mod 2000) + step mod 10), is in use: by another program, or by a job whose id differs by a multiple of 2000; export MASTER_PORT=<a free port> before srun"
    echo "ok: the derived port in use: rank 0 says why and to export MASTER_PORT" ;;
srun_pmi2)
    # srun --mpi=pmi2 adds PMI_RANK/PMI_SIZE: not the MPI backend (Debian's Open MPI would fail
    # in MPI_Init on every rank) but srun's own way, and rank 0 says why.
    PMI2=1
    srun_pair
    once "$work/err" "started by srun (SLURM_PROCID set; --mpi=pmi2 is not for Open MPI)"
    oks 2 "(shm backend)"
    echo "ok: srun --mpi=pmi2's variables: cddp's own transport, and rank 0 says why" ;;
srun_cddprun)
    # Two "nodes" (127.0.0.1 and 127.0.0.2, each its own CDDP_HOST_ID), each cddprun task 0 or 1
    # of a step of 2 tasks on 2 nodes; nothing names the node count, rank or address.
    job=$(free_job)
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token")
    node() { # node NODE_ID
        env SLURM_PROCID="$1" SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NODEID="$1" SLURM_NNODES=2 \
            SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_TASKS_PER_NODE="1(x2)" \
            SLURM_STEP_NODELIST="localhost,127.0.0.2" SLURM_JOB_NODELIST="localhost,127.0.0.2" \
            SLURM_JOB_ID="$job" SLURM_STEP_ID=0 CDDP_HOST_ID="host-$1" \
            "$build/bin/cddprun" --nproc_per_node 2 --token_file "$work/token" \
            --local_addr "127.0.0.$(($1 + 1))" "$C" launch
    }
    node 0 > "$work/out0" 2> "$work/err0" &
    p0=$!
    pids="$p0"
    node 1 > "$work/out1" 2> "$work/err1" || fail "node 1's cddprun exited $?"
    wait $p0 || fail "node 0's cddprun exited $?"
    pids=""
    once "$work/err0" "cddprun: srun step $job.0: 2 nodes, node 0's store at localhost:$((10000 + 10 * job))"
    none "$work/err1" "srun step"
    for r in 0 1 2 3; do oks 1 "ok: rank $r of 4 (tcp backend)"; done
    cat "$work/err0" "$work/err1" > "$work/err"
    once "$work/err" "allreduce is hierarchical: shared memory among each host's ranks (2 on rank 0's)"
    # srun -n 2 on one node: two node 0s; refused, with what to run instead.
    env SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_NODEID=0 SLURM_STEP_NUM_NODES=1 SLURM_JOB_ID="$job" \
        SLURM_STEP_ID=0 SLURM_STEP_NODELIST=localhost "$build/bin/cddprun" --nproc_per_node 2 \
        "$C" launch > "$work/out2" 2> "$work/err2"
    [ $? = 2 ] || fail "cddprun as one of 2 tasks on a node did not exit 2"
    once "$work/err2" "started by srun as task 0 of 2 on 1 node: cddprun starts a node's workers itself, so start one per node (srun --ntasks-per-node=1 cddprun ...), or give --nnodes and --node_rank"
    echo "ok: srun --ntasks-per-node=1 cddprun on 2 nodes: 4 ranks, nothing given by hand; 2 tasks on a node refused" ;;
sbatch)
    # Started straight from a batch script of 2 tasks: one process, and a warning that says so.
    batch_task 2 "$(free_job)" > "$work/out0" 2> "$work/err0" || fail "the task exited $?"
    oks 1 "ok: rank 0 of 1"
    once "$work/err0" "SLURM_NTASKS=2, but this process was not started by srun (SLURM_STEP_ID is unset: a batch script?): it trains alone"
    echo "ok: a batch script's variables are not a step's: one process, and it says so" ;;
*) fail "unknown scenario $scenario" ;;
esac
