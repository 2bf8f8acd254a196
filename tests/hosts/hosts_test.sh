#!/bin/sh
# hosts_test.sh BUILD_DIR SCENARIO: cddp across emulated hosts (tests/hosts/hosts.sh: network
# namespaces on a bridge, each link shaped to 1 Gbit/s with tbf, each host its own hostname), one
# cddprun per host, the job's secret in a file:
#
#   2x2    2 hosts x 2 ranks train Fashion-MNIST: the final loss of 4 ranks on one host
#   4x1    4 hosts x 1 rank: the same
#   kill   2 hosts x 2 ranks; host 1 dies mid-training (every process in it SIGKILLed): host 0's
#          cddprun exits 1 within 30 s, its report's root cause is host 1 (by host and ranks)
#   elastic 3 hosts x 1 rank in an elastic job (--nnodes 2:3 --max_restarts 1) training with a
#          checkpoint every 10 steps; host 2 dies once a checkpoint exists: hosts 0 and 1 form the
#          next round, resume mid-epoch on 2 ranks with the same global batch (96), and end with
#          the test accuracy of an uninterrupted 3-rank run (to 0.002); every sample of each
#          epoch trained exactly once (the first round's steps up to the checkpoint, then the
#          second round's, from the ranks' --sample-log); training again within 60 s of the kill
#          (the bound a loaded machine keeps; the figure itself: bench/recovery.sh); node 0's
#          report names host 2 as gone, not a rank that lost it
#   srun   2 hosts x 2 tasks started as srun starts them (its variables alone, no MASTER_ADDR,
#          the hosts by name, each host's own name on 127.0.1.1 as in Debian's /etc/hosts): the
#          group forms across the hosts, rank 0's store on every interface, each rank listening
#          on its route to the first host; then cddprun on 2 hosts with node 0's name as
#          --master_addr and without --local_addr: node 0 says its store listens everywhere,
#          node 1 says the address it advertises
#   c10d   torchrun's multi-node line unchanged (--nnodes 4 --nproc-per-node 1 --rdzv-backend
#          c10d --rdzv-endpoint HOST0:29400 --rdzv-id job1; the secret in CDDPRUN_TOKEN_FILE), the
#          same on 4 hosts started last to first: host 0, which has the endpoint's address, is
#          node 0, the others take 1..3 in the order they join, and the job trains to the one-host
#          loss; then a job of 2 hosts with a second launcher on host 1: one of the two is refused
#          (one launcher per host), the job finishes
#   ipv6   torchrun's line with an IPv6 endpoint ([fd00:K::1]:29400) on 2 hosts x 2 ranks, no
#          --local_addr: each node advertises its IPv6 address (its route to the endpoint), the
#          messages write the endpoint in brackets, and the job trains to the one-host loss over
#          TCP
#   replace torchrun's line in an elastic job (--nnodes 2:3, no --node_rank) on hosts 0, 1 and 2;
#          host 2 dies once a checkpoint exists (hosts 0 and 1 go on), then a new host 3 comes
#          with the same line: it takes node rank 2, freed by the dead launcher's will, is
#          admitted at once (scale-up), and the job ends on 3 nodes
#   late   the same job with torchrun's line (--nnodes 2:3 --rdzv-backend c10d, no --node_rank)
#          started on hosts 0 and 1; host 2 comes with the same line once a checkpoint exists: it
#          takes node rank 2, the group restarts at once with it (scale-up, not counted as a
#          restart, also on host 1, whose rank fails before its launcher's next look at the
#          store), resumes on 3 ranks and ends as the uninterrupted run, every sample once per
#          epoch
#   vanish the elastic job of 3 hosts, host 2's link cut mid-training (nothing dies, nothing
#          closes): node 0 finds it silent at CDDP_STORE_REPLY_S (5 s by default) and the job
#          trains again on hosts 0 and 1, as in elastic (bench/recovery.sh vanish: the figure)
#   below  an elastic job of 2 hosts (--nnodes 2:3); host 1 dies: with 1 node left, below MIN,
#          host 0 stops within CDDP_RDZV_TIMEOUT_S (3 s here) and says why
#   ssh    one command, many hosts: cddprun --hosts on host 0 starts hosts 1 and 2 over ssh
#          (each host runs sshd in its namespace with a host key and a client key made for the
#          test): the environment and -x reach every host (host 0 named localhost: the others
#          reach its store at its name); 2+1+1 ranks train to the one-host
#          loss; a rank that fails fails the job; Ctrl-C (SIGINT to the head) stops it, also where
#          the stop reaches the other hosts half a second late (their ranks see host 0's stop
#          first: each node still says the head stopped it); a host without sshd is named. After
#          each, nothing of the job runs on any host
#   cut    3 hosts x 1 rank; host 2's link goes down mid-training (nothing is sent, nothing dies):
#          with CDDP_STORE_REPLY_S at its default, 5 s (the collectives' own deadline,
#          CDDP_TIMEOUT_S, at its 300 s), every cddprun exits 1 within 30 s: host 0's report
#          names host 2 as the root cause (silent, no heartbeat), not host 1's rank, which failed
#          when host 0 stopped its own; host 2 says it lost node 0's store; host 0's flight report
#          (with host 1's records, through the store: each host has its own TMPDIR) says ranks 0-1
#          wait in one allreduce and rank 2 left no record
set -u
build=$(cd "$1" && pwd)
scenario=$2
here=$(cd "$(dirname "$0")" && pwd)
H="$here/hosts.sh"
FM="$build/bin/fashion_mnist"
[ "$(id -u)" = 0 ] || { echo "cannot run on this machine: network namespaces need root"; exit 77; }
ip netns list > /dev/null 2>&1 || { echo "cannot run on this machine: no network namespaces"; exit 77; }
work=$(mktemp -d)
name="h$$"
name=$(echo "$name" | cut -c1-8)
# What an earlier run of this script left when it was killed (by ctest's timeout: no trap runs on
# SIGKILL): hosts named after a process that is gone.
"$here/sweep.sh" > /dev/null || exit 1
made_run_sshd=""
trap '"$H" stop "$name"; [ -z "$made_run_sshd" ] || rmdir /run/sshd; rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMP_NUM_THREADS \
    OPENBLAS_NUM_THREADS CDDP_STORE_PORT CDDP_STORE_ADDR CDDP_STORE_TOKEN CDDP_HOST_ID
