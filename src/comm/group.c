/* group.c: making and ending a group, and the public calls.
 *
 * Rendezvous. Rank 0 starts a store at MASTER_ADDR:MASTER_PORT (under cddprun: on any free port,
 * which it posts in the launcher's store); every rank connects, posts its host identity (boot id
 * + hostname) and reads everyone's. The transport follows: shared memory when every rank is on
 * this host, else TCP (CDDP_TRANSPORT forces one), or MPI under mpirun/srun when built in
 * (CDDP_BACKEND). Across hosts with several ranks on some, each host's ranks also get a
 * shared-memory group of their own for the hierarchical allreduce. Rank 0 then says once what
 * the group runs on and why, and ranks that share a host get one math-library thread each
 * unless the user chose (or a thread for each CPU bound to them alone).
 *
 * The public calls build a coll and either run it on the caller's thread (work.c makes it wait
 * for queued work first) or queue it; collective.c does the rest.
 */
#include "cddp/launch.h"
#include "cddp/net.h"
#include "cddp/store.h"
#include "comm/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cddp_comm_rank(const cddp_comm *c) {
    return c->rank;
}
double cddp_comm_timeout(const cddp_comm *c) {
    return c->timeout;
}
int cddp_comm_size(const cddp_comm *c) {
    return c->world;
}
int cddp_comm_local_rank(const cddp_comm *c) {
    return c->local_rank;
}
int cddp_comm_local_size(const cddp_comm *c) {
    return c->local_world;
}
const char *cddp_comm_backend(const cddp_comm *c) {
    return c->tr->name;
}
const char *cddp_comm_error(const cddp_comm *c) {
    return c->failed.code ? c->failed.msg : NULL;
}

/* ---- the public calls: blocking, and queued on the communication thread ------------------- */

#define CALL(k, s, r, n, dt, o, rt, t)                                                             \
    (&(coll){.kind = (k),                                                                          \
             .send = (s),                                                                          \
             .recv = (r),                                                                          \
             .count = (n),                                                                         \
             .dtype = (dt),                                                                        \
             .op = (o),                                                                            \
             .root = (rt),                                                                         \
             .timeout_s = (t)})

int cddp_comm_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_comm_op op, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_ALLREDUCE, send, recv, count, dt, op, 0, timeout_s), err);
}

int cddp_comm_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int root,
                        double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_BROADCAST, buf, buf, count, dt, 0, root, timeout_s), err);
}

int cddp_comm_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_ALLGATHER, send, recv, count, dt, 0, 0, timeout_s), err);
}

int cddp_comm_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dt, cddp_comm_op op, double timeout_s,
                             cddp_error *err) {
    return cddp__comm_run(c, CALL(K_REDUCE_SCATTER, send, recv, count, dt, op, 0, timeout_s), err);
}

int cddp_comm_gather(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                     int root, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_GATHER, send, recv, count, dt, 0, root, timeout_s), err);
}

int cddp_comm_scatter(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                      int root, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_SCATTER, send, recv, count, dt, 0, root, timeout_s), err);
}

int cddp_comm_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dt, int dst,
                   double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_SEND, buf, NULL, count, dt, 0, dst, timeout_s), err);
}

int cddp_comm_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int src,
                   double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_RECV, NULL, buf, count, dt, 0, src, timeout_s), err);
}

void *cddp_comm_alloc(cddp_comm *c, size_t bytes, cddp_error *err) {
    void *p = NULL;
    if (bytes > INT64_MAX) {
        cddp_error_set(err, CDDP_EINVAL, "cannot allocate %zu bytes", bytes);
        return NULL;
    }
    int rc = cddp__comm_run(c, CALL(K_ALLOC, NULL, &p, (int64_t)bytes, 0, 0, 0, -1), err);
    return rc == CDDP_OK ? p : NULL;
}

void cddp_comm_free(cddp_comm *c, void *p) {
    if (c && p) cddp__comm_run(c, CALL(K_FREE, NULL, p, 0, 0, 0, 0, -1), NULL);
}

