#!/bin/sh
# launcher_test.sh BUILD_DIR SCENARIO: cddprun scenarios through the real binary, for ctest.
# Each scenario prints what it checks and exits 0 (pass) or 1 (fail).
set -u
build=$1
scenario=$2
R="$build/bin/cddprun"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE
export CDDP_LOG_LEVEL=error

fail() { echo "FAIL: $*"; exit 1; }
expect_in() { grep -qF -- "$1" "$2" || { echo "--- $2:"; cat "$2"; fail "'$1' not in $2"; }; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits up to $2 seconds for every pid listed in file(s) $1 to be gone.
all_gone() {
    end=$(( $(date +%s) + $2 ))
    while [ "$(date +%s)" -le "$end" ]; do
        alive=0
        for f in $1; do kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

case "$scenario" in
env)
    # The environment contract in every worker; ranks a permutation of 0..N-1.
    "$R" --standalone --nproc_per_node 3 sh -c "env > $work/env.\$RANK" > "$work/out" 2>&1 ||
        fail "cddprun exited $?"
    for r in 0 1 2; do
        f="$work/env.$r"
        [ -f "$f" ] || fail "no worker with RANK=$r"
        for v in "RANK=$r" "LOCAL_RANK=$r" WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 \
            MASTER_ADDR=127.0.0.1 CDDP_RESTART_COUNT=0 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; do
            grep -qx "$v" "$f" || fail "rank $r lacks $v"
        done
        for v in MASTER_PORT CDDP_RUN_ID CDDP_STORE_ADDR CDDP_STORE_PORT CDDP_STORE_TOKEN; do
            grep -q "^$v=." "$f" || fail "rank $r lacks $v"
        done
    done
    [ "$(grep -h '^CDDP_RUN_ID=' "$work"/env.* | sort -u | wc -l)" = 1 ] || fail "run ids differ"
    [ "$(ls "$work"/env.* | wc -l)" = 3 ] || fail "not 3 workers"
    expect_in "setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1" "$work/out"
    # Options from the environment, and threads left alone when set.
    CDDPRUN_NPROC_PER_NODE=2 CDDPRUN_STANDALONE=1 OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3 \
        "$R" sh -c "env > $work/e2.\$RANK" || fail "env options run failed"
    [ "$(ls "$work"/e2.* | wc -l)" = 2 ] || fail "CDDPRUN_NPROC_PER_NODE=2 did not give 2 workers"
    grep -qx OMP_NUM_THREADS=3 "$work/e2.0" || fail "OMP_NUM_THREADS was overridden"
    echo "ok: environment contract in 3 workers, ranks 0..2; CDDPRUN_* options" ;;
multinode)
    # 2 nodes x 2 processes on 127.0.0.1 and 127.0.0.2; ranks contiguous per node.
    port=$(free_port)
    # The secret from the environment, as a user keeps it off the command line.
    export CDDPRUN_TOKEN=multinode-secret
    common="--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port $port"
    "$R" $common --node_rank 0 --local_addr 127.0.0.1 sh -c "env > $work/env.\$RANK" > "$work/n0" 2>&1 &
    p0=$!
    "$R" $common --node_rank 1 --local_addr 127.0.0.2 sh -c "env > $work/env.\$RANK" > "$work/n1" 2>&1 ||
        fail "node 1 exited $?"
    wait $p0 || fail "node 0 exited $?"
    for r in 0 1 2 3; do
        node=$((r / 2)); addr=127.0.0.$((node + 1))
        grep -qx "WORLD_SIZE=4" "$work/env.$r" || fail "rank $r: WORLD_SIZE"
        grep -qx "GROUP_RANK=$node" "$work/env.$r" || fail "rank $r: GROUP_RANK"
        grep -qx "LOCAL_RANK=$((r % 2))" "$work/env.$r" || fail "rank $r: LOCAL_RANK"
        grep -qx "CDDP_LOCAL_ADDR=$addr" "$work/env.$r" || fail "rank $r: host"
    done
    # Two launchers with the same --node_rank (a pasted command line): one is refused at once,
    # naming the other; the job goes on with the other.
    port=$(free_port)
    common="--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port"
    "$R" $common --node_rank 0 sh -c 'sleep 0.5' > "$work/t0" 2>&1 &
    p0=$!
    "$R" $common --node_rank 1 sh -c 'sleep 0.5' > "$work/t1" 2>&1 &
    p1=$!
    "$R" $common --node_rank 1 sh -c 'sleep 0.5' > "$work/t2" 2>&1
    rc2=$?
    wait $p1; rc1=$?
    wait $p0 || { cat "$work/t0"; fail "node 0 of the job with twins exited $?"; }
    [ $((rc1 + rc2)) -gt 0 ] && { [ $rc1 = 0 ] || [ $rc2 = 0 ]; } ||
        fail "twins with --node_rank 1: they exited $rc1 and $rc2 (one should be refused)"
    loser="$work/t1"; [ $rc1 = 0 ] && loser="$work/t2"
    expect_in "cddprun: node rank 1 is taken in this job by another launcher (" "$loser"
    expect_in "give each node its own --node_rank" "$loser"
    # Jobs never mix at one endpoint: a node started for another run (--rdzv_id jobB, the same
    # token) is refused at once, naming both ids, by an elastic job and by a fixed one whose nodes
    # take their ranks in the order they come (each as if on a host of its own); jobA goes on
    # with its own nodes, and does not restart.
    export CDDPRUN_TOKEN=one-token-for-every-job
    refused() { # FILE START_NS: jobB's node exited 1 within 1.5 s, naming both runs only
        took=$(( ($(date +%s%N) - $2) / 1000000 ))
        [ "$rc" = 1 ] || { cat "$1"; fail "the node of jobB exited $rc"; }
        [ $took -lt 1500 ] || fail "the node of jobB took $took ms to be refused"
        expect_in "is run 'jobA', but this node was started for run 'jobB'" "$1"
        ! grep -q "node rank\|another launcher on this host\|one too many" "$1" || { cat "$1"; fail "the refusal blames a node rank or a host"; }
    }
    ran_alone() { # FILE: jobA's node ended well, in its own run, without a restart
        expect_in "A jobA" "$1"
        ! grep -q "restart" "$1" || { cat "$1"; fail "jobA restarted for jobB's node"; }
    }
    job_a="sleep 2; echo A \$CDDP_RUN_ID"
    port=$(free_port)
    common="--nnodes 1:3 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port"
    "$R" $common --node_rank 0 --rdzv_id jobA sh -c "$job_a" > "$work/a0" 2>&1 &
    pa=$!
    t0=$(date +%s%N)
    "$R" $common --node_rank 1 --rdzv_id jobB true > "$work/b1" 2>&1; rc=$?
    refused "$work/b1" "$t0"
    wait $pa || { cat "$work/a0"; fail "elastic jobA exited $? after jobB's node came"; }
    ran_alone "$work/a0"
    port=$(free_port)
    common="--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port"
    CDDP_HOST_ID=hostA0 "$R" $common --rdzv_id jobA sh -c "$job_a" > "$work/a0" 2>&1 &
    pa=$!
    CDDP_HOST_ID=hostA1 "$R" $common --rdzv_id jobA sh -c "$job_a" > "$work/a1" 2>&1 &
    pa1=$!
    t0=$(date +%s%N)
    CDDP_HOST_ID=hostB "$R" $common --rdzv_id jobB true > "$work/b1" 2>&1; rc=$?
    refused "$work/b1" "$t0"
    wait $pa1 || { cat "$work/a1"; fail "jobA's node 1 exited $?"; }
    wait $pa || { cat "$work/a0"; fail "jobA exited $? after jobB's node came"; }
    ran_alone "$work/a0"
    unset CDDPRUN_TOKEN
    # An interface's name where an address is expected takes its address (lo: 127.0.0.1), for
    # cddprun, for the ranks' TCP transport, and from CDDP_SOCKET_IFNAME; a name that is neither an
    # address nor an interface is refused before anything starts.
    unset CDDPRUN_TOKEN
    CDDP_TRANSPORT=tcp "$R" --standalone --nproc_per_node 2 --local_addr lo "$build/bin/ddp_train" \
        > "$work/lo" 2>&1 || { cat "$work/lo"; fail "--local_addr lo: cddprun exited $?"; }
    expect_in "cddprun: this node's address is 127.0.0.1 (interface lo)" "$work/lo"
    CDDP_SOCKET_IFNAME=lo "$R" --standalone --nproc_per_node 1 sh -c 'echo "at $CDDP_LOCAL_ADDR"' \
        > "$work/if" 2>&1 || fail "CDDP_SOCKET_IFNAME=lo: cddprun exited $?"
    expect_in "at 127.0.0.1" "$work/if"
    port=$(free_port)
    for r in 0 1; do # the TCP transport of ranks started without cddprun (srun's way), CDDP_LOCAL_ADDR=lo
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            CDDP_HOST_ID=host$r CDDP_STORE_TOKEN=t CDDP_LOCAL_ADDR=lo "$build/bin/ddp_train" > "$work/rank$r" 2>&1 &
        eval "pid$r=\$!"
    done
    wait "$pid0" && wait "$pid1" || { cat "$work/rank0" "$work/rank1"; fail "CDDP_LOCAL_ADDR=lo: a rank failed"; }
    # srun's tasks that lose a peer point at srun's output, not at a launcher's report that srun
    # does not write
    port=$(free_port)
    for r in 0 1; do
        SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NODEID=0 \
            SLURM_STEP_NUM_NODES=1 SLURM_NNODES=1 SLURM_STEP_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=2 \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CDDP_STORE_TOKEN=t "$build/bin/comm_check" kill > "$work/srun$r" 2>&1 &
        eval "pid$r=\$!"
    done
    wait "$pid0"; wait "$pid1"
    expect_in "(srun's output for its task says why)" "$work/srun0"
    "$R" --standalone --nproc_per_node 1 --local_addr nosuchif0 true > "$work/bad" 2>&1; rc=$?
    [ $rc = 2 ] || fail "--local_addr nosuchif0: exit $rc"
    expect_in "--local_addr nosuchif0: 'nosuchif0' is neither an address this machine resolves" "$work/bad"
    expect_in "nor one of its network interfaces (it has lo" "$work/bad"
    CDDP_SOCKET_IFNAME=nosuchif0 "$R" --standalone --nproc_per_node 1 true > "$work/bad" 2>&1; rc=$?
    [ $rc = 2 ] || fail "CDDP_SOCKET_IFNAME=nosuchif0: exit $rc"
    expect_in "CDDP_SOCKET_IFNAME=nosuchif0: this machine has no network interface 'nosuchif0' (it has lo" "$work/bad"
    echo "ok: 2 nodes x 2 workers over loopback, ranks 0..3 contiguous per node; interfaces by name" ;;