export CDDP_LOG_LEVEL=info
cd "$work" || exit 1
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > token)

fail() {
    echo "FAIL: $*"
    for f in "$work"/*.out; do [ -s "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }; done
    exit 1
}
has() { grep -qF -- "$2" "$1" || fail "'$2' is not in $1"; }
json() { sed -n "s/^{.*\"$2\": \([^,}]*\).*/\1/p" "$1" | tail -n 1; }
train_args="--epochs 1 --limit 2000 --json"

# hosts N: brings up N hosts on 1 Gbit/s links.
hosts() {
    "$H" start "$name" "$1" 1gbit > /dev/null || fail "the emulated hosts did not come up"
}
# node I N P ARGS...: cddprun on host I of N with P ranks, in the background; pid in $!.
node() {
    i=$1 n=$2 p=$3
    shift 3
    "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes "$n" --node_rank "$i" --nproc_per_node "$p" \
        --master_addr "$("$H" addr "$name" 0)" --master_port 29400 --token_file "$work/token" \
        --local_addr "$("$H" addr "$name" "$i")" "$@" > "node$i.out" 2>&1 &
}
# same_loss FILE: the final loss in FILE is the one-host loss, to 1e-5 (a sum in another order).
same_loss() {
    loss=$(json "$1" final_loss)
    [ -n "$loss" ] || fail "no final loss in $1"
    /usr/bin/python3 -c "import sys; sys.exit(abs($loss - $ref) > 1e-5 * abs($ref))" ||
        fail "final loss $loss across hosts, $ref on one host"
}
# elastic_node I: host I in the elastic job of 2 to 3 hosts; each start trains with the global
# batch of 96 over the ranks there are, from the checkpoint when there is one.
elastic_node() {
    train="b=\$((96 / WORLD_SIZE)); c=ckpt/checkpoint.safetensors;
           log=\"--sample-log samples.\$CDDP_RESTART_COUNT\";
           if [ -e \$c ]; then exec '$FM' $args --batch-size \$b \$log --resume \$c;
           else exec '$FM' $args --batch-size \$b \$log; fi"
    if [ "$scenario" = late ]; then # torchrun's line: node ranks from the rendezvous
        # host 1 looks at the store every 2 s only: its rank fails (host 0 stopped its peer for
        # the scale-up) before it sees why, which must still be the scale-up, not a failure
        look=""
        [ "$1" = 1 ] && look="--monitor-interval 2"
        "$H" exec "$name" "$1" "$build/bin/cddprun" --nnodes 2:3 --nproc-per-node 1 \
            --rdzv-backend c10d --rdzv-endpoint "$("$H" addr "$name" 0):29400" --rdzv-id job1 \
            --token-file "$work/token" --max-restarts 1 --grace-period 1 $look sh -c "$train" \
            > "node$1.out" 2>&1 &
    else
        node "$1" 2:3 1 --max_restarts 1 --grace_period 1 sh -c "$train"
    fi
}
# await SECONDS WHAT COMMAND...: polls COMMAND every 50 ms until it succeeds; after SECONDS,
# fails the test with WHAT.
await() {
    limit=$(($1 * 20)) what=$2
    shift 2
    i=0
    until "$@"; do
        i=$((i + 1))
        [ $i -lt $limit ] || fail "$what"
        sleep 0.05
    done
}
# sshd_up N: sshd on hosts 0..N-1, each on its address, with one host key; the client (ssh -F
# ssh_config) logs in as root with a key made here and trusts only these hosts' key.
sshd_up() {
    [ -x /usr/sbin/sshd ] || fail "no /usr/sbin/sshd (Debian's openssh-server)"
    [ -d /run/sshd ] || { mkdir -p /run/sshd && made_run_sshd=1; }
    ssh-keygen -q -t ed25519 -N '' -C cddp-test -f "$work/client_key" || fail "ssh-keygen failed"
    ssh-keygen -q -t ed25519 -N '' -C cddp-test -f "$work/host_key" || fail "ssh-keygen failed"
    cp "$work/client_key.pub" "$work/authorized_keys"
    printf '%s\n' "HostKey $work/host_key" "AuthorizedKeysFile $work/authorized_keys" \
        "PermitRootLogin prohibit-password" "PasswordAuthentication no" \
        "KbdInteractiveAuthentication no" "UsePAM no" "UseDNS no" "StrictModes no" \
        > "$work/sshd_config"
    printf '%s\n' "Host *" "User root" "IdentityFile $work/client_key" "IdentitiesOnly yes" \
        "UserKnownHostsFile $work/known_hosts" "GlobalKnownHostsFile /dev/null" \
        "StrictHostKeyChecking yes" "LogLevel ERROR" > "$work/ssh_config"
    : > "$work/known_hosts"
    sshd_pids=""
    for i in $(seq 0 $(($1 - 1))); do
        a=$("$H" addr "$name" "$i")
        echo "$name-host$i,$a $(cat "$work/host_key.pub")" >> "$work/known_hosts"
        "$H" exec "$name" "$i" /usr/sbin/sshd -D -e -f "$work/sshd_config" -o "ListenAddress=$a" \
            -o "PidFile=$work/sshd$i.pid" > "sshd$i.out" 2>&1 &
        sshd_pids="$sshd_pids $!"
    done
    for i in $(seq 0 $(($1 - 1))); do
        await 10 "sshd on host $i does not answer" \
            "$H" exec "$name" 0 ssh -F "$work/ssh_config" -o BatchMode=yes "$("$H" addr "$name" "$i")" true
    done
}
# nothing_left N WHEN: on hosts 0..N-1 no process runs but sshd's listeners (sshd's sessions end
# within a moment of their command's).
nothing_left() {
    i=0
    while :; do
        left=""
        for k in $(seq 0 $(($1 - 1))); do
            for p in $(ip netns pids "$name$k"); do
                case " $sshd_pids " in *" $p "*) ;; *) left="$left $p($(cat /proc/$p/comm 2>/dev/null))" ;; esac
            done
        done
        [ -z "$left" ] && return 0
        i=$((i + 1))
        [ $i -lt 100 ] || fail "still running on the hosts $2:$left"
        sleep 0.05
    done
}
# Waits until rank 0 wrote its first checkpoint.
checkpoint() { await 60 "no checkpoint in 60 s" test -e ckpt/checkpoint.safetensors; }
# Once host 0 trains its second epoch, every process of host 1 is SIGKILLed; host 0's cddprun
# ($p0) must then exit 1 within 30 s ($ms: how long it took).
host1_dies() {
    second_epoch
    t0=$(date +%s%N)
    for p in $(ip netns pids "${name}1"); do kill -9 "$p" 2>/dev/null; done
    wait $p0
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ $rc = 1 ] || fail "host 0's cddprun exited $rc, not 1"
    [ $ms -le 30000 ] || fail "host 0's cddprun took $ms ms to end"
}
# Waits until host 0's training is in its second epoch.
second_epoch() { await 60 "no second epoch in 60 s" grep -qs "^epoch: 1," node0.out; }
reference() {
    "$build/bin/cddprun" --standalone --nproc_per_node 4 "$FM" $train_args --out one > one.out 2>&1 ||
        fail "4 ranks on one host exited $?"
    ref=$(json one.out final_loss)
}

