/* rendezvous.c: cddprun meets the other nodes in the store; failures they post. */
#include "cddprun.h"

#include "cddp/net.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- rendezvous -------------------------------------------------------------------------- */

void cddprun_fail_rdzv(const char *what, const cddp_error *err) {
    fprintf(stderr, "cddprun: %s: %s\n", what, cddp_error_msg(err));
    exit(1);
}

/* A signal (Ctrl-C while the other nodes are awaited) ends cddprun at once, with the usual
 * 128 + signal. */
static void exit_if_signalled(void) {
    if (!cddprun_got_signal) return;
    fprintf(stderr, "cddprun: stopped by SIG%s while waiting for the other nodes\n",
            sigabbrev_np(cddprun_got_signal));
    exit(128 + cddprun_got_signal);
}

/* Waits for the keys up to CDDP_RDZV_TIMEOUT_S, a second at a time, so that a signal ends
 * cddprun at once. */
static int wait_for_nodes(job *j, const char *const *keys, int n, cddp_error *err) {
    double end = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    for (;;) {
        exit_if_signalled();
        double left = end - cddp_now_s();
        int rc = cddp_store_wait(j->store, keys, n, CDDP_MAX(CDDP_MIN(left, 1.0), 0.0), err);
        if (rc != CDDP_ETIMEDOUT || left <= 1.0) return rc;
    }
}

bool cddprun_can_listen(const char *host) {
    int fd, port;
    if (cddp_net_listen(host, 0, &fd, &port, NULL) != CDDP_OK) return false;
    close(fd);
    return true;
}

/* Whether the store holds key now (a failed request counts as no). */
static bool has(job *j, const char *key) {
    cddp_error err = {0};
    return cddp_store_wait(j->store, &key, 1, 0, &err) == CDDP_OK;
}

void cddprun_run_id(job *j) {
    const options *o = &j->o;
    cddp_error err = {0};
    if (j->server) {
        const char *slurm = getenv("SLURM_JOB_ID"); /* the same job again when Slurm requeues it */
        if (o->run_id)
            snprintf(j->run_id, sizeof j->run_id, "%s", o->run_id);
        else if (slurm && *slurm && strlen(slurm) < 40)
            snprintf(j->run_id, sizeof j->run_id, "slurm-%s", slurm);
        else
            cddprun_random_hex(j->run_id, 8);
        if (cddp_store_set_str(j->store, "run_id", j->run_id, &err))
            cddprun_fail_rdzv("rendezvous", &err);
        return;
    }
    const char *key = "run_id";
    int rc = wait_for_nodes(j, &key, 1, &err);
    if (rc == CDDP_ETIMEDOUT) {
        fprintf(stderr,
                "cddprun: rendezvous failed: the store at %s gave no run id within %ld s "
                "(CDDP_RDZV_TIMEOUT_S): is it another program's, or a launcher of another "
                "version?\n",
                CDDP_NET_ENDPOINT(o->master_addr, o->master_port),
                cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S));
        exit(1);
    }
    void *v;
    size_t n;
    if (rc || cddp_store_get(j->store, key, -1, &v, &n, &err))
        cddprun_fail_rdzv("rendezvous", &err);
    snprintf(j->run_id, sizeof j->run_id, "%s", (char *)v);
    cddp_free(v);
    if (o->run_id && strcmp(o->run_id, j->run_id) != 0) {
        fprintf(stderr,
                "cddprun: the job at %s is run '%s', but this node was started for run '%s' "
                "(--rdzv_id/--run_id): another job holds that endpoint. Give this node that "
                "job's id to join it, or its own job another --master_port (or --rdzv_endpoint)\n",
                CDDP_NET_ENDPOINT(o->master_addr, o->master_port), j->run_id, o->run_id);
        exit(1);
    }
}

/* Elastic, node 0: waits until --nnodes MAX nodes registered for the round, or MIN and no other
 * for LAST_CALL_S, or (a restart) MIN and every node of the last round that is not lost, and
 * posts the round's members ("0,2,3"). */