exit3)
    "$R" --standalone --nproc_per_node 3 --grace_period 2 sh -c \
        "echo \$\$ > $work/pid.\$RANK; if [ \$RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 60" \
        > "$work/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] || fail "cddprun exited 0"
    expect_in "root cause: rank 1 (local rank 1, host" "$work/out"
    expect_in "exited with code 3" "$work/out"
    all_gone "$work/pid.0 $work/pid.2" 2 || fail "other workers still alive"
    # A worker that ends before its group forms, with exit code 0, ends the job at once: the
    # others, waiting for it in their rendezvous (CDDP_RDZV_TIMEOUT_S: 300 s), name it.
    t0=$(date +%s)
    "$R" --standalone --nproc_per_node 3 sh -c \
        "if [ \$RANK = 1 ]; then exit 0; fi; exec $build/bin/ddp_train" > "$work/early" 2>&1
    rc=$? took=$(( $(date +%s) - t0 ))
    [ $rc = 1 ] || { cat "$work/early"; fail "a job whose rank 1 ended before joining exited $rc"; }
    [ $took -lt 20 ] || fail "a job whose rank 1 ended before joining took $took s to end"
    expect_in "rank 1 exited with code 0 before it joined the group that rank " "$work/early"
    echo "ok: exit 3 reported with rank and code; others stopped; a rank that ended (code 0) before its group formed named in $took s" ;;