case "$scenario" in
2x2 | 4x1)
    n=${scenario%x*} p=${scenario#*x}
    reference
    hosts "$n"
    pids=""
    for i in $(seq 0 $((n - 1))); do
        node "$i" "$n" "$p" "$FM" $train_args --out "out$i"
        pids="$pids $!"
    done
    for pid in $pids; do wait "$pid" || fail "a host's cddprun exited $?"; done
    [ "$(json node0.out world)" = 4 ] || fail "trained on $(json node0.out world) ranks, not 4"
    has node0.out "[cddp rank 0] I comm: 4 ranks on $n hosts: tcp"
    same_loss node0.out
    echo "ok: $n hosts x $p ranks on 1 Gbit/s links: final loss $loss, one host's $ref" ;;
srun)
    # srun -N 2 --ntasks-per-node 2 as srun starts it: on each host, 2 tasks with srun's variables
    # and nothing else (no MASTER_ADDR): the group meets on the step's first host and each rank
    # listens where the other host reaches it (its route to that host), not on loopback.
    reference
    hosts 2
    list="$name-host0,$name-host1"
    pids=""
    for r in 0 1 2 3; do
        i=$((r / 2))
        "$H" exec "$name" "$i" env SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID=$r SLURM_NTASKS=4 \
            SLURM_LOCALID=$((r % 2)) SLURM_NODEID=$i SLURM_STEP_NUM_NODES=2 SLURM_NNODES=2 \
            SLURM_STEP_NODELIST="$list" SLURM_STEP_TASKS_PER_NODE="2(x2)" CDDP_STORE_TOKEN=t \
            CDDP_RDZV_TIMEOUT_S=20 \
            OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$FM" $train_args --out "srun$r" > "rank$r.out" 2>&1 &
        pids="$pids $!"
    done
    for pid in $pids; do wait "$pid" || fail "a task exited $?"; done
    [ "$(json rank0.out world)" = 4 ] || fail "trained on $(json rank0.out world) ranks, not 4"
    has rank0.out "4 ranks on 2 hosts"
    has rank0.out "$name-host0 is a loopback address on this host (/etc/hosts), and the job spans several hosts: rank 0's store listens on every interface"
    loss=$(json rank0.out final_loss)
    same_loss rank0.out
    # cddprun on 2 hosts without --local_addr: each node says the address the other reaches.
    for i in 0 1; do
        "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes 2 --node_rank "$i" --nproc_per_node 1 \
            --master_addr "$name-host0" --master_port 29400 --token_file "$work/token" \
            "$build/bin/ddp_train" > "node$i.out" 2>&1 &
        eval "p$i=\$!"
    done
    wait "$p0" && wait "$p1" || fail "cddprun without --local_addr failed"
    has node0.out "cddprun: --master_addr $name-host0 is a loopback address on this machine (/etc/hosts maps a host's own name to 127.0.1.1): node 0's store listens on every interface"
    has node0.out "cddprun: node 0's address for the others is $("$H" addr "$name" 0), interface eth0"
    has node1.out "cddprun: node 1's address for the others is $("$H" addr "$name" 1), interface eth0"
    # Loopback across hosts (CDDP_SOCKET_IFNAME=lo, --local_addr lo): refused at once, saying
    # why, by srun's ranks (each side of the connection that could not be) and by cddprun on
    # every node, not after CDDP_RDZV_TIMEOUT_S (20 s here).
    t0=$(date +%s)
    pids=""
    for r in 0 1; do
        "$H" exec "$name" "$r" env SLURM_JOB_ID=4243 SLURM_STEP_ID=0 SLURM_PROCID=$r SLURM_NTASKS=2 \
            SLURM_LOCALID=0 SLURM_NODEID=$r SLURM_STEP_NUM_NODES=2 SLURM_NNODES=2 \
            SLURM_STEP_NODELIST="$list" SLURM_STEP_TASKS_PER_NODE="1(x2)" CDDP_STORE_TOKEN=t \
            CDDP_RDZV_TIMEOUT_S=20 CDDP_SOCKET_IFNAME=lo "$build/bin/ddp_train" > "lo$r.out" 2>&1 &
        pids="$pids $!"
    done
    for pid in $pids; do wait "$pid" && fail "a rank on loopback across hosts went on"; done
    for i in 0 1; do
        "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes 2 --node_rank "$i" --nproc_per_node 1 \
            --master_addr "$("$H" addr "$name" 0)" --master_port 29401 --token_file "$work/token" \
            --local_addr lo "$build/bin/ddp_train" > "clo$i.out" 2>&1 &
        eval "p$i=\$!"
    done
    wait "$p0" && fail "cddprun --local_addr lo across hosts: node 0 went on"
    wait "$p1" && fail "cddprun --local_addr lo across hosts: node 1 went on"
    took=$(( $(date +%s) - t0 ))
    [ "$took" -lt 10 ] || fail "loopback across hosts took $took s to be refused"
    has lo0.out "rank 0 listens at 127.0.0.1, a loopback address (from CDDP_SOCKET_IFNAME=lo), but rank 1 is on another host (or network namespace)"
    has lo1.out "rank 0 listens at 127.0.0.1, a loopback address (from CDDP_SOCKET_IFNAME=lo), but rank 1 is on another host (or network namespace)"
    has clo0.out "cddprun: node 0's address for the others is 127.0.0.1, a loopback address, but node 1 is on another host (or network namespace)"
    has clo1.out "cddprun: node 1's address for the others is 127.0.0.1, a loopback address, but node 0 is on another host (or network namespace)"
    echo "ok: srun's variables alone on 2 hosts x 2 tasks: final loss $loss, one host's $ref;" \
         "cddprun without --local_addr advertises the route to the master; loopback across" \
         "hosts refused in $took s" ;;