int cddp_comm_barrier(cddp_comm *c, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_BARRIER, NULL, NULL, 0, CDDP_COMM_F32, 0, 0, timeout_s), err);
}

cddp_comm_work *cddp_comm_allreduce_async(cddp_comm *c, const void *send, void *recv, int64_t count,
                                          cddp_comm_dtype dt, cddp_comm_op op, double timeout_s,
                                          cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_ALLREDUCE, send, recv, count, dt, op, 0, timeout_s), err);
}

cddp_comm_work *cddp_comm_broadcast_async(cddp_comm *c, void *buf, int64_t count,
                                          cddp_comm_dtype dt, int root, double timeout_s,
                                          cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_BROADCAST, buf, buf, count, dt, 0, root, timeout_s), err);
}

cddp_comm_work *cddp_comm_allgather_async(cddp_comm *c, const void *send, void *recv, int64_t count,
                                          cddp_comm_dtype dt, double timeout_s, cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_ALLGATHER, send, recv, count, dt, 0, 0, timeout_s), err);
}

cddp_comm_work *cddp_comm_reduce_scatter_async(cddp_comm *c, const void *send, void *recv,
                                               int64_t count, cddp_comm_dtype dt, cddp_comm_op op,
                                               double timeout_s, cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_REDUCE_SCATTER, send, recv, count, dt, op, 0, timeout_s),
                              err);
}

cddp_comm_work *cddp_comm_call_async(cddp_comm *c, cddp_comm_fn fn, void *arg, cddp_error *err) {
    coll a = {.kind = K_CALL, .timeout_s = -1, .fn = fn, .arg = arg};
    return cddp__comm_enqueue(c, &a, err);
}

cddp_comm_work *cddp_comm_barrier_async(cddp_comm *c, double timeout_s, cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_BARRIER, NULL, NULL, 0, CDDP_COMM_F32, 0, 0, timeout_s),
                              err);
}

void cddp_comm_abort(cddp_comm *c, const char *reason) {
    if (c) cddp__comm_abort(c, reason);
}

/* ---- making a group ---------------------------------------------------------------------- */

/* Where rank 0's store listens: addr, or every interface when addr is this host's name resolving
 * to loopback here and the job spans several hosts (its launcher says so: srun's node count, or
 * fewer local ranks than ranks): Debian's /etc/hosts maps a host's own name to 127.0.1.1, and
 * the other hosts reach the name at its network address. */
static const char *listen_host(const cddp__launch *l, const char *addr) {
    bool several = l->slurm_nnodes > 1 || (l->local_world > 0 && l->local_world < l->world);
    if (!several || !cddp_net_own_name_loopback(addr)) return addr;
    cddp_log(CDDP_LOG_INFO, "comm",
             "%s is a loopback address on this host (/etc/hosts), and the job spans several "
             "hosts: rank 0's store listens on every interface",
             addr);
    return NULL;
}

/* Under cddprun, rank 0 starts the group's store on any free port and posts the port in the
 * launcher's store (CDDP_STORE_ADDR/PORT/TOKEN), where the other ranks read it. MASTER_PORT, a
 * port cddprun found free and released for programs that bind it themselves (PyTorch's), is not
 * used: between its release and rank 0's bind, any process that binds or connects could take
 * it. The key names the restart round, MASTER_PORT (a job started by hand from inside a worker
 * sets its own) and the group's number in this process (groups are created collectively, so
 * every rank counts the same). */