sigkill)
    "$R" --standalone --nproc_per_node 2 --grace_period 2 sh -c \
        "echo \$\$ > $work/pid.\$RANK; if [ \$RANK = 0 ]; then sleep 0.2; kill -9 \$\$; fi; sleep 60" \
        > "$work/out" 2>&1 && fail "cddprun exited 0"
    expect_in "rank 0 (local rank 0, host" "$work/out"
    expect_in "was killed by SIGKILL (signal 9)" "$work/out"
    all_gone "$work/pid.1" 2 || fail "rank 1 still alive"
    echo "ok: a SIGKILLed worker is reported as SIGKILL; the other is gone" ;;
grandchild)
    # SIGKILL to cddprun: the workers die with it, and so do their own children (the guardian
    # kills the workers' process groups).
    "$R" --standalone --nproc_per_node 2 sh -c "sleep 300 & echo \$! > $work/gc.\$RANK; wait" \
        > "$work/out" 2>&1 &
    cp=$!
    i=0
    until [ -s "$work/gc.0" ] && [ -s "$work/gc.1" ]; do
        i=$((i + 1))
        [ $i -gt 100 ] && fail "the workers did not start their children"
        sleep 0.1
    done
    kill -9 "$cp"
    wait "$cp" 2>/dev/null
    all_gone "$work/gc.0 $work/gc.1" 5 || fail "the workers' children outlived a SIGKILLed cddprun"
    # A child of a worker that succeeds, and of one that fails: gone when their worker is.
    for code in 0 3; do
        rm -f "$work"/gc.*
        "$R" --standalone --nproc_per_node 2 sh -c "sleep 300 & echo \$! > $work/gc.\$RANK; exit $code" \
            > "$work/out" 2>&1
        all_gone "$work/gc.0 $work/gc.1" 5 || fail "a worker's child outlived its worker (exit $code)"
    done
    # SIGKILL and SIGQUIT (Ctrl-\) to cddprun's whole process group, as a terminal sends them
    # (started with the signals' default actions: a shell's background job ignores SIGQUIT): the
    # guardian, in a group of its own, still ends the workers' children.
    for sig in KILL QUIT; do
        rm -f "$work"/gc.*
        python3 - "$R" "$work" "$sig" <<'PYEOF' || fail "SIG$sig to cddprun's group: the workers' children outlived it"
import os, signal, subprocess, sys, time
r, work, sig = sys.argv[1:]
def fresh():  # a session of its own, with the default actions a terminal's job has
    os.setsid()
    for s in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
p = subprocess.Popen([r, "--standalone", "--nproc_per_node", "2", "sh", "-c",
                      f"sleep 300 & echo $! > {work}/gc.$RANK; wait"], preexec_fn=fresh,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
paths = [f"{work}/gc.{k}" for k in (0, 1)]
for _ in range(100):
    if all(os.path.exists(q) and os.path.getsize(q) for q in paths):
        break
    time.sleep(0.1)
kids = [int(open(q).read()) for q in paths]
os.killpg(p.pid, getattr(signal, "SIG" + sig))
p.wait()
for _ in range(50):
    alive = []
    for k in kids:
        try:
            os.kill(k, 0)
            alive.append(k)
        except ProcessLookupError:
            pass
    if not alive:
        sys.exit(0)
    time.sleep(0.1)
sys.exit(f"children {alive} still run")
PYEOF
    done
    echo "ok: SIGKILL to cddprun, and SIGKILL or SIGQUIT to its group: the workers' own children are gone too;" \
         "so are those of a worker that exits 0 or 3" ;;
sigterm)
    # SIGTERM to the launcher: no worker (nor a worker's child) left 5 s later.
    "$R" --standalone --nproc_per_node 2 sh -c \
        "echo \$\$ > $work/pid.\$RANK; sleep 60 & echo \$! > $work/child.\$RANK; wait" > "$work/out" 2>&1 &
    lp=$!
    for i in $(seq 50); do [ -f "$work/child.1" ] && [ -f "$work/child.0" ] && break; sleep 0.1; done
    kill -TERM $lp
    wait $lp
    rc=$?
    [ $rc = 143 ] || fail "cddprun exited $rc, expected 143 (128 + SIGTERM)"
    all_gone "$work/pid.0 $work/pid.1 $work/child.0 $work/child.1" 5 || fail "a worker outlived cddprun"
    # SIGKILL to the launcher: the workers die with it.
    "$R" --standalone --nproc_per_node 2 sh -c "echo \$\$ > $work/k.\$RANK; sleep 60" > /dev/null 2>&1 &
    lp=$!
    for i in $(seq 50); do [ -f "$work/k.1" ] && [ -f "$work/k.0" ] && break; sleep 0.1; done
    kill -KILL $lp
    all_gone "$work/k.0 $work/k.1" 5 || fail "a worker outlived a SIGKILLed cddprun"
    echo "ok: SIGTERM and SIGKILL to cddprun leave no worker behind" ;;