kill)
    hosts 2
    node 0 2 2 --grace_period 1 "$FM" --epochs 1000 --limit 2000 --out out0
    p0=$!
    node 1 2 2 --grace_period 1 "$FM" --epochs 1000 --limit 2000 --out out1
    host1_dies
    # Whichever host 0 sees first names host 1: its heartbeat check ("... ended (it was
    # killed ...") or, after its own ranks failed, the gathering of causes ("... ended before it
    # reported ...").
    has node0.out "root cause: node 1 (host $("$H" addr "$name" 1), ranks 2-3) is gone: its launcher's connection to the job's store ended"
    sed -n "/the job failed/,\$p" node0.out
    echo "ok: host 1 killed: host 0's cddprun exited 1 after $ms ms, naming host 1 and its ranks" ;;
c10d)
    reference
    hosts 4
    export CDDPRUN_TOKEN_FILE="$work/token"
    # c10d_node I N OUT: torchrun's line on host I for a job of N nodes, in the background.
    c10d_node() {
        "$H" exec "$name" "$1" "$build/bin/cddprun" --nnodes "$2" --nproc-per-node 1 \
            --rdzv-backend c10d --rdzv-endpoint "$("$H" addr "$name" 0):29400" --rdzv-id job1 \
            "$FM" $train_args --out "out$1" > "$3" 2>&1 &
    }
    pids=""
    for i in 3 2 1 0; do
        c10d_node "$i" 4 "node$i.out"
        pids="$pids $!"
        sleep 0.2
    done
    for pid in $pids; do wait "$pid" || fail "a host's cddprun exited $?"; done
    has node0.out "cddprun: node 0 of 4 (no --node_rank: this node listens on the endpoint's address"
    ranks=$(cat node1.out node2.out node3.out | sed -n 's/^cddprun: node \([1-3]\) of 4 (no --node_rank: the order the nodes joined in.*/\1/p' | sort | tr -d '\n')
    [ "$ranks" = 123 ] || fail "hosts 1..3 took node ranks '$ranks', not 1, 2 and 3"
    [ "$(json node0.out world)" = 4 ] || fail "trained on $(json node0.out world) ranks, not 4"
    same_loss node0.out
    # One launcher per host: a second one on host 1 is refused, the job of 2 hosts finishes.
    c10d_node 0 2 twin0.out
    p0=$!
    c10d_node 1 2 twin1.out
    p1=$!
    c10d_node 1 2 twin2.out
    p2=$!
    wait $p0 || fail "host 0's cddprun exited $? with a twin on host 1"
    wait $p1; r1=$?
    wait $p2; r2=$?
    [ $((r1 + r2)) = 1 ] || fail "the two launchers on host 1 exited $r1 and $r2 (one should be refused)"
    cat twin1.out twin2.out | grep -q "another launcher on this host (pid [0-9]* at .*) joined this job already: start one cddprun per host" ||
        fail "the twin on host 1 was not told why"
    echo "ok: torchrun's c10d line on 4 hosts: node ranks 0 (the endpoint's host) and $ranks by" \
         "arrival, final loss $loss, one host's $ref; a second launcher on a host refused" ;;