static int store_via_launcher(const cddp__launch *l, int rank, const char *addr, const char *token,
                              cddp_store_server **srv, int *port, cddp_store **kept,
                              cddp_error *err) {
    static _Atomic int groups;
    char key[96], text[16];
    snprintf(key, sizeof key, "comm/r%d/m%d/g%d/port", l->restart, l->master_port,
             atomic_fetch_add(&groups, 1));
    cddp_store_options lo = {l->store_addr[0] ? l->store_addr : addr, l->store_port, l->store_token,
                             0, NULL};
    cddp_store *launcher = cddp_store_connect(&lo, err);
    if (!launcher) return err ? err->code : CDDP_EIO;
    *kept = launcher; /* the caller's, until the group formed: cddprun posts ranks' exits there */
    int rc = CDDP_OK;
    if (rank == 0) {
        if (!(*srv = cddp_store_server_start(listen_host(l, addr), 0, token, err))) {
            rc = err ? err->code : CDDP_EIO;
        } else {
            *port = cddp_store_server_port(*srv);
            snprintf(text, sizeof text, "%d", *port);
            rc = cddp_store_set_str(launcher, key, text, err);
        }
    } else {
        void *v = NULL;
        size_t n = 0;
        rc = cddp_store_get(launcher, key, -1, &v, &n, err);
        if (rc == CDDP_OK) *port = atoi(v);
        cddp_free(v);
    }
    return rc;
}

/* Waits for key in the group's store, posted by rank r, up to CDDP_RDZV_TIMEOUT_S. Under cddprun
 * (launcher not NULL) a quarter second at a time, looking between for the notice cddprun posts
 * when it reaps a worker (comm/r<restart>/exited/<rank>): a rank that ended before it joined,
 * even with exit code 0, fails the wait at once, named, instead of at the timeout. */
static int await_rank(const cddp_comm *c, cddp_store *st, cddp_store *launcher, int restart, int r,
                      const char *key, cddp_error *err) {
    const char *k = key;
    if (!launcher) return cddp_store_wait(st, &k, 1, -1, err);
    char gone[64];
    snprintf(gone, sizeof gone, "comm/r%d/exited/%d", restart, r);
    double until = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    for (;;) {
        double left = until - cddp_now_s();
        int rc = cddp_store_wait(st, &k, 1, CDDP_MAX(CDDP_MIN(left, 0.25), 0.0), err);
        if (rc != CDDP_ETIMEDOUT || left <= 0.25) return rc;
        const char *g = gone;
        void *how = NULL;
        size_t n = 0;
        cddp_error e = {0};
        if (cddp_store_wait(launcher, &g, 1, 0, &e) != CDDP_OK ||
            cddp_store_get(launcher, gone, 0, &how, &n, &e) != CDDP_OK)
            continue;
        rc = cddp_error_set(err, CDDP_ESTATE,
                            "rank %d %s before it joined the group that rank %d and the others "
                            "are forming: every rank must create it (cddp_comm_create, which DDP "
                            "and the programs call at their start) before it ends. Did rank %d "
                            "find nothing to do (no data of its own, a condition on its rank)?",
                            r, (char *)how, c->rank, r);
        cddp_free(how);
        return rc;
    }
}

/* The hosts' leaders (each host's lowest rank), from every rank's host identity. */
static int find_leaders(cddp_comm *c, const char *const *hosts, cddp_error *err) {
    if (!(c->leaders = cddp_calloc((size_t)c->world, sizeof(int))))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    c->leader_index = -1;
    for (int r = 0; r < c->world; r++) {
        int first = 0;
        while (strcmp(hosts[first], hosts[r]) != 0) first++;
        if (r == c->rank) c->host_leader = first;
        if (first != r) continue;
        if (r == c->rank) c->leader_index = c->nleaders;
        c->leaders[c->nleaders++] = r;
    }
    return CDDP_OK;
}