restart)
    "$R" --standalone --max_restarts 1 --nproc_per_node 2 sh -c \
        "echo \$CDDP_RESTART_COUNT >> $work/count.\$RANK; [ \$CDDP_RESTART_COUNT != 0 ] || [ \$RANK != 1 ]" \
        > "$work/out" 2>&1 || { cat "$work/out"; fail "the job did not succeed after a restart"; }
    expect_in "restarting the group (restart 1 of 1)" "$work/out"
    [ "$(cat "$work/count.1" | tr "\n" " ")" = "0 1 " ] || fail "rank 1 ran $(cat "$work/count.1")"
    "$R" --standalone --max_restarts 2 sh -c "exit 5" > "$work/out2" 2>&1 && fail "a failing job succeeded"
    expect_in "attempt 3 of 3" "$work/out2"
    echo "ok: --max_restarts 1 recovers a worker that fails once; 2 restarts of a broken job end in failure" ;;
errors)
    check_error() { # exit code, text, args...
        want=$1 text=$2; shift 2
        "$R" "$@" > "$work/err" 2>&1
        rc=$?
        [ "$rc" = "$want" ] || { cat "$work/err"; fail "cddprun $* exited $rc, expected $want"; }
        expect_in "$text" "$work/err"
        [ "$(grep '^cddprun:' "$work/err" | grep -vc '^cddprun: warning:')" -le 2 ] ||
            { cat "$work/err"; fail "a stack of errors for $*"; }
    }
    check_error 2 "--nproc_per_node 0: expected a whole number from 1 to 4096" --nproc_per_node 0 true
    check_error 2 "--nproc-per-node x: expected a whole number from 1 to 4096" --nproc-per-node x true
    check_error 2 "--grace_period nan: expected a finite number in (0, 86400] (seconds)" \
        --grace_period nan true
    check_error 2 "--no_python and -m/--module exclude each other" --no_python -m json.tool
    check_error 2 "program './no-such-program' not found" ./no-such-program
    check_error 2 "unknown option or missing value: --bogus" --bogus true
    check_error 2 "--redirect_stdout_and_stderr needs --logdir" --redirect_stdout_and_stderr true
    check_error 2 "--redirects needs --logdir" --redirects 3 true
    check_error 2 "--tee 4: expected 0 (none), 1 (stdout), 2 (stderr), 3 (both)" --tee 4 true
    check_error 2 "--redirects 0:x: expected 0 (none)" --logdir "$work/l" --redirects 0:x true
    check_error 2 "--tee: local rank 2 is not on this node (--nproc_per_node 2: 0..1)" \
        --nproc_per_node 2 --tee 0:3,2:1 true
    check_error 2 "--node_rank 2 is out of range for --nnodes 2" --nnodes 2 --node_rank 2 true
    port=$(free_port)
    "$R" --master_port "$port" sh -c 'sleep 3' > /dev/null 2>&1 &
    held=$!
    sleep 0.5
    check_error 1 "127.0.0.1:$port is already in use — another job? choose --master_port or --standalone" \
        --master_port "$port" true
    kill $held; wait $held
    dead=$(free_port)
    printf 'secret\n' > "$work/token"
    chmod 600 "$work/token"
    CDDP_RDZV_TIMEOUT_S=1 check_error 1 "cannot reach 127.0.0.1:$dead" \
        --nnodes 2 --node_rank 1 --master_port "$dead" --token_file "$work/token" true
    # Ctrl-C while a node waits for node 0's store to come up ends it at once.
    "$R" --nnodes 2 --node_rank 1 --master_port "$dead" --token_file "$work/token" true \
        > "$work/err" 2>&1 &
    joining=$!
    sleep 1
    kill -INT $joining
    t0=$(date +%s)
    wait $joining
    rc=$?
    [ "$rc" = 130 ] || fail "cddprun exited $rc after SIGINT while joining (expected 130)"
    [ $(( $(date +%s) - t0 )) -le 1 ] || fail "cddprun took over a second to stop while joining"
    expect_in "stopped by a signal while joining the job's rendezvous" "$work/err"
    CDDP_RDZV_TIMEOUT_S=1 check_error 1 "node(s) 1 of 2 did not arrive within 1 s" \
        --nnodes 2 --node_rank 0 --master_port "$dead" --token_file "$work/token" true
    # The job's secret: several nodes need one, given once, from a file that holds one.
    check_error 2 "a job on 2 nodes needs a secret that every node shares" --nnodes 2 true
    expect_in "cddprun --token_file ~/.cddp-token" "$work/err"
    check_error 2 "--token and --token_file both give the job's secret" \
        --token x --token_file "$work/token" true
    check_error 2 "--token_file $work/none: cannot read it: No such file or directory" \
        --token_file "$work/none" true
    : > "$work/empty"
    check_error 2 "--token_file $work/empty: no secret in it" --token_file "$work/empty" true
    check_error 2 "--token_file $work: not a regular file" --token_file "$work" true
    check_error 0 "warning: every user of this machine can read --token on the command line" \
        --token visible true
    chmod 644 "$work/token"
    check_error 0 "warning: --token_file $work/token can be read by other users (mode 0644)" \
        --token_file "$work/token" true
    chmod 600 "$work/token"
    CDDPRUN_TOKEN=quiet "$R" true > "$work/err" 2>&1 || fail "CDDPRUN_TOKEN run failed"
    [ -s "$work/err" ] && { cat "$work/err"; fail "a secret from the environment drew a warning"; }
    "$R" --help > "$work/help" || fail "--help failed"
    for o in --nnodes --node_rank --nproc_per_node --master_addr --master_port --module --no_python \
        --redirect_stdout_and_stderr --logdir --log_dir --redirects --standalone --max_restarts --tee \
        --monitor_interval; do
        expect_in "$o" "$work/help"
    done
    # every option --help lists (the launcher's table) has its row in docs/LAUNCHER.md
    for o in $(sed -n 's/^  \(-[a-z], \)\{0,1\}--\([a-z_]*\).*/\2/p' "$work/help"); do
        grep -q -- "--$o\b" "$here/../../docs/LAUNCHER.md" || fail "docs/LAUNCHER.md lacks --$o"
    done
    echo "ok: usage errors, port in use, unreachable master, missing node, the job's secret: one" \
         "clear message each" ;;