ipv6)
    reference
    hosts 2
    a0=$("$H" addr6 "$name" 0)
    for i in 0 1; do
        "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes 2 --nproc-per-node 2 \
            --rdzv-backend c10d --rdzv-endpoint "[$a0]:29400" --token_file "$work/token" \
            "$FM" $train_args --out "out$i" > "node$i.out" 2>&1 &
        eval "p$i=\$!"
    done
    wait $p0 && wait $p1 || fail "a host's cddprun exited $?"
    for i in 0 1; do
        has node$i.out "cddprun: node $i's address for the others is $("$H" addr6 "$name" "$i"), interface eth0"
    done
    has node0.out "[cddp rank 0] I comm: 4 ranks on 2 hosts: tcp"
    has node1.out "cddprun: node 1 of 2 (no --node_rank: the order the nodes joined in; node 0 hosts the store at [$a0]:29400)"
    same_loss node0.out
    echo "ok: 2 hosts x 2 ranks over IPv6 ([$a0]:29400): final loss $loss, one host's $ref" ;;
replace)
    args="--epochs 2 --limit 9000 --log-every 0 --json --out ckpt --save-every 10"
    hosts 4
    export CDDPRUN_TOKEN_FILE="$work/token"
    # auto_node I: torchrun's elastic line on host I (its node rank from the rendezvous).
    auto_node() {
        train="b=\$((96 / WORLD_SIZE)); c=ckpt/checkpoint.safetensors;
               if [ -e \$c ]; then exec '$FM' $args --batch-size \$b --resume \$c;
               else exec '$FM' $args --batch-size \$b; fi"
        "$H" exec "$name" "$1" "$build/bin/cddprun" --nnodes 2:3 --nproc-per-node 1 \
            --rdzv-backend c10d --rdzv-endpoint "$("$H" addr "$name" 0):29400" --max-restarts 1 \
            --grace-period 1 sh -c "$train" > "node$1.out" 2>&1 &
    }
    auto_node 0
    p0=$!
    sleep 0.3
    auto_node 1
    p1=$!
    sleep 0.3
    auto_node 2
    checkpoint
    await 30 "host 2 did not take node rank 2" grep -q "^cddprun: node 2 of 3" node2.out
    for p in $(ip netns pids "${name}2"); do kill -9 "$p" 2>/dev/null; done
    await 60 "hosts 0 and 1 did not go on without host 2" grep -q "cddprun: round 1: 2 of 2..3 nodes (0,1)" node0.out
    auto_node 3
    p3=$!
    for p in $p0 $p1 $p3; do wait "$p" || fail "a host's cddprun exited $?"; done
    has node3.out "cddprun: node 2 of 3 (no --node_rank: the order the nodes joined in"
    has node0.out "cddprun: node 2 came to join the job: the group restarts with it"
    grep -q "cddprun: round [2-9]: 3 of 2..3 nodes (0,1,2)" node0.out || fail "no round of 3 nodes after host 3 came"
    [ "$(json node0.out world)" = 3 ] || fail "the job ended on $(json node0.out world) ranks, not 3"
    echo "ok: host 2 died and host 3 took its place (node rank 2, freed by its will); the job" \
         "ended on 3 nodes, test accuracy $(json node0.out test_acc)" ;;
