#!/bin/sh
# slurm_test.sh BUILD_DIR: cddp under a real Slurm (slurmctld, slurmd and munged started on this
# host by local_slurm.sh, stopped on every exit), with nothing exported by hand:
#
#   srun          srun -n 2 trains Fashion-MNIST; the same final loss as cddprun's 2 ranks
#   recipes       examples/slurm/{srun,cddprun,mpirun}.sbatch through sbatch (waited for): the same
#   twice         srun -n 2 cddprun on one node: refused, with the line to use
#   sbatch_direct the program straight from the batch script: one process, and it says so
#   two_jobs      two 2-task jobs at once: each meets at its own derived port, both whole
#   same_port     two jobs at once with the same MASTER_PORT: one trains, the other's tasks fail
#                 with a message (port taken, or another job's store), never a mixed group
#   kill          SIGKILL to task 1 mid-training: rank 0 names it, srun ends within 10 s; rank
#                 0's flight record (no cddprun: by Slurm's job id) says so
#   pmix          srun --mpi=pmix: the MPI backend, and why
#   pmi2          srun --mpi=pmi2: cddp's own transport, and why
set -u
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
FM="$build/bin/fashion_mnist"
C="$build/bin/comm_check"
[ "$(id -u)" = 0 ] || { echo "cannot run on this machine: slurmd needs root"; exit 77; }
work=$(mktemp -d)
cluster="$work/slurm"
trap '"$here/local_slurm.sh" stop "$cluster"; rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
# Nothing of an enclosing launcher or allocation leaks in (ctest itself may run under Slurm).
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\|PMIX_[A-Z_0-9]*\|PMI_[A-Z_]*\|OMPI_[A-Z_]*\)=.*/\1/p'); do
    unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMP_NUM_THREADS \
    OPENBLAS_NUM_THREADS CDDP_STORE_PORT CDDP_STORE_ADDR CDDP_STORE_TOKEN
export CDDP_LOG_LEVEL=info CDDP_RDZV_TIMEOUT_S=60

t_start=$(date +%s)
# ok TEXT: a case passed, with the seconds since the start (a slow Slurm shows where).
ok() { echo "ok: [$(($(date +%s) - t_start)) s] $*"; }
fail() {
    echo "FAIL: $*"
    for f in "$work"/*.out "$work"/*.err; do [ -s "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
    for f in "$cluster"/slurmctld.log "$cluster"/slurmd.log; do
        [ -s "$f" ] && { echo "--- $f"; tail -n 10 "$f"; }
    done
    exit 1
}
has() { grep -qF -- "$2" "$1" || fail "'$2' is not in $1"; }
# json FILE KEY: the value of KEY in the JSON line FILE's training printed.
json() { sed -n "s/^{.*\"$2\": \([^,}]*\).*/\1/p" "$1" | tail -n 1; }
train_args="--epochs 1 --limit 2000 --json"
# batch ARGS...: sbatch ARGS, then waits for the job's end as sbatch --wait does, but looking at its
# state every 0.1 s (sbatch --wait sleeps 2 s between its looks, longer each time up to 10 s: a
# job of 3 s cost up to 12); fails unless the job completed.
batch() {
    id=$(sbatch --parsable "$@") || return 1
    id=${id%%;*} t=0 st=""
    while [ $t -lt 1200 ]; do
        st=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
        case "$st" in PENDING | CONFIGURING | RUNNING | COMPLETING | "") ;; *) break ;; esac
        sleep 0.1
        t=$((t + 1))
    done
    [ "$st" = COMPLETED ] && return 0
    echo "batch job $id: $st ($(scontrol show job "$id" 2>/dev/null | grep -o 'ExitCode=[0-9:]*'))" >&2
    return 1
}

out=$("$here/local_slurm.sh" start "$cluster") || fail "the local Slurm did not start"
eval "$out"
cd "$work" || exit 1
ok "a Slurm cluster of one node (4 CPUs) on this host: $SLURM_CONF"

# The reference: the same training under cddprun.
"$build/bin/cddprun" --standalone --nproc_per_node 2 "$FM" $train_args --out ref > ref.out 2> ref.err ||
    fail "cddprun exited $?"
ref_loss=$(json ref.out final_loss)
[ -n "$ref_loss" ] || fail "no final_loss from cddprun"