hosts)
    # --hosts and --hostfile with hosts that are this machine (started without ssh; the ssh path
    # is hosts_ssh's): the list's errors, ranks by the list's order, and the head's end stopping
    # every node: when it is interrupted and when it is killed.
    check_error() { # exit code, text, args...
        want=$1 text=$2; shift 2
        "$R" "$@" > "$work/err" 2>&1 < /dev/null
        rc=$?
        [ "$rc" = "$want" ] || { cat "$work/err"; fail "cddprun $* exited $rc, expected $want"; }
        expect_in "$text" "$work/err"
    }
    check_error 2 "--hosts: 'a b' is not a host name, [user@]name or address" --hosts 'a b' true
    check_error 2 "--hosts: '-oProxyCommand=x' is not a host name" --hosts '-oProxyCommand=x' true
    check_error 2 "--hosts: '-F@x' is not a host name" --hosts '-F@x' true
    check_error 2 "--hosts: a's slots 0: expected a whole number from 1 to 4096" --hosts a:0 true
    check_error 2 "--hosts: host a is listed twice: give it once, with all its slots" --hosts a,b,a true
    check_error 2 "--hosts and --hostfile both list the hosts" --hosts a --hostfile "$work/hf" true
    check_error 2 "--hostfile $work/none: No such file or directory" --hostfile "$work/none" true
    printf '# two hosts\nlocalhost slots=2 max_slots=4\n' > "$work/hf"
    check_error 2 "--hostfile $work/hf, line 2: 'max_slots=4': expected \`name slots=N\`" \
        --hostfile "$work/hf" true
    check_error 2 "--node_rank with --hosts: each host's rank is its place in the list" \
        --hosts a,b --node_rank 1 true
    check_error 2 "--nnodes 1:3 with 2 hosts: with --hosts, MAX is the number of hosts" \
        --hosts a,b --nnodes 1:3 true
    check_error 2 "--stdin_control: stdin ended before the job's secret and environment" \
        --stdin_control true
    # Two "hosts" on this machine from a hostfile (mpirun's and Horovod's lines, a comment):
    # ranks contiguous in the file's order, one secret, one run.
    port=$(free_port)
    printf '# this machine, twice\nlocalhost slots=2\n127.0.0.1:1   # Horovod style\n' > "$work/hf"
    "$R" --hostfile "$work/hf" --master_port "$port" sh -c "env > $work/env.\$RANK" \
        > "$work/out" 2>&1 < /dev/null || { cat "$work/out"; fail "the hostfile job exited $?"; }
    for r in 0 1 2; do
        node=$((r / 2)) lr=$((r % 2))
        for v in "RANK=$r" "GROUP_RANK=$node" "LOCAL_RANK=$lr" WORLD_SIZE=3 GROUP_WORLD_SIZE=2; do
            grep -qx "$v" "$work/env.$r" || fail "rank $r lacks $v"
        done
    done
    [ "$(grep -h '^CDDP_STORE_TOKEN=' "$work"/env.* | sort -u | wc -l)" = 1 ] || fail "the nodes' secrets differ"
    expect_in "cddprun: 2 hosts: localhost (2 ranks, here), 127.0.0.1 (1 rank, here); node 0's store at localhost:$port" "$work/out"
    # The head interrupted, then killed: every node stops its workers.
    for how in INT KILL; do
        rm -f "$work"/pid.*
        port=$(free_port)
        "$R" --hosts localhost:1,127.0.0.1:2 --master_port "$port" --grace_period 1 \
            sh -c "echo \$\$ > $work/pid.\$RANK; exec sleep 300" > "$work/out" 2>&1 < /dev/null &
        head=$!
        i=0
        while [ "$(ls "$work"/pid.* 2>/dev/null | wc -l)" != 3 ]; do
            i=$((i + 1))
            [ $i -lt 200 ] || { cat "$work/out"; fail "3 workers did not start in 20 s"; }
            sleep 0.1
        done
        kill -$how $head
        wait $head
        rc=$?
        all_gone "$work/pid.0 $work/pid.1 $work/pid.2" 10 || fail "workers outlived SIG$how to the head"
        expect_in "cddprun: stopping this node: the cddprun --hosts that started it stopped the job or is gone" "$work/out"
        [ $how = KILL ] && continue
        [ $rc = 130 ] || fail "the head exited $rc after SIGINT, not 130"
        expect_in "cddprun: got SIGINT; stopping every node" "$work/out"
    done
    echo "ok: --hosts/--hostfile errors; a hostfile's two local hosts ranked in order; the head's" \
         "SIGINT and SIGKILL stop every node's workers" ;;