elastic | late | vanish)
    args="--epochs 2 --limit 9000 --log-every 0 --json --out ckpt --save-every 10"
    "$build/bin/cddprun" --standalone --nproc_per_node 3 "$FM" $args --batch-size 32 \
        --out straight > straight.out 2>&1 || fail "the uninterrupted run exited $?"
    hosts 3
    # elastic: hosts 0, 1, 2 from the start, host 2 dies: the job ends on 2 hosts; late: hosts 0
    # and 1, host 2 comes later and is admitted at once: the job ends on 3. Either way it goes on
    # from the checkpoint's progress.
    start="0 1 2"
    [ "$scenario" = late ] && start="0 1"
    pids=""
    for i in $start; do
        elastic_node "$i"
        pids="$pids $!"
    done
    checkpoint
    t0=$(date +%s%N)
    if [ "$scenario" = late ]; then
        elastic_node 2
        pids="$pids $!"
        expect="3 of 2..3 nodes (0,1,2)" world=3 event="host 2 came"
    elif [ "$scenario" = vanish ]; then # silently: nothing closes, its processes run on
        ip link set "${name}v2" down
        pids=${pids% *}
        expect="2 of 2..3 nodes (0,1)" world=2 event="host 2 vanished"
    else
        for p in $(ip netns pids "${name}2"); do kill -9 "$p" 2>/dev/null; done
        pids=${pids% *}
        expect="2 of 2..3 nodes (0,1)" world=2 event="host 2 died"
    fi
    await 60 "not training again 60 s after $event" grep -q "^resumed from" node0.out
    ms=$((($(date +%s%N) - t0) / 1000000))
    for p in $pids; do wait "$p" || fail "a surviving host's cddprun exited $?"; done
    has node0.out "cddprun: round 1: $expect"
    if [ "$scenario" = elastic ]; then # the root cause is the lost node, not a rank that lost it
        has node0.out "  root cause: node 2 (host $("$H" addr "$name" 2), ranks 2-2) is gone: its launcher's connection to the job's store ended"
    fi
    if [ "$scenario" = vanish ]; then # found by its silence, at CDDP_STORE_REPLY_S (5 s)
        has node0.out "  root cause: node 2 (host $("$H" addr "$name" 2), ranks 2-2) stopped answering: its launcher sent no heartbeat for ${CDDP_STORE_REPLY_S:-5} s"
    fi
    if [ "$scenario" = late ]; then
        has node2.out "cddprun: node 2 of 3 (no --node_rank: the order the nodes joined in"
        has node2.out "cddprun: node 2 came after round 0 of the job formed"
        has node0.out "cddprun: node 2 came to join the job: the group restarts with it (round 1)"
        grep -q "restarting the group (restart" node0.out node1.out && fail "the scale-up counted as a restart"
        grep -q "the job failed" node1.out && { cat node1.out; fail "host 1 took the scale-up for a failure"; }
        has node1.out "cddprun: node 2 came to join the job: the group restarts with it (round 1)"
    fi
    [ "$(json node0.out world)" = $world ] || fail "the job ended on $(json node0.out world) ranks, not $world"
    a=$(json straight.out test_acc) b=$(json node0.out test_acc)
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.5 && d <= 0.002) }' ||
        fail "test accuracy $b after $event, $a uninterrupted on 3 ranks"
    [ $ms -le 60000 ] || fail "training again took $ms ms after $event (bound: 60 s)"
    seen=$(grep -o 'after [0-9]* of its samples' node0.out | tr -dc 0-9)
    /usr/bin/python3 - "$seen" <<'EOF' || fail "a sample was skipped or trained twice"
import collections, glob, sys
seen = int(sys.argv[1])  # samples of epoch 0 in the checkpoint: 96 a step
def lines(restart):
    for path in glob.glob(f"samples.{restart}.*"):
        for line in open(path):
            yield tuple(int(v) for v in line.split())
for epoch in (0, 1):
    counts = collections.Counter(i for e, step, i in lines(1) if e == epoch)
    if epoch == 0:
        counts.update(i for e, step, i in lines(0) if e == 0 and step < seen // 96)
    bad = [i for i in range(9000) if counts[i] != 1] + [i for i in counts if not 0 <= i < 9000]
    if bad:
        sys.exit(f"epoch {epoch}: sample {bad[0]} trained {counts[bad[0]]} times ({len(bad)} wrong)")
EOF
    echo "ok: elastic job ($scenario), $event: $(grep -o 'after [0-9]* of its samples' node0.out)" \
         "of epoch 0, training again ($expect) after $ms ms; test accuracy $b, uninterrupted $a" ;;
below)
    export CDDP_RDZV_TIMEOUT_S=3
    hosts 2
    train="exec '$FM' --epochs 1000 --limit 2000 --log-every 0"
    node 0 2:3 1 --max_restarts 1 --grace_period 1 sh -c "$train"
    p0=$!
    node 1 2:3 1 --max_restarts 1 --grace_period 1 sh -c "$train"
    host1_dies
    has node0.out "root cause: node 1 (host $("$H" addr "$name" 1), ranks 1-1) is gone"
    has node0.out "cddprun: rendezvous failed: 1 of at least 2 nodes arrived within 3 s"
    echo "ok: elastic job below its minimum: host 0 stopped after $ms ms, saying why" ;;