/* A group of some of this group's ranks, on transport tr, meeting under its own keys. */
static int sub_group(cddp_comm *c, cddp_store *st, const cddp__transport *tr, int rank, int world,
                     const char *prefix, cddp_comm **out, cddp_error *err) {
    cddp_comm *g = cddp_calloc(1, sizeof *g);
    if (!g || cddp__comm_work_init(g) != CDDP_OK) {
        cddp_free(g);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    *out = g;
    g->tr = tr;
    g->rank = g->local_rank = rank;
    g->world = g->local_world = world;
    g->nhosts = 1;
    g->timeout = c->timeout;
    g->stall_warn = c->stall_warn;
    g->spin_s = c->spin_s;
    g->ring_chunk = c->ring_chunk;
    snprintf(g->key_prefix, sizeof g->key_prefix, "%s", prefix);
    return tr->setup(g, st, -1, err);
}

/* The shared-memory group of the ranks on this host, for the hierarchical allreduce. Its
 * rendezvous keys are named after the host's leader; its communication thread never starts
 * (the group's own thread runs its calls). */
static int setup_host_group(cddp_comm *c, cddp_store *st, cddp_error *err) {
    if (c->local_world == 1) return CDDP_OK;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "comm/h%d/", c->host_leader);
    return sub_group(c, st, &cddp__shm_transport, c->local_rank, c->local_world, prefix, &c->host,
                     err);
}

/* A rank whose rendezvous failed says so in the group's store (comm/failed/<rank>). Rank 0, whose
 * process holds the store, keeps it up to LINGER_S more for every other rank to fail or finish as
 * well: a setup that cannot work (a loopback address across hosts) is then explained by each
 * rank from the store's posts, not by the store's end under a rank still reading them. */
#define LINGER_S 5.0
static void linger_on_failure(const cddp_comm *c, cddp_store *st, bool holds_store) {
    char key[2][64];
    cddp_error e = {0};
    snprintf(key[0], sizeof key[0], "comm/failed/%d", c->rank);
    cddp_store_set_str(st, key[0], "1", &e);
    double until = cddp_now_s() + LINGER_S;
    for (int r = 1; holds_store && r < c->world; r++)
        for (bool ended = false; !ended && cddp_now_s() < until;) {
            snprintf(key[0], sizeof key[0], "comm/failed/%d", r);
            snprintf(key[1], sizeof key[1], "comm/done/%d", r);
            for (int k = 0; k < 2 && !ended; k++) {
                const char *kk = key[k];
                ended = cddp_store_wait(st, &kk, 1, 0, &e) == CDDP_OK;
            }
            if (!ended) nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        }
}

/* Says once, on rank 0, what the group runs on and why, and who started it. */
static void log_backend(const cddp_comm *c, const cddp__launch *l, const char *why) {
    if (c->rank != 0 || !cddp_log_enabled(CDDP_LOG_INFO)) return;
    char hosts[48] = "";
    if (c->world > 1)
        snprintf(hosts, sizeof hosts, " on %d host%s", c->nhosts, c->nhosts == 1 ? "" : "s");
    bool tell = l->why[0] && strcmp(l->why, why) != 0; /* how the launcher was recognised */
    cddp_log(CDDP_LOG_INFO, "comm", "%d rank%s%s: %s%s%s%s; started by %s%s%s%s", c->world,
             c->world == 1 ? "" : "s", hosts, c->tr->says, *why ? " (" : "", why, *why ? ")" : "",
             l->by[0]
                 ? l->by
                 : "no launcher (none of RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID is "
                   "set)",
             tell ? " (" : "", tell ? l->why : "", tell ? ")" : "");
}

/* How long a wait spins before it sleeps (CDDP_SPIN_US). Waking a sleeping rank costs tens to
 * hundreds of microseconds, and in training a peer often arrives a few milliseconds late, so a
 * rank that has a core of its own spins up to 20 ms (bench_mlp on 2 ranks: +12 % over 200 us;
 * the p99 of a 4-64 KiB allreduce within 1.5x of its median). Past 20 us every spin round
 * yields the core, and a wait stops spinning the first time another thread took it
 * (cddp__comm_spin): on a busy machine a rank sleeps as soon as something else wants its core.
 * Ranks sharing cores spin 20 us, not to take time from the rank they wait for. */