#define LAST_CALL_S 2.0
static void form_round(job *j) {
    const options *o = &j->o;
    double now = cddp_now_s(), end = now + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    double changed = now;
    int had = -1, count = 0;
    char key[64];
    bool *back = cddp_calloc((size_t)o->nnodes, sizeof *back); /* the last round's survivors */
    if (!back) {
        fprintf(stderr, "cddprun: out of memory\n");
        exit(1);
    }
    for (int k = 0; j->round > 0 && k < o->nnodes; k++) back[k] = j->in[k] && !j->lost[k];
    for (;;) {
        exit_if_signalled();
        count = 0;
        for (int k = 0; k < o->nnodes; k++) {
            snprintf(key, sizeof key, "r%d/node/%d", j->round, k);
            const char *kk = key;
            cddp_error err = {0};
            int rc = cddp_store_wait(j->store, &kk, 1, 0, &err);
            if (rc != CDDP_OK && rc != CDDP_ETIMEDOUT) cddprun_fail_rdzv("rendezvous", &err);
            j->in[k] = rc == CDDP_OK;
            count += j->in[k];
        }
        now = cddp_now_s();
        if (count != had) had = count, changed = now;
        bool survivors = j->round > 0;
        for (int k = 0; k < o->nnodes; k++) survivors &= !back[k] || j->in[k];
        if (count == o->nnodes ||
            (count >= o->nnodes_min && (survivors || now - changed >= LAST_CALL_S)))
            break;
        if (now > end) {
            fprintf(stderr,
                    "cddprun: rendezvous failed: %d of at least %d nodes arrived within %ld s "
                    "(CDDP_RDZV_TIMEOUT_S) at %s\n",
                    count, o->nnodes_min, cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S),
                    CDDP_NET_ENDPOINT(o->master_addr, o->master_port));
            exit(1);
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cddp_free(back);
    size_t cap = (size_t)o->nnodes * 7 + 1, len = 0; /* ids below 65536, and commas */
    char *list = cddp_calloc(cap, 1);
    if (!list) {
        fprintf(stderr, "cddprun: out of memory\n");
        exit(1);
    }
    for (int k = 0; k < o->nnodes; k++)
        if (j->in[k]) len += (size_t)snprintf(list + len, cap - len, "%s%d", len ? "," : "", k);
    snprintf(key, sizeof key, "r%d/members", j->round);
    cddp_error err = {0};
    if (cddp_store_set_str(j->store, key, list, &err)) cddprun_fail_rdzv("rendezvous", &err);
    if (j->round > 0 || count < o->nnodes)
        fprintf(stderr, "cddprun: round %d: %d of %d..%d nodes (%s)\n", j->round, count,
                o->nnodes_min, o->nnodes, list);
    cddp_free(list);
}

/* Elastic, every node: the round's members from node 0, into j->in. False when this node is
 * not among them (it came after the round formed). */
static bool read_members(job *j) {
    char key[64];
    snprintf(key, sizeof key, "r%d/members", j->round);
    const char *k = key;
    cddp_error err = {0};
    double until = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    int rc;
    /* A second at a time: node 0 may end the job (it posts "ended") while this node waits. */
    while ((rc = cddp_store_wait(j->store, &k, 1, 1.0, &err)) == CDDP_ETIMEDOUT &&
           cddp_now_s() < until) {
        exit_if_signalled();
        if (has(j, "ended")) {
            fprintf(stderr,
                    "cddprun: the job ended before round %d formed: nothing for node %d to do\n",
                    j->round, j->o.node_rank);
            exit(0);
        }
    }
    if (rc == CDDP_ETIMEDOUT) {
        fprintf(stderr,
                "cddprun: rendezvous failed: round %d of the elastic job did not form within %ld s "
                "(CDDP_RDZV_TIMEOUT_S) at %s\n",
                j->round, cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S),
                CDDP_NET_ENDPOINT(j->o.master_addr, j->o.master_port));
        exit(1);
    }
    if (rc) {
        fprintf(stderr,
                "cddprun: the job's store went away before round %d formed (the job ended, or "
                "node 0 failed): %s\n",
                j->round, cddp_error_msg(&err));
        exit(1);
    }
    void *v;
    size_t n;
    if (cddp_store_get(j->store, key, -1, &v, &n, &err)) cddprun_fail_rdzv("rendezvous", &err);
    memset(j->in, 0, (size_t)j->o.nnodes * sizeof *j->in);
    for (char *p = v; *p;) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p) break;
        if (id >= 0 && id < j->o.nnodes) j->in[id] = true;
        p = *end ? end + 1 : end;
    }
    cddp_free(v);
    return j->in[j->o.node_rank];
}