ssh)
    reference
    hosts 4
    sshd_up 3 # host 3 has none
    # run_head OUT ARGS...: cddprun --hosts on host 0, in the background, its output in OUT; pid
    # in $head.
    run_head() {
        out=$1
        shift
        "$H" exec "$name" 0 "$build/bin/cddprun" --hosts "$list" --ssh "ssh -F $work/ssh_config" \
            --master_port 29400 --grace_period 1 "$@" > "$out" 2>&1 &
        head=$!
    }
    # head_ends RC WHEN: the head exits RC within 30 s of $t0; ms: how long it took.
    head_ends() {
        wait $head
        rc=$?
        ms=$((($(date +%s%N) - t0) / 1000000))
        [ $rc = "$1" ] || fail "the head exited $rc $2, not $1"
        [ $ms -le 30000 ] || fail "the head took $ms ms to end $2"
    }
    # The environment and -x on every host, each rank on its own host; host 0 named localhost
    # there: the others reach its store at its hostname.
    export CDDP_MARK=m1
    list="localhost:2,$name-host1,$name-host2"
    run_head echo.out -x XVAR=7 sh -c 'echo "rank $RANK of $WORLD_SIZE on $(hostname): $CDDP_MARK $XVAR"'
    wait $head || fail "the --hosts job of echoes exited $?"
    for r in "0 of 4 on $name-host0" "1 of 4 on $name-host0" "2 of 4 on $name-host1" "3 of 4 on $name-host2"; do
        has echo.out "rank $r: m1 7"
    done
    has echo.out "cddprun: node 0 is this machine, as localhost, which the other hosts cannot reach: they reach its store at $name-host0"
    has echo.out "cddprun: 3 hosts: localhost (2 ranks, here), $name-host1 (1 rank, ssh -F $work/ssh_config), $name-host2 (1 rank, ssh -F $work/ssh_config); node 0's store at $name-host0:29400"
    list="$name-host0:2,$name-host1,$name-host2"
    nothing_left 3 "after the echoes"
    # Training: 2 + 1 + 1 ranks end at the loss of 4 ranks on one host.
    run_head train.out "$FM" $train_args --out ssh
    wait $head || fail "the --hosts training exited $?"
    [ "$(json train.out world)" = 4 ] || fail "trained on $(json train.out world) ranks, not 4"
    has train.out "[cddp rank 0] I comm: 4 ranks on 3 hosts: tcp"
    same_loss train.out
    nothing_left 3 "after training"
    # A rank that fails fails the job, on every host.
    run_head fail.out sh -c "[ \$RANK = 3 ] && { sleep 1; exit 3; }; exec '$FM' --epochs 1000 --limit 2000 --out fail"
    wait $head
    rc=$?
    [ $rc = 1 ] || fail "the job with a failing rank exited $rc, not 1"
    has fail.out "root cause, on node 2: rank 3 (local rank 0, host $("$H" addr "$name" 2)) exited with code 3"
    # node 0's merged report alone on the head's console: the other nodes point at it
    [ "$(grep -c '^  root cause' fail.out)" = 1 ] || { cat fail.out; fail "the head's console holds more reports than node 0's"; }
    has fail.out "cddprun: node 2's part of the job failed; node 0's report names the root cause"
    nothing_left 3 "after a rank failed"
    # Ctrl-C: SIGINT to the head stops every node.
    run_head int.out "$FM" --epochs 1000 --limit 2000 --out int
    await 60 "no second epoch in 60 s" grep -q "^epoch: 1," int.out
    t0=$(date +%s%N)
    kill -INT $head
    head_ends 130 "after SIGINT"
    has int.out "cddprun: got SIGINT; stopping every node"
    [ "$(grep -c "cddprun: stopping this node: the cddprun --hosts that started it stopped the job" int.out)" = 3 ] ||
        fail "not every node said why it stopped"
    nothing_left 3 "after Ctrl-C"
    int_ms=$ms
    # Ctrl-C again, with the end of the head's control stream reaching hosts 1 and 2 half a
    # second late (an ssh that forwards stdin's end slowly): their ranks see host 0's stop first,
    # and each node still says the head stopped it, not that a rank failed.
    printf '#!/bin/sh\n{ cat; sleep 0.5; } | ssh -F %s "$@"\n' "$work/ssh_config" > "$work/slow_ssh"
    chmod +x "$work/slow_ssh"
    "$H" exec "$name" 0 "$build/bin/cddprun" --hosts "$list" --ssh "$work/slow_ssh" \
        --master_port 29400 --grace_period 1 "$FM" --epochs 1000 --limit 2000 --out late \
        > late.out 2>&1 &
    head=$!
    await 60 "no second epoch in 60 s (late control stream)" grep -q "^epoch: 1," late.out
    t0=$(date +%s%N)
    kill -INT $head
    head_ends 130 "after SIGINT (late control stream)"
    [ "$(grep -c "cddprun: stopping this node: the cddprun --hosts that started it stopped the job" late.out)" = 3 ] ||
        { cat late.out; fail "a node reached late by the head's stop reported a failure"; }
    grep -q "root cause" late.out && { cat late.out; fail "a stopped job reported a root cause"; }
    nothing_left 3 "after Ctrl-C with a late control stream"
    # The head's host vanishes silently: its link goes down, then everything on it is killed (no
    # connection's end reaches hosts 1 and 2, whose ssh sessions linger). Their launchers stop
    # within CDDP_HEAD_SILENT_S (3 s here) of the head's last heartbeat, and their ranks with them.
    export CDDP_HEAD_SILENT_S=3
    run_head gone.out "$FM" --epochs 1000 --limit 2000 --out gone
    unset CDDP_HEAD_SILENT_S
    await 60 "no second epoch in 60 s (head gone)" grep -q "^epoch: 1," gone.out
    ip link set "${name}v0" down
    for p in $(ip netns pids "${name}0"); do kill -KILL "$p" 2>/dev/null; done
    t0=$(date +%s)
    while :; do
        left=""
        for k in 1 2; do
            for p in $(ip netns pids "$name$k"); do
                case "$(cat /proc/$p/comm 2>/dev/null)" in cddprun | fashion_mnist) left="$left $p" ;; esac
            done
        done
        [ -z "$left" ] && break
        [ $(($(date +%s) - t0)) -lt 20 ] || fail "hosts 1 and 2 still run$left 20 s after the head's host vanished"
        sleep 0.2
    done
    gone_s=$(($(date +%s) - t0))
    ip link set "${name}v0" up
    # A host without sshd: the head names it and stops the others at once.
    list="$name-host0,$name-host1,$name-host3"
    t0=$(date +%s%N)
    run_head nossh.out "$FM" --epochs 1000 --limit 2000 --out nossh
    head_ends 255 "with an unreachable host"
    has nossh.out "cddprun: node 2 (host $name-host3): ssh exited 255: it could not reach or log in to $name-host3"
    nothing_left 3 "after an unreachable host"
    echo "ok: cddprun --hosts on 3 hosts over ssh: final loss $loss, one host's $ref; a failed" \
         "rank failed the job; SIGINT stopped every host in $int_ms ms; an unreachable host named" \
         "in $ms ms; nothing left running on any host; hosts whose head vanished stopped in" \
         "$gone_s s" ;;