static double spin_seconds(const cddp_comm *c) {
    const char *knob = cddp_knob_str(CDDP_KNOB_SPIN_US);
    if (strcmp(knob, "auto") != 0) {
        int64_t us = 0;
        cddp_error e = {0};
        if (cddp_parse_int("CDDP_SPIN_US", knob, 0, 1000000, &us, &e) == CDDP_OK) return 1e-6 * us;
        cddp_log(CDDP_LOG_ERROR, "comm", "%s (or auto); using auto", e.msg);
    }
    return cddp_comm_local_cores(c) >= 1 ? 20e-3 : 20e-6;
}

/* More than one rank on this host and no thread count chosen: as many threads for the math
 * libraries as this rank has CPUs of its own when a launcher bound each rank to CPUs no other
 * rank on the host may run on (cddprun --bind_core, srun's binding with --cpus-per-task, mpirun's
 * --map-by ...:PE=N), else one, as cddprun gives its workers, so that the ranks do not each start
 * a pool as large as the host. Said once, on rank 0. */
static void choose_threads(const cddp_comm *c) {
    if (c->local_world < 2 || getenv("OPENBLAS_NUM_THREADS") || getenv("GOTO_NUM_THREADS") ||
        getenv("OMP_NUM_THREADS"))
        return;
    bool own = c->cpu_sharers == 1;
    int n = own ? c->own_cpus : 1;
    cddp_set_num_threads(n);
    if (c->rank != 0) return;
    if (own)
        cddp_log(CDDP_LOG_INFO, "comm",
                 "%d ranks on this host, each bound to CPUs of its own: setting OMP_NUM_THREADS "
                 "and OPENBLAS_NUM_THREADS (unset here) to each rank's count of CPUs (%d on rank "
                 "0); set them to tune",
                 c->local_world, n);
    else
        cddp_log(CDDP_LOG_INFO, "comm",
                 "%d ranks share this host: setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 "
                 "(unset here) so that they do not oversubscribe the cores; set them to tune%s",
                 c->local_world,
                 c->own_cpus >= 2 * c->local_world
                     ? ", or bind each rank to CPUs of its own (cddprun --bind_core; srun "
                       "--cpus-per-task=N), which gives it a thread for each"
                     : "");
}

/* The MPI backend: CDDP_BACKEND=mpi, or auto under an MPI launcher when MPI is built in (and
 * the options do not describe a group of their own). CDDP_EINVAL/EUNSUPPORTED when asked for
 * something that cannot be. */
static int want_mpi(const cddp__launch *l, const cddp_comm_options *o, bool *mpi, char *why,
                    size_t n, cddp_error *err) {
    const char *want = cddp_knob_str(CDDP_KNOB_BACKEND);
    if (strcmp(want, "auto") && strcmp(want, "shm") && strcmp(want, "mpi"))
        return cddp_error_set(err, CDDP_EINVAL, "CDDP_BACKEND=%s: expected auto, shm or mpi", want);
    *mpi = !strcmp(want, "mpi") ||
           (!strcmp(want, "auto") && l->mpi && cddp__mpi_available() && o->world_size <= 0);
    if (*mpi && !cddp__mpi_available())
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "CDDP_BACKEND=mpi, but this cddp was built without MPI (install "
                              "libopenmpi-dev and rebuild)");
    snprintf(why, n, "%s", !strcmp(want, "mpi") ? "CDDP_BACKEND=mpi" : l->why);
    return CDDP_OK;
}

/* Who shares a host with whom: every rank posts its host identity and its CPU set, and reads
 * everyone's. Sets local_rank, local_world, nhosts, the hosts' leaders and the CPUs this rank
 * shares with the others on its host. */