# srun: the group forms from srun's variables alone.
srun -n 2 "$FM" $train_args --out srun > srun.out 2> srun.err || fail "srun exited $?"
has srun.err "[cddp rank 0] I comm: srun: meeting at localhost:"
has srun.err "2 ranks on 1 host: shared memory (every rank on this host); started by srun (SLURM_PROCID set)"
[ "$(json srun.out world)" = 2 ] || fail "srun's training ran on $(json srun.out world) ranks, not 2"
[ "$(json srun.out final_loss)" = "$ref_loss" ] ||
    fail "srun's final loss $(json srun.out final_loss) is not cddprun's $ref_loss"
ok "srun -n 2 with nothing exported: 2 ranks, final loss $ref_loss as under cddprun"

# The three batch scripts of examples/slurm/, as documented, on 2 CPUs of the one node (sbatch's
# command line wins over their #SBATCH lines).
export TRAIN="$FM" CDDPRUN="$build/bin/cddprun" CDDP_TOKEN_FILE="$work/token"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for r in srun cddprun mpirun; do
    shape="-N 1 --ntasks-per-node 2"
    [ $r = cddprun ] && shape="-N 1 --ntasks-per-node 1 --cpus-per-task 2"
    TRAIN_ARGS="$train_args --out $r" batch $shape -o $r.out -e $r.err \
        "$here/../../examples/slurm/$r.sbatch" > /dev/null || fail "sbatch $r.sbatch failed"
    [ "$(json $r.out world)" = 2 ] || fail "$r.sbatch trained on $(json $r.out world) ranks, not 2"
    loss=$(json $r.out final_loss)
    # MPI's allreduce may add in another order than cddp's: the same loss to 1e-4.
    /usr/bin/python3 -c "import sys; sys.exit(abs($loss - $ref_loss) > 1e-4 * abs($ref_loss))" ||
        fail "$r.sbatch's final loss $loss is not cddprun's $ref_loss"
done
has cddprun.err "cddprun: srun step "
has mpirun.err "2 ranks on 1 host: mpi (OMPI_COMM_WORLD_SIZE set); started by mpirun"
ok "examples/slurm/{srun,cddprun,mpirun}.sbatch: 2 ranks each, cddprun's final loss"
unset TRAIN CDDPRUN CDDP_TOKEN_FILE OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM

# cddprun as 2 tasks of one node would start two node 0s: refused.
srun -n 2 "$build/bin/cddprun" --nproc_per_node 2 "$FM" > twice.out 2> twice.err &&
    fail "srun -n 2 cddprun on one node exited 0"
has twice.err "cddprun starts a node's workers itself, so start one per node (srun --ntasks-per-node=1 cddprun ...)"
ok "srun -n 2 cddprun on one node: refused, with the line to use"

# The program straight from a batch script of 2 tasks (no srun): one process, a warning.
batch -n 2 -o direct.out -e direct.err --wrap "'$FM' $train_args --out direct" \
    > /dev/null || fail "sbatch (direct) failed"
[ "$(json direct.out world)" = 1 ] || fail "the batch script's program ran on $(json direct.out world) ranks"
has direct.err "SLURM_NTASKS=2, but this process was not started by srun (SLURM_STEP_ID is unset: a batch script?): it trains alone"
ok "the program started straight from sbatch: one process, and it says why"

# Two jobs at once, nothing exported: each meets at its own port and trains whole.
srun -n 2 "$FM" $train_args --out a > a.out 2> a.err &
pa=$!
srun -n 2 "$FM" $train_args --out b > b.out 2> b.err &
pb=$!
wait $pa || fail "job A exited $?"
wait $pb || fail "job B exited $?"
for j in a b; do
    [ "$(json $j.out world)" = 2 ] && [ "$(json $j.out final_loss)" = "$ref_loss" ] ||
        fail "job $j: world $(json $j.out world), loss $(json $j.out final_loss)"
done
pa=$(sed -n 's/.*meeting at localhost:\([0-9]*\).*/\1/p' a.err)
pb=$(sed -n 's/.*meeting at localhost:\([0-9]*\).*/\1/p' b.err)
[ -n "$pa" ] && [ "$pa" != "$pb" ] || fail "the two jobs met at ports '$pa' and '$pb'"
ok "two jobs at once: ports $pa and $pb, each trained whole"