cut)
    unset CDDP_TIMEOUT_S CDDP_STORE_REPLY_S # the silence bound at its default, 5 s
    hosts 3
    for i in 0 1 2; do
        node "$i" 3 1 "$FM" --epochs 1000 --limit 2000 --out "out$i"
        eval "p$i=\$!"
    done
    second_epoch
    t0=$(date +%s%N)
    ip link set "${name}v2" down
    wait $p0
    r0=$?
    ms0=$((($(date +%s%N) - t0) / 1000000))
    for p in $p1 $p2; do
        i=0
        while kill -0 "$p" 2>/dev/null && [ $i -lt 300 ]; do i=$((i + 1)); sleep 0.1; done
        kill -0 "$p" 2>/dev/null && fail "a cddprun still runs 30 s after host 2's link went down"
    done
    wait $p1
    r1=$?
    wait $p2
    r2=$?
    ms2=$((($(date +%s%N) - t0) / 1000000))
    [ $r0 = 1 ] && [ $r1 = 1 ] && [ $r2 = 1 ] || fail "the cddprun exited $r0, $r1 and $r2, not 1"
    [ $ms0 -le 30000 ] || fail "host 0's cddprun took $ms0 ms"
    has node0.out "  root cause: node 2 (host $("$H" addr "$name" 2), ranks 2-2) stopped answering: its launcher sent no heartbeat for ${CDDP_STORE_REPLY_S:-5} s"
    grep -q "root cause, on node 1" node0.out && fail "host 0 blames host 1's rank, which failed after host 2"
    has node2.out "node 0's launcher is gone"
    # The flight records, host 1's through the store: hosts 0 and 1 wait in one allreduce, host
    # 2's rank left none (its link is down).
    has node0.out ": 2 of 3 ranks"
    grep -q "^  ranks 0-1 wait in allreduce #[0-9]* (bucket [0-9]*: .* \.\. .*), up to " node0.out ||
        fail "host 0's report does not say that ranks 0-1 wait in one allreduce"
    has node0.out "rank 2 left no record: it is stopped, killed, hung without answering SIGUSR1, or never started (the ranks above wait for it)"
    echo "ok: host 2 of 3 cut off: host 0's cddprun exited 1 after $ms0 ms naming host 2, the others by $ms2 ms; the flight records say ranks 0-1 wait for rank 2" ;;
*) fail "unknown scenario $scenario" ;;
esac