/* Claims --node_rank for this round: a second launcher with the same node rank (a copy-pasted
 * command line) is refused, naming the first, instead of hanging the job. In an elastic job a
 * rank whose round has formed already belongs to a node that came before (this one joins the
 * next round), so only a claim on a round still forming is a twin. */
static void claim_node_rank(job *j, bool elastic) {
    char key[64];
    snprintf(key, sizeof key, "r%d/claim/%d", j->round, j->o.node_rank);
    if (!j->claim[0]) {
        char nonce[9];
        cddprun_random_hex(nonce, 4);
        snprintf(j->claim, sizeof j->claim, "%.32s pid %d %s", j->host, (int)getpid(), nonce);
    }
    void *cur = NULL;
    size_t len = 0;
    cddp_error err = {0};
    if (cddp_store_compare_set(j->store, key, "", 0, j->claim, strlen(j->claim), &cur, &len, &err))
        cddprun_fail_rdzv("rendezvous", &err);
    bool mine = len == strlen(j->claim) && !memcmp(cur, j->claim, len);
    char other[96];
    snprintf(other, sizeof other, "%.*s", (int)CDDP_MIN(len, sizeof other - 1), (char *)cur);
    cddp_free(cur);
    if (mine) return;
    char members[64];
    snprintf(members, sizeof members, "r%d/members", j->round);
    const char *mk = members;
    if (elastic && cddp_store_wait(j->store, &mk, 1, 0, &err) == CDDP_OK) return;
    fprintf(stderr,
            "cddprun: node rank %d is taken in this job by another launcher (%s): give each "
            "node its own --node_rank\n",
            j->o.node_rank, other);
    exit(1);
}

/* Which loopback node k reaches (cddp_net_loopback_id), as it registered for the round, into
 * reach (n bytes). False when it posted none. */
static bool node_reach(job *j, int k, char *reach, size_t n) {
    char key[64];
    void *v = NULL;
    size_t len = 0;
    cddp_error err = {0};
    snprintf(key, sizeof key, "r%d/reach/%d", j->round, k);
    if (cddp_store_get(j->store, key, 0, &v, &len, &err) != CDDP_OK) return false;
    snprintf(reach, n, "%s", (char *)v);
    cddp_free(v);
    return true;
}

/* A node that refuses the job says so in the store; node 0, whose process holds it, waits up to
 * 2 s for the other nodes that refuse too, so that each reads what it needs to say why. */
static void refuse_together(job *j) {
    char key[64];
    cddp_error err = {0};
    snprintf(key, sizeof key, "r%d/refused/%d", j->round, j->o.node_rank);
    cddp_store_set_str(j->store, key, "1", &err);
    double until = cddp_now_s() + 2.0;
    for (int k = 1; j->server && k < j->o.nnodes; k++) {
        snprintf(key, sizeof key, "r%d/refused/%d", j->round, k);
        const char *kk = key;
        double left = until - cddp_now_s();
        if (j->in[k] && left > 0) cddp_store_wait(j->store, &kk, 1, left, &err);
    }
}

/* This node's address for the others is loopback (--local_addr lo, CDDP_SOCKET_IFNAME=lo) in a
 * job with a node on another host (or network namespace): that node's ranks would connect to
 * their own loopback and fail at CDDP_RDZV_TIMEOUT_S. Refused at once. Only such a node reads
 * the others' posts: a job of many nodes costs its store nothing. */