peer_flags)
    # torchrun's and msrun's command lines, with their meaning.
    port=$(free_port)
    cores=$(nproc)
    "$R" --nnodes 1:1 --nproc-per-node auto --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
        --rdzv-id job-7 --use_env --local-ranks-filter 0 \
        sh -c "env > $work/t.\$RANK; echo out \$RANK; echo err \$RANK >&2" > "$work/out" 2>&1 ||
        fail "torchrun's flags: cddprun exited $?"
    [ "$(ls "$work"/t.* | wc -l)" = "$cores" ] || fail "--nproc-per-node auto did not start $cores workers"
    for f in "$work"/t.*; do
        grep -qx "WORLD_SIZE=$cores" "$f" || fail "$f: WORLD_SIZE"
        grep -qx "CDDP_RUN_ID=job-7" "$f" || fail "$f: --rdzv-id did not give the run id"
        grep -qx "CDDP_STORE_PORT=$port" "$f" || fail "$f: --rdzv-endpoint did not give the store port"
    done
    expect_in "out 0" "$work/out"
    expect_in "err 0" "$work/out"
    grep -q "out 1\|err 1" "$work/out" && fail "--local-ranks-filter 0 showed rank 1"
    check_usage() { # text, args...
        text=$1; shift
        "$R" "$@" true > "$work/err" 2>&1 && fail "cddprun $* was accepted"
        expect_in "$text" "$work/err"
    }
    check_usage "--nnodes 3:2: MIN:MAX with MIN above MAX" --nnodes 3:2
    # one process per GPU: this machine has none, and says why (no driver, no device or no CUDA
    # in this build); CUDA_VISIBLE_DEVICES= hides any
    CUDA_VISIBLE_DEVICES= check_usage "--nproc_per_node gpu: no CUDA device" --nproc_per_node gpu
    if ! ldconfig -p | grep -q "libcuda\.so\.1 "; then
        check_usage "--nproc_per_node gpu: no CUDA device: no NVIDIA driver on this machine" --nproc_per_node gpu
    fi
    # cddprun loads no kernel library (OpenBLAS and oneDNN start thread pools; the CUDA runtime):
    # their start was most of a small job's launch
    needed=$(readelf -d "$R" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    case "$needed" in
    *openblas* | *dnnl* | *cuda* | *cublas* | *gomp* | *nccl*) fail "cddprun needs $needed" ;;
    libc.so.6*) ;; # the NEEDED list was read: it names libc
    *) [ -n "$needed" ] || fail "no NEEDED list read from $R" ;;
    esac
    # and its run path has no empty entry, which the loader would take for the current folder
    runpath=$(readelf -d "$R" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
    [ -z "$runpath" ] || case ":$runpath:" in *::*) fail "cddprun's run path '$runpath' holds an empty entry (the current folder)" ;; esac
    check_usage "--nproc_per_node xpu: cddp runs on CPUs and NVIDIA GPUs" --nproc_per_node xpu
    check_usage "--rdzv-backend etcd: cddprun's rendezvous is its own store" --rdzv-backend etcd
    check_usage "--local_ranks_filter 0,4: expected local ranks of this node (0..1)" \
        --nproc_per_node 2 --local_ranks_filter 0,4
    check_usage "--worker_num 3 is not a multiple of --local_worker_num 2" \
        --worker_num 3 --local_worker_num 2
    check_usage "--worker_num 4 is not --nnodes 1 x 2 workers per node" \
        --nnodes 1 --worker_num 4 --local_worker_num 2
    check_usage "--worker_num 2 needs --local_worker_num" --worker_num 2
    check_usage "--join=maybe: expected 1/true/yes or 0/false/no" --join=maybe
    # msrun: 2 workers on this node, logs under --log_dir, each on its own share of the CPUs.
    "$R" --worker_num 2 --local_worker_num 2 --master_port "$port" --join=True --bind_core=True \
        --log_dir "$work/ms" sh -c 'grep Cpus_allowed_list /proc/self/status' > "$work/out" 2>&1 ||
        fail "msrun's flags: cddprun exited $?"
    a=$(cat "$work/ms/rank.0/stdout") b=$(cat "$work/ms/rank.1/stdout")
    [ -n "$a" ] && [ -n "$b" ] || fail "--log_dir: no rank.N/stdout"
    # msrun's booleans as a separate word, as its docs write them: not taken for the program.
    "$R" --worker_num 2 --local_worker_num 2 --master_port "$port" --join True --bind_core True \
        --log_dir "$work/ms2" sh -c 'echo worker' > "$work/out" 2>&1 ||
        { cat "$work/out"; fail "--join True --bind_core True: cddprun exited $?"; }
    grep -qx worker "$work/ms2/rank.1/stdout" || fail "--join True: the program did not run"
    "$R" --standalone --nproc_per_node 1 --bind_core false sh -c 'echo unbound' > "$work/out" 2>&1 &&
        grep -q unbound "$work/out" || fail "--bind_core false: $(cat "$work/out")"
    if [ "$cores" -ge 2 ]; then
        [ "$a" != "$b" ] || fail "--bind_core: both workers on $a"
        [ "$a" != "$(grep Cpus_allowed_list /proc/self/status)" ] || fail "--bind_core: rank 0 unbound"
    fi
    # MindSpore's tutorials read log_output/1/rank.*/stdout (Open MPI's --output-filename layout).
    "$R" --worker_num 2 --local_worker_num 2 --master_port "$port" --log_dir "$work/mo" \
        --log_layout mpirun sh -c 'echo "loss of $RANK"' > "$work/out" 2>&1 ||
        fail "--log_layout mpirun: cddprun exited $?"
    for r in 0 1; do
        grep -qx "loss of $r" "$work/mo/1/rank.$r/stdout" || fail "--log_layout mpirun: no 1/rank.$r/stdout"
    done
    [ -e "$work/mo/rank.0" ] && fail "--log_layout mpirun also wrote rank.0/"
    check_usage "--log_layout tree: expected flat (DIR/rank.N/stdout) or mpirun" --log_layout tree
    check_usage "--log_layout needs --logdir" --log_layout mpirun
    # --cluster_time_out is the rendezvous' limit: node 1 never comes.
    printf 'secret\n' > "$work/token"
    chmod 600 "$work/token"
    start=$(date +%s)
    "$R" --worker_num 2 --local_worker_num 1 --node_rank 0 --master_port "$(free_port)" \
        --token_file "$work/token" --cluster_time_out 1 true > "$work/err" 2>&1 && fail "a node was missing"
    expect_in "node(s) 1 of 2 did not arrive within 1 s" "$work/err"
    [ $(( $(date +%s) - start )) -le 10 ] || fail "--cluster_time_out 1 waited more than 10 s"
    echo "ok: torchrun's --nnodes N:N, --nproc-per-node auto, --rdzv-*, --local-ranks-filter," \
         "--use_env; msrun's --worker_num, --local_worker_num, --log_dir, --join, --bind_core," \
         "--cluster_time_out, the log_output/1/rank.N layout; their misuses refused" ;;