# Two jobs at once with the same MASTER_PORT: never one group of both. Each job that trains
# does so whole (2 ranks, cddprun's loss); one that fails says it met another job. Whether the
# second fails depends on how the two overlap, which Slurm decides.
port=$((20000 + $$ % 9000))
while ss -Htln "sport = :$port" | grep -q .; do port=$((port + 1)); done
# --kill-on-bad-exit: a task whose rank 0 failed would otherwise wait CDDP_RDZV_TIMEOUT_S for a
# store that is not coming (srun waits for every task).
MASTER_PORT=$port srun --kill-on-bad-exit=1 -n 2 "$FM" $train_args --out c > c.out 2> c.err &
pa=$!
MASTER_PORT=$port srun --kill-on-bad-exit=1 -n 2 "$FM" $train_args --out d > d.out 2> d.err &
pb=$!
wait $pa
ra=$?
wait $pb
rb=$?
[ $ra = 0 ] || [ $rb = 0 ] || fail "neither job at MASTER_PORT=$port trained (exits $ra and $rb)"
for j in c d; do
    if [ "$(json $j.out world)" = 2 ]; then
        [ "$(json $j.out final_loss)" = "$ref_loss" ] ||
            fail "job $j at one MASTER_PORT: loss $(json $j.out final_loss), not $ref_loss"
    else
        grep -qE "already in use|this store belongs to another job|a store that was stopping|Killed" $j.err ||
            fail "job $j neither trained nor said it met another job"
    fi
done
ok "two jobs at MASTER_PORT=$port (exits $ra and $rb): each trained whole or was turned away"

# A task killed mid-training: rank 0 names it and the step ends; rank 0's flight record is in
# $TMPDIR/cddp-flight-<job id>, and cddp-trace says rank 1 left none.
mkdir -p "$work/tmp"
TMPDIR="$work/tmp" srun --job-name cddp-kill -n 2 "$FM" --epochs 1000 --limit 2000 --out kill \
    > kill.out 2> kill.err &
ps=$!
pid=""
i=0
while [ -z "$pid" ] && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
    grep -q "^epoch: 1," kill.out 2>/dev/null || continue
    job=$(squeue -h -n cddp-kill -o %i)
    [ -n "$job" ] && pid=$(scontrol listpids "$job.0" 2>/dev/null | awk '$5 == 1 {print $1}')
done
[ -n "$pid" ] || fail "task 1 of the training job was not found in 30 s"
t0=$(date +%s%N)
kill -9 "$pid"
wait $ps
rs=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rs != 0 ] || fail "srun exited 0 after a task was killed"
[ $ms -le 10000 ] || fail "srun took $ms ms to end after the kill"
has kill.err "rank 0: rank 1 (pid $pid) died during collective"
[ -s "$work/tmp/cddp-flight-$job/rank-0.json" ] || fail "no flight record of rank 0 in \$TMPDIR/cddp-flight-$job"
"$build/bin/cddp-trace" --world 2 "$work/tmp/cddp-flight-$job" > trace.out 2>&1 || fail "cddp-trace exited $?"
has trace.out "wrote it: rank 0: rank 1 (pid $pid) died during collective"
has trace.out "rank 1 left no record"
ok "task 1 (pid $pid) killed: rank 0 named it, srun exited $rs after $ms ms; its flight record says so"

# srun --mpi=pmix: MPI, through slurmd's PMIx server.
srun --mpi=pmix -n 2 "$C" launch > pmix.out 2> pmix.err || fail "srun --mpi=pmix exited $?"
has pmix.err "2 ranks on 1 host: mpi (SLURM_PROCID set; PMIX_RANK set: srun --mpi=pmix); started by srun"
[ "$(grep -c '^ok: rank [01] of 2 (mpi backend)' pmix.out)" = 2 ] || fail "not 2 ranks on MPI under pmix"
srun --mpi=pmix -n 2 "$FM" $train_args --out pmix > pmixfm.out 2> pmixfm.err ||
    fail "training under srun --mpi=pmix exited $?"
loss=$(json pmixfm.out final_loss)
/usr/bin/python3 -c "import sys; sys.exit(abs($loss - $ref_loss) > 1e-4 * abs($ref_loss))" ||
    fail "the final loss under pmix, $loss, is not cddprun's $ref_loss (to 1e-4)"
ok "srun --mpi=pmix: the MPI backend, final loss $loss (cddprun's $ref_loss)"

# srun --mpi=pmi2: not for Debian's Open MPI, so cddp's own transport.
srun --mpi=pmi2 -n 2 "$C" launch > pmi2.out 2> pmi2.err || fail "srun --mpi=pmi2 exited $?"
has pmi2.err "started by srun (SLURM_PROCID set; --mpi=pmi2 is not for Open MPI)"
[ "$(grep -c '^ok: rank [01] of 2 (shm backend)' pmi2.out)" = 2 ] || fail "not 2 ranks on shm under pmi2"
ok "srun --mpi=pmi2: cddp's own transport, and rank 0 says why"