static int group_hosts(cddp_comm *c, cddp_store *st, cddp_store *launcher, int restart,
                       cddp_error *err) {
    char me[256 + 2 * sizeof(cpu_set_t) + 2], key[64];
    cddp_host_id(me, 256);
    size_t len = strlen(me);
    me[len] = '\n';
    cddp__cpus_text(me + len + 1);
    snprintf(key, sizeof key, "comm/host/%d", c->rank);
    CDDP_TRY(cddp_store_set_str(st, key, me, err));
    me[len] = '\0';
    char **hosts = cddp_calloc((size_t)c->world, sizeof *hosts);
    cpu_set_t *sets = cddp_calloc((size_t)c->world, sizeof *sets);
    if (!hosts || !sets) {
        cddp_free(hosts);
        cddp_free(sets);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    int rc = CDDP_OK, local = 0, before = 0;
    for (int r = 0; r < c->world && rc == CDDP_OK; r++) {
        size_t n;
        snprintf(key, sizeof key, "comm/host/%d", r);
        if ((rc = await_rank(c, st, launcher, restart, r, key, err)) != CDDP_OK ||
            (rc = cddp_store_get(st, key, -1, (void **)&hosts[r], &n, err)) != CDDP_OK)
            break;
        char *cpus = strchr(hosts[r], '\n');
        if (cpus) *cpus++ = '\0';
        if (strcmp(hosts[r], me) == 0) {
            cddp__cpus_parse(cpus ? cpus : "", &sets[local]);
            local++;
            if (r < c->rank) before++;
        }
    }
    if (rc == CDDP_OK) rc = find_leaders(c, (const char *const *)hosts, err);
    if (rc == CDDP_OK) cddp__comm_set_cpus(c, sets, local, before);
    for (int r = 0; r < c->world; r++) cddp_free(hosts[r]);
    cddp_free(hosts);
    cddp_free(sets);
    c->local_rank = before;
    c->local_world = local;
    c->nhosts = c->nleaders;
    return rc;
}

/* The transports CDDP_TRANSPORT may name, between ranks that a store brought together. */
static const cddp__transport *const transports[] = {&cddp__shm_transport, &cddp__tcp_transport};

/* The transport: shared memory when every rank is on this host, else TCP (hierarchical when
 * some host has several ranks); CDDP_TRANSPORT forces one. Every rank reaches the same choice:
 * the host count is the same for all. */
static int connect_ranks(cddp_comm *c, cddp_store *st, char *why, size_t n, cddp_error *err) {
    const char *want = cddp_knob_str(CDDP_KNOB_TRANSPORT);
    const cddp__transport *tr = NULL;
    for (size_t i = 0; i < CDDP_ARRAY_LEN(transports) && !tr; i++)
        if (!strcmp(want, transports[i]->name)) tr = transports[i];
    if (!tr && strcmp(want, "auto"))
        return cddp_error_set(err, CDDP_EINVAL, "CDDP_TRANSPORT=%s: expected auto, shm or tcp",
                              want);
    if (tr && tr->one_host && c->local_world != c->world)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "CDDP_TRANSPORT=%s, but the group spans hosts (%d of %d ranks on "
                              "this one): unset it to use TCP between the hosts",
                              want, c->local_world, c->world);
    if (!tr) tr = c->local_world == c->world ? &cddp__shm_transport : &cddp__tcp_transport;
    c->tr = tr;
    double rdzv = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    CDDP_TRY(tr->setup(c, st, rdzv, err));
    bool forced = strcmp(want, "auto") != 0;
    if (tr->one_host) {
        snprintf(why, n, "%s", forced ? "CDDP_TRANSPORT=shm" : "every rank on this host");
        c->nleaders = 0; /* the allreduce is flat */
        return CDDP_OK;
    }
    /* Across hosts with several ranks on some, allreduce goes through each host's shared
     * memory (CDDP_TRANSPORT=tcp keeps everything on TCP). */
    if (!forced && c->nleaders > 1 && c->nleaders < c->world) {
        snprintf(why, n, "ranks on different hosts, allreduce hierarchical");
        CDDP_TRY(setup_host_group(c, st, err));
        if (c->rank == 0)
            cddp_log(CDDP_LOG_INFO, "comm",
                     "TCP between %d hosts; allreduce is hierarchical: shared memory among each "
                     "host's ranks (%d on rank 0's), a TCP ring between the hosts' leaders",
                     c->nleaders, c->local_world);
        return CDDP_OK;
    }
    if (forced)
        snprintf(why, n, "CDDP_TRANSPORT=%s", want);
    else
        snprintf(why, n, "ranks on different hosts");
    c->nleaders = 0;
    return CDDP_OK;
}