logs)
    "$R" --standalone --nproc_per_node 2 --logdir "$work/logs" sh -c \
        'echo "out of $RANK"; echo "err of $RANK" >&2' > "$work/console" 2>&1 || fail "run failed"
    for r in 0 1; do
        grep -qx "out of $r" "$work/logs/rank.$r/stdout" || fail "rank.$r/stdout"
        grep -qx "err of $r" "$work/logs/rank.$r/stderr" || fail "rank.$r/stderr"
    done
    # A log folder whose parents do not exist yet is created with them.
    "$R" --standalone --nproc_per_node 2 --logdir "$work/deep/er/logs" sh -c 'echo "deep $RANK"' \
        > /dev/null 2>&1 || fail "run with a nested --logdir failed"
    grep -qx "deep 1" "$work/deep/er/logs/rank.1/stdout" || fail "nested --logdir not created"
    expect_in "out of 1" "$work/console"
    # Redirect: files only. A second run overwrites the first.
    "$R" --standalone --nproc_per_node 2 --logdir "$work/logs" --redirect_stdout_and_stderr sh -c \
        'echo "second $RANK"' > "$work/console2" 2>&1 || fail "redirect run failed"
    grep -q "second" "$work/console2" && fail "--redirect_stdout_and_stderr still printed to the console"
    [ "$(cat "$work/logs/rank.1/stdout")" = "second 1" ] || fail "the second run did not overwrite"
    # Tee: console lines prefixed with the rank.
    "$R" --standalone --nproc_per_node 2 --tee sh -c 'echo "hello"' > "$work/tee" 2>&1
    expect_in "[rank 0]: hello" "$work/tee"
    expect_in "[rank 1]: hello" "$work/tee"
    # torchrun's values: --tee 3 is both streams (not a program called 3); a map names local
    # ranks; CDDPRUN_TEE from the environment. --log-dir and --log_dir spell --logdir.
    both='echo "out $RANK"; echo "err $RANK" >&2'
    "$R" --standalone --nproc_per_node 2 --tee 3 sh -c "$both" > "$work/tee3" 2>&1 || fail "--tee 3 failed"
    for l in "[rank 0]: out 0" "[rank 0]: err 0" "[rank 1]: out 1" "[rank 1]: err 1"; do
        expect_in "$l" "$work/tee3"
    done
    "$R" --standalone --nproc_per_node 2 --tee 0:1 sh -c "$both" > "$work/teemap" 2>&1 || fail "--tee 0:1 failed"
    for l in "[rank 0]: out 0" "err 0" "out 1" "err 1"; do grep -qxF -- "$l" "$work/teemap" ||
        { cat "$work/teemap"; fail "--tee 0:1: no line '$l'"; }; done
    CDDPRUN_TEE=2 "$R" --standalone --nproc_per_node 2 sh -c "$both" > "$work/teeenv" 2>&1 || fail "CDDPRUN_TEE=2 failed"
    for l in "out 0" "[rank 0]: err 0" "out 1" "[rank 1]: err 1"; do grep -qxF -- "$l" "$work/teeenv" ||
        { cat "$work/teeenv"; fail "CDDPRUN_TEE=2: no line '$l'"; }; done
    for spelling in --log-dir --log_dir; do
        rm -rf "$work/ld"
        "$R" --standalone --nproc_per_node 2 $spelling "$work/ld" sh -c "$both" > /dev/null 2>&1 ||
            fail "$spelling failed"
        grep -qx "err 1" "$work/ld/rank.1/stderr" || fail "$spelling did not write rank.1/stderr"
    done
    # --redirects 0:1: rank 0's stdout only in its file; everything else on the console too.
    "$R" --standalone --nproc_per_node 2 --logdir "$work/rd" --redirects 0:1 sh -c "$both" \
        > "$work/rdc" 2>&1 || fail "--redirects 0:1 failed"
    grep -qx "out 0" "$work/rdc" && fail "--redirects 0:1 printed rank 0's stdout"
    for l in "err 0" "out 1" "err 1"; do grep -qx -- "$l" "$work/rdc" || fail "--redirects 0:1: no '$l' on the console"; done
    grep -qx "out 0" "$work/rd/rank.0/stdout" || fail "--redirects 0:1: rank 0's stdout not in its file"
    # Ranks that share the console, without --tee, never cut into each other's lines: awk's stdio
    # writes its buffer whenever it fills, mid-line, and the ranks write at once.
    cat > "$work/lines.sh" <<'LINES'
awk -v r="$RANK" 'BEGIN { x = sprintf("%1000s", ""); gsub(/ /, "x", x)
    for (i = 0; i < 300; i++) { printf "rank %s line %d %s\n", r, i, x; if (i % 20 == 0) system("sleep 0.01") } }'