static void loopback_reachable(job *j) {
    const options *o = &j->o;
    if (!cddp_net_is_loopback(j->host)) return;
    char mine[128], other[128];
    cddp_net_loopback_id(mine, sizeof mine);
    for (int k = 0; k < o->nnodes; k++) {
        if (k == o->node_rank || !j->in[k] || !node_reach(j, k, other, sizeof other) ||
            !cddp_net_loopback_apart(mine, other))
            continue;
        fprintf(stderr,
                "cddprun: node %d's address for the others is %s, a loopback address, but node "
                "%d is on another host (or network namespace): its ranks cannot reach node %d's "
                "there. Give node %d an address the other hosts reach: --local_addr (or "
                "CDDP_SOCKET_IFNAME) naming an interface other than lo, or its host name\n",
                o->node_rank, j->host, k, o->node_rank, o->node_rank);
        refuse_together(j);
        exit(1);
    }
}

/* Registers this node for the round, waits for the others, and computes ranks. In an elastic
 * job (--nnodes MIN:MAX) node 0 decides who is in the round; a node that comes after a round
 * formed waits for the next one, which the job's next restart starts. */
/* This node's registration for the round: its node rank claimed, its will (r<N>/gone/<k>: the
 * store says at once when this launcher's connection ends), which loopback it reaches, its
 * workers and address; in an elastic job, round after round until one admits it. */
static void register_node(job *j, bool elastic) {
    const options *o = &j->o;
    cddp_error err = {0};
    char key[128], val[512];
    void *v;
    size_t n;
    /* A job under way: its current round (if that formed already, read_members below says so
     * and this node goes on to the next). */
    if (elastic && o->node_rank != 0 && j->round == 0 &&
        cddp_store_get(j->store, "round", 0, &v, &n, &err) == CDDP_OK) {
        j->round = atoi(v);
        cddp_free(v);
    }
    for (;;) {
        if (elastic && o->node_rank == 0) {
            snprintf(val, sizeof val, "%d", j->round);
            if (cddp_store_set_str(j->store, "round", val, &err))
                cddprun_fail_rdzv("rendezvous", &err);
        }
        claim_node_rank(j, elastic);
        if (o->node_rank != 0) {
            snprintf(key, sizeof key, "r%d/gone/%d", j->round - 1, o->node_rank);
            if (j->round > 0 && cddp_store_clear_will(j->store, key, &err))
                cddprun_fail_rdzv("rendezvous", &err);
            snprintf(key, sizeof key, "r%d/gone/%d", j->round, o->node_rank);
            if (cddp_store_set_will(j->store, key, "1", 1, &err))
                cddprun_fail_rdzv("rendezvous", &err);
        }
        char reach[128];
        cddp_net_loopback_id(reach, sizeof reach); /* before the node: posted when it is */
        snprintf(key, sizeof key, "r%d/reach/%d", j->round, o->node_rank);
        if (cddp_store_set_str(j->store, key, reach, &err)) cddprun_fail_rdzv("rendezvous", &err);
        snprintf(key, sizeof key, "r%d/node/%d", j->round, o->node_rank);
        snprintf(val, sizeof val, "%d %s", o->nproc_per_node, j->host);
        if (cddp_store_set_str(j->store, key, val, &err)) cddprun_fail_rdzv("rendezvous", &err);
        if (!elastic) break;
        if (o->node_rank == 0) form_round(j);
        if (read_members(j)) break;
        fprintf(stderr,
                "cddprun: node %d came after round %d of the job formed; it joins at the next "
                "restart\n",
                o->node_rank, j->round);
        j->round++;
    }
}

/* Node 0: MASTER_PORT for the workers, a free port on the master address for rank 0's store. */
static void post_worker_port(job *j) {
    const options *o = &j->o;
    cddp_error err = {0};
    char key[64], val[32];
    int fd, port;
    if (cddp_net_listen(o->master_addr, 0, &fd, &port, &err)) cddprun_fail_rdzv("rendezvous", &err);
    close(fd);
    snprintf(val, sizeof val, "%d", port);
    snprintf(key, sizeof key, "r%d/worker_port", j->round);
    if (cddp_store_set_str(j->store, key, val, &err)) cddprun_fail_rdzv("rendezvous", &err);
}