/* When rank 0's store found the port srun's job and step derive in use (cddp_net_in_use), says
 * why that can be and what to do instead of net.c's remedy (cddprun's flags). */
static void port_in_use(const cddp__launch *l, const cddp_comm_options *o, const char *addr,
                        int port, cddp_error *err) {
    if (!l->derived_port || o->master_port > 0 || !cddp_net_in_use(err)) return;
    cddp_error_set(err, CDDP_EIO,
                   "srun: port %d on %s, derived from job %d step %d (10000 + 10 x (job mod "
                   "2000) + step mod 10), is in use: by another program, or by a job whose id "
                   "differs by a multiple of 2000; export MASTER_PORT=<a free port> before srun",
                   port, addr, l->slurm_job, l->slurm_step);
}

/* Meets the other ranks at rank 0's store and connects to them. */
static int rendezvous(cddp_comm *c, const cddp__launch *l, const cddp_comm_options *opts,
                      const cddp_comm_options *o, char *why, size_t n, cddp_error *err) {
    const char *addr = o->master_addr ? o->master_addr : l->master_addr;
    if (!*addr) addr = "127.0.0.1";
    int port = o->master_port > 0 ? o->master_port : l->master_port;
    if (port <= 0 || port > 65535)
        return cddp_error_set(err, CDDP_EINVAL,
                              "MASTER_PORT is not set (or not a port): start the program with "
                              "cddprun, torchrun, mpirun or srun, or pass master_port");
    bool derived = (l->derived_addr && !o->master_addr) || (l->derived_port && o->master_port <= 0);
    if (derived && c->rank == 0)
        cddp_log(CDDP_LOG_INFO, "comm", "srun: meeting at %s (%s; %s)",
                 CDDP_NET_ENDPOINT(addr, port),
                 l->derived_addr && !o->master_addr ? "the step's first host; MASTER_ADDR "
                                                      "chooses another"
                                                    : "MASTER_ADDR",
                 l->derived_port && o->master_port <= 0
                     ? "the port derived from the job and step; MASTER_PORT chooses another"
                     : "MASTER_PORT");
    const char *token = o->token            ? o->token
                        : l->store_token    ? l->store_token
                        : l->slurm_token[0] ? l->slurm_token
                                            : "cddp";
    bool whole_job =
        !opts || (opts->world_size <= 0 && !opts->master_addr && opts->master_port <= 0);
    cddp_store_server *srv = NULL;
    cddp_store *st = NULL, *launcher = NULL;
    int rc = CDDP_OK;
    if (whole_job && l->store_port > 0)
        CDDP_TRY_GOTO(store_via_launcher(l, c->rank, addr, token, &srv, &port, &launcher, err),
                      out);
    else if (c->rank == 0 &&
             !(srv = cddp_store_server_start(listen_host(l, addr), port, token, err))) {
        rc = err ? err->code : CDDP_EIO;
        port_in_use(l, o, addr, port, err);
        goto out;
    }
    cddp_store_options so = {addr, port, token, 0, NULL};
    if (!(st = cddp_store_connect(&so, err))) {
        rc = err ? err->code : CDDP_EIO;
        goto out;
    }
    CDDP_TRY_GOTO(group_hosts(c, st, launcher, l->restart, err), out);
    c->spin_s = spin_seconds(c);
    c->token = token;
    CDDP_TRY_GOTO(connect_ranks(c, st, why, n, err), out);
    /* Rank 0's store may go once everyone has left the rendezvous. */
    char key[64];
    snprintf(key, sizeof key, "comm/done/%d", c->rank);
    CDDP_TRY_GOTO(cddp_store_set_str(st, key, "1", err), out);
    for (int r = 1; r < c->world && c->rank == 0; r++) {
        snprintf(key, sizeof key, "comm/done/%d", r);
        const char *k = key;
        CDDP_TRY_GOTO(cddp_store_wait(st, &k, 1, -1, err), out);
    }
out:
    if (rc != CDDP_OK && st) linger_on_failure(c, st, srv != NULL);
    c->token = NULL;
    cddp_store_close(st);
    cddp_store_close(launcher);
    cddp_store_server_stop(srv);
    return rc;
}