LINES
    "$R" --standalone --nproc_per_node 2 sh "$work/lines.sh" > "$work/whole" 2> /dev/null || fail "the lines job failed"
    [ "$(grep -c '^rank [01] line [0-9]* x\{1000\}$' "$work/whole")" = 600 ] ||
        fail "ranks' lines cut into each other on the console: $(grep -vc '^rank [01] line [0-9]* x\{1000\}$' "$work/whole") of $(wc -l < "$work/whole") lines broken"
    # A failure report points at the log.
    "$R" --standalone --logdir "$work/logs2" sh -c 'echo boom >&2; exit 4' > "$work/f" 2>&1
    expect_in "log: $work/logs2/rank.0/stderr" "$work/f"
    echo "ok: --logdir files, --redirect_stdout_and_stderr, overwrite, --tee with torchrun's values and maps, --redirects, --log-dir, whole lines on a shared console, log paths in reports" ;;
python)
    printf 'import os\nprint("py", os.environ["RANK"])\n' > "$work/hello.py"
    "$R" --standalone --nproc_per_node 2 --tee "$work/hello.py" > "$work/out" 2>&1 || fail "a .py program failed"
    expect_in "[rank 1]: py 1" "$work/out"
    "$R" --standalone -m timeit -n 1 pass > "$work/m" 2>&1 || fail "-m failed"
    expect_in "1 loop" "$work/m"
    "$R" --standalone --no_python "$work/hello.py" > "$work/np" 2>&1 && fail "--no_python ran a non-executable .py"
    echo "ok: .py under python3, -m, --no_python" ;;
torch)
    # A torchrun-style PyTorch script, unchanged, under cddprun (Debian's python3-torch).
    /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
        fail "Debian's python3-torch is not installed (make test installs it: scripts/deps.sh test)"
    "$R" --standalone --nproc_per_node 2 --no_python /usr/bin/python3 "$here/torch_ddp.py" \
        > "$work/out" 2>&1 || { cat "$work/out"; fail "the PyTorch script failed"; }
    expect_in "rank 0 of 2: allreduce sum 3.0" "$work/out"
    expect_in "rank 1 of 2: allreduce sum 3.0" "$work/out"
    echo "ok: torch.distributed (gloo, env://) runs under cddprun unchanged" ;;
frozen_end)
    # Node 1's launcher frozen (SIGSTOP) while its worker runs; both workers end well: node 0,
    # which hosts the store, waits for node 1 to leave only while node 1's launcher beats, says
    # that it stopped answering (CDDP_STORE_REPLY_S=3 here) and exits 1, not after the
    # rendezvous timeout (60 s here, 300 s by default) and not silently.
    port=$(free_port)
    export CDDP_STORE_REPLY_S=3 CDDP_RDZV_TIMEOUT_S=60 CDDPRUN_TOKEN=frozen
    common="--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port"
    job="touch $work/started.\$RANK; sleep 2"
    "$R" $common --node_rank 0 --local_addr 127.0.0.1 sh -c "$job" > "$work/n0" 2>&1 &
    p0=$!
    "$R" $common --node_rank 1 --local_addr 127.0.0.2 sh -c "$job" > "$work/n1" 2>&1 &
    p1=$!
    i=0
    while ! { [ -e "$work/started.0" ] && [ -e "$work/started.1" ]; } && [ $i -lt 300 ]; do
        i=$((i + 1)); sleep 0.1
    done
    kill -STOP $p1
    t0=$(date +%s)
    wait $p0; rc0=$?
    s=$(( $(date +%s) - t0 ))
    kill -CONT $p1
    wait $p1
    [ $rc0 = 1 ] || { cat "$work/n0"; fail "node 0 exited $rc0 with node 1's launcher frozen"; }
    [ $s -le 20 ] || fail "node 0 waited $s s for the frozen launcher"
    expect_in "cddprun: node 1 (host 127.0.0.2, ranks 1-1) stopped answering: its launcher sent no heartbeat for 3 s" "$work/n0"
    expect_in "after this node's workers finished: not waiting for it; its part of the job did not report an end" "$work/n0"
    echo "ok: a launcher frozen at the end: node 0 said so and exited 1 after $s s" ;;
port_taken)
    # Between cddprun's choice of MASTER_PORT and rank 0's start, another process may take the
    # port. Here rank 0 itself holds it (a listening socket inherited across exec), so a cddp
    # group that binds MASTER_PORT fails; cddp's workers must find rank 0's store without it.
    cat > "$work/hold.py" <<'PYEOF'
import os, socket, sys
if os.environ["LOCAL_RANK"] == "0":
    s = socket.socket()
    s.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
    s.listen(1)
    s.set_inheritable(True)
os.execv(sys.argv[1], sys.argv[1:])
PYEOF
    "$R" --standalone --nproc_per_node 2 --no_python python3 "$work/hold.py" \
        "$build/bin/ddp_check" equal mlp 0.0005 > "$work/out" 2>&1 ||
        { cat "$work/out"; fail "the job failed while MASTER_PORT was taken"; }
    [ "$(grep -c '^ok: ' "$work/out")" = 2 ] || { cat "$work/out"; fail "not every rank trained"; }
    # Groups in a restarted round meet under that round's keys in the launcher's store.
    "$R" --standalone --max_restarts 1 --nproc_per_node 2 sh -c \
        "$build/bin/ddp_check equal mlp 0.0005 && { [ \$CDDP_RESTART_COUNT != 0 ] || [ \$RANK != 1 ]; }" \
        > "$work/out2" 2>&1 || { cat "$work/out2"; fail "the restarted job failed"; }
    expect_in "restarting the group (restart 1 of 1)" "$work/out2"
    # (In round 0, rank 1's exit may stop rank 0 before it prints; round 1 must have both.)
    [ "$(sed -n '/restarting the group/,$p' "$work/out2" | grep -c '^ok: ')" = 2 ] ||
        { cat "$work/out2"; fail "the restarted round did not train on both ranks"; }
    echo "ok: cddp workers meet although MASTER_PORT is taken, in the first round and after a restart" ;;
*) fail "unknown scenario $scenario" ;;
esac