/* The nodes of keys (nkeys) that did not arrive in time, named, with what to do; exits. */
static void nodes_missing(job *j, const char **keys, int nkeys) {
    const options *o = &j->o;
    char missing[512] = "";
    size_t len = 0;
    for (int i = 0; i < nkeys && len < sizeof missing - 16; i++) {
        cddp_error e2 = {0};
        if (cddp_store_wait(j->store, &keys[i], 1, 0, &e2) == CDDP_ETIMEDOUT)
            len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "",
                                    strrchr(keys[i], '/') + 1);
    }
    fprintf(stderr,
            "cddprun: rendezvous failed: node(s) %s of %d did not arrive within %ld s "
            "(CDDP_RDZV_TIMEOUT_S) at %s\n"
            "cddprun: start cddprun on every node with --nnodes %d, its own --node_rank, and "
            "the same --master_addr, --master_port and --token\n",
            missing[0] ? missing : "?", o->nnodes, cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S),
            CDDP_NET_ENDPOINT(o->master_addr, o->master_port), o->nnodes);
    exit(1);
}

/* The world from the round's nodes (keys, one a node in the round): its size, this node's first
 * rank and place among them; a registration that is not a worker count ends the rendezvous. */
static void read_world(job *j, const char **keys) {
    const options *o = &j->o;
    cddp_error err = {0};
    void *v;
    size_t n;
    j->world = j->base = j->nodes = j->group_rank = 0;
    for (int i = 0, k = 0; k < o->nnodes; k++) {
        if (!j->in[k]) continue;
        if (cddp_store_get(j->store, keys[i++], -1, &v, &n, &err))
            cddprun_fail_rdzv("rendezvous", &err);
        char *end;
        long p = strtol(v, &end, 10);
        bool bad = end == (char *)v || *end != ' ' || p < 1 || p > 65536 || j->world + p > 1 << 20;
        if (bad) {
            fprintf(stderr,
                    "cddprun: rendezvous failed: node %d registered '%.40s', not a worker count "
                    "from 1 to 65536 (in a world of at most %d ranks): a launcher of another "
                    "version, or a stranger with the job's token\n",
                    k, (char *)v, 1 << 20);
            exit(1);
        }
        cddp_free(v);
        if (k < o->node_rank) j->base += (int)p, j->group_rank++;
        j->world += (int)p;
        j->nodes++;
        j->lost[k] = false;
    }
}

/* The workers' port node 0 posted (key), checked. */
static void read_worker_port(job *j, const char *key) {
    cddp_error err = {0};
    void *v;
    size_t n;
    if (cddp_store_get(j->store, key, -1, &v, &n, &err)) cddprun_fail_rdzv("rendezvous", &err);
    char *pend;
    long wp = strtol(v, &pend, 10);
    if (pend == (char *)v || *pend || wp < 1 || wp > 65535) {
        fprintf(stderr, "cddprun: rendezvous failed: node 0 posted the workers' port '%.20s'\n",
                (char *)v);
        exit(1);
    }
    snprintf(j->worker_port, sizeof j->worker_port, "%ld", wp);
    cddp_free(v);
}

void cddprun_rendezvous(job *j) {
    const options *o = &j->o;
    bool elastic = o->nnodes_min < o->nnodes;
    cddp_error err = {0};
    register_node(j, elastic);
    if (o->node_rank == 0) post_worker_port(j);
    if (!elastic)
        for (int k = 0; k < o->nnodes; k++) j->in[k] = true;
    const char **keys = cddp_calloc((size_t)o->nnodes + 1, sizeof *keys);
    char(*names)[64] = cddp_calloc((size_t)o->nnodes + 1, 64);
    int nkeys = 0;
    for (int k = 0; k < o->nnodes; k++) {
        if (!j->in[k]) continue;
        snprintf(names[nkeys], 64, "r%d/node/%d", j->round, k);
        keys[nkeys] = names[nkeys];
        nkeys++;
    }
    snprintf(names[nkeys], 64, "r%d/worker_port", j->round);
    keys[nkeys] = names[nkeys];
    if (wait_for_nodes(j, keys, nkeys + 1, &err)) nodes_missing(j, keys, nkeys);
    loopback_reachable(j);
    read_world(j, keys);
    read_worker_port(j, keys[nkeys]);
    cddp_free(keys);
    cddp_free(names);
}