cddp_comm *cddp_comm_create(const cddp_comm_options *opts, cddp_error *err) {
    cddp_comm_options o = opts ? *opts : (cddp_comm_options){0};
    cddp__launch l;
    char why[160] = "";
    bool mpi = false;
    cddp_comm *c = cddp_calloc(1, sizeof *c);
    if (!c || cddp__comm_work_init(c) != CDDP_OK) {
        cddp_free(c);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    int rc = cddp__launch_read(&l, err);
    snprintf(c->started_by, sizeof c->started_by, "%s", l.by);
    if (rc == CDDP_OK) rc = want_mpi(&l, &o, &mpi, why, sizeof why, err);
    if (rc != CDDP_OK) goto out;
    c->timeout = o.timeout_s > 0 ? o.timeout_s : (double)cddp_knob_int(CDDP_KNOB_TIMEOUT_S);
    c->stall_warn = (double)cddp_knob_int(CDDP_KNOB_STALL_WARN_S);
    c->local_world = c->nhosts = 1;
    c->ring_chunk = (size_t)CDDP_MAX(cddp_knob_int(CDDP_KNOB_TCP_CHUNK_KB), 4) << 10;
    const char *algo = cddp_knob_str(CDDP_KNOB_COMM_ALGORITHM);
    if (strcmp(algo, "auto") && strcmp(algo, "ring")) {
        rc =
            cddp_error_set(err, CDDP_EINVAL, "CDDP_COMM_ALGORITHM=%s: expected auto or ring", algo);
        goto out;
    }
    c->ring_only = !strcmp(algo, "ring");
    if (mpi) {
        c->tr = &cddp__mpi_transport;
        CDDP_TRY_GOTO(c->tr->setup(c, NULL, -1, err), out);
        cddp_log_set_rank(c->rank);
    } else {
        if (o.world_size <= 0) o.rank = l.rank, o.world_size = l.world;
        if (o.rank < 0 || o.rank >= o.world_size) {
            rc =
                cddp_error_set(err, CDDP_EINVAL, "rank %d is not in [0, %d)", o.rank, o.world_size);
            goto out;
        }
        c->rank = o.rank;
        c->world = o.world_size;
        c->tr = &cddp__self_transport;
        cddp_log_set_rank(c->rank);
        if (c->world > 1) CDDP_TRY_GOTO(rendezvous(c, &l, opts, &o, why, sizeof why, err), out);
    }
    log_backend(c, &l, why);
    cddp__flight_join(c);
    if (l.slurm_tasks_outside > 1 && c->world == 1)
        cddp_log(CDDP_LOG_WARN, "comm",
                 "SLURM_NTASKS=%d, but this process was not started by srun (SLURM_STEP_ID is "
                 "unset: a batch script?): it trains alone. Start the %d tasks with srun (or with "
                 "cddprun or mpirun)",
                 l.slurm_tasks_outside, l.slurm_tasks_outside);
    choose_threads(c);
out:
    if (rc != CDDP_OK) {
        cddp_comm_destroy(c);
        return NULL;
    }
    return c;
}

void cddp_comm_destroy(cddp_comm *c) {
    if (!c) return;
    /* An abort from another thread that this rank's calls already failed on may still be telling
     * the peers: it finishes first. */
    while (atomic_load(&c->aborting)) sched_yield();
    cddp__comm_work_fini(c);
    if (c->tr) c->tr->close(c);
    cddp_comm_destroy(c->host);
    cddp_free(c->leaders);
    cddp_aligned_free(c->scratch);
    cddp_free(c);
}