bool cddprun_newcomer(job *j, char *why, size_t n) {
    const options *o = &j->o;
    if (o->node_rank != 0 || o->nnodes_min == o->nnodes) return false;
    for (int k = 0; k < o->nnodes; k++) {
        char key[64];
        snprintf(key, sizeof key, "r%d/node/%d", j->round + 1, k);
        if (j->in[k] || !has(j, key)) continue;
        cddp_error err = {0};
        snprintf(why, n, "%snode %d came to join the job: the group restarts with it", CDDPRUN_GROW,
                 k);
        snprintf(key, sizeof key, "r%d/failed", j->round);
        if (cddp_store_set_str(j->store, key, why, &err)) cddprun_fail_rdzv("rendezvous", &err);
        return true;
    }
    return false;
}

/* Has another node posted a failure for this round? Fills why. A store that went away counts
 * as a failure too: node 0's launcher is gone. */
bool cddprun_remote_failure(job *j, char *why, size_t n) {
    char key[64];
    snprintf(key, sizeof key, "r%d/failed", j->round);
    const char *k = key;
    cddp_error err = {0};
    int rc = cddp_store_wait(j->store, &k, 1, 0, &err);
    if (rc == CDDP_ETIMEDOUT) return false;
    if (rc != CDDP_OK) {
        snprintf(why, n, "lost the rendezvous store (%s); node 0's launcher is gone",
                 cddp_error_msg(&err));
        return true;
    }
    void *v;
    size_t len;
    if (cddp_store_get(j->store, key, 1, &v, &len, &err) == CDDP_OK) {
        snprintf(why, n, "%s", (char *)v);
        cddp_free(v);
    } else {
        snprintf(why, n, "another node failed");
    }
    return true;
}

/* Node k of this round as it registered, "node 2 (host 10.0.0.3, ranks 4-5)", into out: from
 * every node up to k, its rank count and host. */
static void node_of_round(job *j, int k, char *out, size_t n) {
    int base = 0, count = 0;
    char host[256] = "?";
    for (int i = 0; i <= k; i++) {
        char key[64];
        snprintf(key, sizeof key, "r%d/node/%d", j->round, i);
        void *v = NULL;
        size_t len = 0;
        cddp_error err = {0};
        if (cddp_store_get(j->store, key, 0, &v, &len, &err) != CDDP_OK) break;
        int p = 0, skip = 0;
        if (sscanf(v, "%d %n", &p, &skip) == 1 && i == k) {
            count = p;
            snprintf(host, sizeof host, "%s", (char *)v + skip);
        } else if (i < k) {
            base += p;
        }
        cddp_free(v);
    }
    snprintf(out, n, "node %d (host %s, ranks %d-%d)", k, host, base, base + count - 1);
}

/* Whether node k's launcher is gone: its connection to the store ended (its will, set at the
 * round's rendezvous) before it left. */
static bool gone(job *j, int k) {
    char gk[64], lk[64];
    snprintf(gk, sizeof gk, "r%d/gone/%d", j->round, k);
    snprintf(lk, sizeof lk, "r%d/left/%d", j->round, k);
    return has(j, gk) && !has(j, lk);
}

bool cddprun_heartbeat(job *j, char *why, size_t n) {
    double now = cddp_now_s();
    if (now < j->next_beat) return false;
    bool first = j->next_beat == 0;
    j->next_beat = now + 1.0;
    char key[64];
    cddp_error err = {0};
    int64_t v;
    if (j->o.node_rank != 0) {
        snprintf(key, sizeof key, "r%d/beat/%d", j->round, j->o.node_rank);
        cddp_store_add(j->store, key, 1, &v, &err); /* a failure shows in remote_failure */
        return false;
    }
    double limit = (double)CDDP_MAX(cddp_knob_int(CDDP_KNOB_STORE_REPLY_S), 1);
    for (int k = 1; k < j->o.nnodes; k++) {
        if (!j->in[k]) continue;
        char node[320];
        if (gone(j, k)) {
            node_of_round(j, k, node, sizeof node);
            snprintf(why, n,
                     "%s is gone: its launcher's connection to the job's store ended (it was "
                     "killed, or its host died)",
                     node);
            j->lost[k] = true;
            j->lost_wall = cddprun_wall_s();
            return true;
        }
        snprintf(key, sizeof key, "r%d/beat/%d", j->round, k);
        if (cddp_store_add(j->store, key, 0, &v, &err) != CDDP_OK) return false;
        if (first || v != j->beat[k]) {
            j->beat[k] = v;
            j->beat_at[k] = now;
        } else if (now - j->beat_at[k] > limit) {
            /* A node whose workers all finished has left: it beats no more, rightly. */
            snprintf(key, sizeof key, "r%d/left/%d", j->round, k);
            if (has(j, key)) {
                j->beat_at[k] = now;
                continue;
            }
            node_of_round(j, k, node, sizeof node);
            snprintf(why, n,
                     "%s stopped answering: its launcher sent no heartbeat for %.0f s "
                     "(CDDP_STORE_REPLY_S; the host is down, or the network to it is cut)",
                     node, limit);
            j->lost[k] = true;
            j->lost_wall = cddprun_wall_s() - limit;
            return true;
        }
    }
    return false;
}

/* Node k's cause into *v (CDDP_OK), or CDDP_ENOENT when its launcher is gone, or CDDP_ETIMEDOUT
 * when it posted none by until. */
static int cause_of(job *j, int k, double until, void **v, size_t *len) {
    char key[64];
    snprintf(key, sizeof key, "r%d/cause/%d", j->round, k);
    for (;;) {
        cddp_error err = {0};
        if (cddp_store_get(j->store, key, 0, v, len, &err) == CDDP_OK) return CDDP_OK;
        if (gone(j, k)) return CDDP_ENOENT;
        if (cddp_now_s() >= until) return CDDP_ETIMEDOUT;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int cddprun_gather_causes(job *j, remote_cause *out, int max) {
    int n = 0;
    double until = cddp_now_s() + j->o.grace_period + 5;
    for (int k = 1; k < j->o.nnodes && n < max; k++) {
        if (j->lost[k] || !j->in[k]) continue; /* silent already (the root cause), or out */
        void *v = NULL;
        size_t len = 0;
        int rc = cause_of(j, k, until, &v, &len);
        if (rc != CDDP_OK) {
            /* Every live launcher posts within the grace period: this one is gone, and with
             * it, most likely, its host (or the network to it). */
            char node[320];
            node_of_round(j, k, node, sizeof node);
            out[n] = (remote_cause){.node = k, .when = cddprun_wall_s(), .lost = true};
            if (rc == CDDP_ENOENT)
                snprintf(out[n].text, sizeof out[n].text,
                         "%s is gone: its launcher's connection to the job's store ended before "
                         "it reported (it was killed, or its host died)",
                         node);
            else
                snprintf(out[n].text, sizeof out[n].text,
                         "%s is gone: its launcher posted no report within %.0f s (the host "
                         "died, or the network to it is down)",
                         node, j->o.grace_period + 5);
            n++;
            continue;
        }
        int skip = 0;
        double when = 0;
        if (sscanf(v, "%lf %n", &when, &skip) == 1 && when > 0 && ((char *)v)[skip]) {
            out[n] = (remote_cause){.node = k, .when = when};
            snprintf(out[n].text, sizeof out[n].text, "%s", (char *)v + skip);
            n++;
        }
        cddp_free(v);
    }
    return n;
}
