/* bootstrap.c: what the launcher that started this process says about the job, read once.
 *
 * Launchers describe a job in environment variables, each in its own words:
 *
 *   cddprun     RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and its
 *               own store: CDDP_STORE_ADDR/PORT/TOKEN, CDDP_RESTART_COUNT
 *   torchrun    the same first six (TORCHELASTIC_RUN_ID tells it apart)
 *   mpirun      OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (Open MPI)
 *   PMI         PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS (MPICH, Intel MPI, srun --mpi)
 *   srun        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE,
 *               SLURM_NODEID, SLURM_STEP_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID
 *
 * They are looked at in this order (a cddprun started inside an srun step leaves its workers the
 * step's SLURM_* variables too: the innermost launcher wins). Rank and world come from
 * cddp_env_rank_world, the one place that reads them for every module.
 *
 * Under srun nothing names a rendezvous address. The group meets on the step's first host (unless
 * MASTER_ADDR names another) at port 10000 + 10 (SLURM_JOB_ID mod 2000) + (SLURM_STEP_ID mod 10)
 * (unless MASTER_PORT names another): every task computes the same, consecutive steps of a job
 * differ, and the port is below Linux's ephemeral range, where outgoing connections would take
 * it. Two jobs whose ids differ by a multiple of 2000 derive the same port: the second one's rank
 * 0 finds it in use and says to export MASTER_PORT. Its token
 * names the job and the step. Slurm's variables count only inside a step (SLURM_STEP_ID set): a
 * program started straight from a batch script is one process, and says so. A step of srun
 * --mpi=pmi2 (PMI_SIZE set, no PMIX_RANK) is taken as srun's, on cddp's own transport: Debian's
 * Open MPI speaks PMIx only. A step of srun --mpi=pmix (PMIX_RANK set) takes MPI when it is built
 * in, and otherwise meets as any srun step does.
 */
#include "cddp/launch.h"
#include "cddp/net.h"
#include "comm/internal.h"
#include "cddp/core.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A decimal in [0, 2^30) from the environment; -1 when unset or not one. */
static int env_int(const char *name) {
    long v = cddp_env_int(name);
    return v < 0 ? -1 : (int)v;
}

static const char *env_str(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* This node's task count from Slurm's SLURM_STEP_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of
 * the first three nodes, then 1) and SLURM_NODEID; -1 when they do not say. */
static int slurm_tasks_here(void) {
    const char *v = env_str("SLURM_STEP_TASKS_PER_NODE");
    if (!v) v = env_str("SLURM_TASKS_PER_NODE");
    int node = env_int("SLURM_NODEID");
    if (!v || node < 0) return -1;
    for (const char *p = v; *p;) {
        char *end;
        long n = strtol(p, &end, 10), reps = 1;
        if (end == p || n < 0) return -1;
        if (*end == '(') {
            if (end[1] != 'x') return -1;
            reps = strtol(end + 2, &end, 10);
            if (*end != ')' || reps < 1) return -1;
            end++;
        }
        if (node < reps) return (int)n;
        node -= (int)reps;
        if (*end == ',') end++;
        p = end;
    }
    return -1;
}

/* The first host of a Slurm host list: "node[03-05,9],login" gives "node03". */
static void first_host(const char *list, char *out, size_t n) {
    size_t len = strcspn(list, "[,");
    if (list[len] != '[') {
        snprintf(out, n, "%.*s", (int)len, list);
        return;
    }
    size_t digits = strspn(list + len + 1, "0123456789"); /* keeps the leading zeros */
    snprintf(out, n, "%.*s%.*s", (int)len, list, (int)digits, list + len + 1);
}

bool cddp_slurm_step_read(cddp_slurm_step *s) {
    *s = (cddp_slurm_step){.job = env_int("SLURM_JOB_ID"),
                           .step = env_int("SLURM_STEP_ID"),
                           .task = env_int("SLURM_PROCID"),
                           .ntasks = env_int("SLURM_NTASKS"),
                           .node = env_int("SLURM_NODEID"),
                           .nnodes = env_int("SLURM_STEP_NUM_NODES")};
    if (s->nnodes < 1) s->nnodes = env_int("SLURM_NNODES");
    const char *nodes = env_str("SLURM_STEP_NODELIST");
    if (!nodes) nodes = env_str("SLURM_JOB_NODELIST");
    if (s->job < 0 || s->step < 0 || s->task < 0 || s->ntasks < 1 || !nodes) return false;
    first_host(nodes, s->first_host, sizeof s->first_host);
    s->port = 10000 + 10 * (s->job % 2000) + s->step % 10;
    return true;
}

int cddp__launch_read(cddp__launch *l, cddp_error *err) {
    *l = (cddp__launch){.local_rank = -1, .local_world = -1};
    int rc = cddp_env_rank_world(&l->rank, &l->world, err);
    if (rc == CDDP_EINVAL) return rc;
    /* The launchers, innermost first: the variable that tells each, and where it puts the
     * local rank and size. */
    static const struct {
        const char *var, *by, *local_rank, *local_world;
        bool mpi;
    } launchers[] = {
        {"RANK", NULL, "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
        {"OMPI_COMM_WORLD_SIZE", "mpirun", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE", true},
        {"PMI_SIZE", "an MPI launcher", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", true},
        {"SLURM_NTASKS", "srun", "SLURM_LOCALID", NULL, false},
    };
    bool in_step = env_str("SLURM_STEP_ID") != NULL;
    if (!in_step) l->slurm_tasks_outside = CDDP_MAX(env_int("SLURM_NTASKS"), 0);
    for (size_t i = 0; rc == CDDP_OK && i < CDDP_ARRAY_LEN(launchers); i++) {
        if (!getenv(launchers[i].var)) continue;
        /* Slurm's variables describe this process's task only inside a step (srun): a batch
         * script has them too, for the allocation. */
        if (!strcmp(launchers[i].var, "SLURM_NTASKS") && !in_step) continue;
        /* srun --mpi=pmi2 sets PMI_SIZE too, but the Open MPI that cddp is built with (Debian's)
         * speaks PMIx only, and its MPI_Init would fail on every rank ("OMPI was not built with
         * SLURM's PMI support"): such a step is srun's, on cddp's own transport. */
        bool pmi2 = !strcmp(launchers[i].var, "PMI_SIZE") && in_step && !env_str("PMIX_RANK") &&
                    env_int("PMI_SIZE") == env_int("SLURM_NTASKS"); /* the step's own tasks */
        if (pmi2) {
            l->pmi2 = true;
            continue;
        }
        const char *by = launchers[i].by;
        if (!by) /* RANK: cddprun posts its store; torchrun names its run */
            by = env_str(CDDP_ENV_STORE_PORT)     ? "cddprun"
                 : env_str("TORCHELASTIC_RUN_ID") ? "torchrun"
                                                  : "a torchrun-style launcher";
        /* srun --mpi=pmix runs a PMIx server in slurmd (PMIX_RANK set): Open MPI's MPI_Init
         * finds it, so such a step takes the MPI backend when MPI is built in. */
        bool pmix = !strcmp(by, "srun") && env_str("PMIX_RANK");
        snprintf(l->by, sizeof l->by, "%s", by);
        snprintf(l->why, sizeof l->why, "%s set%s",
                 !strcmp(by, "cddprun") ? CDDP_ENV_STORE_PORT
                 : !strcmp(by, "srun")  ? "SLURM_PROCID"
                                        : launchers[i].var,
                 l->pmi2 ? "; --mpi=pmi2 is not for Open MPI"
                 : pmix  ? "; PMIX_RANK set: srun --mpi=pmix"
                         : "");
        l->mpi = launchers[i].mpi || pmix;
        l->local_rank = env_int(launchers[i].local_rank);
        l->local_world =
            launchers[i].local_world ? env_int(launchers[i].local_world) : slurm_tasks_here();
        break;
    }
    if (l->local_rank < 0 || l->local_world < 1 || l->local_rank >= l->local_world)
        l->local_rank = l->local_world = -1;

    /* Where rank 0's store is. */
    const char *addr = env_str("MASTER_ADDR");
    snprintf(l->master_addr, sizeof l->master_addr, "%s", addr ? addr : "");
    l->master_port = env_int("MASTER_PORT");
    cddp_slurm_step s;
    bool srun = !strcmp(l->by, "srun") && cddp_slurm_step_read(&s);
    l->slurm_job = srun ? s.job : -1;
    l->slurm_step = srun ? s.step : -1;
    l->slurm_nnodes = srun ? s.nnodes : 0;
    if (srun && !addr) {
        snprintf(l->master_addr, sizeof l->master_addr, "%s", s.first_host);
        l->derived_addr = true;
    }
    if (srun && l->master_port <= 0) {
        l->master_port = s.port;
        l->derived_port = true;
    }
    /* Under srun a job's tasks prove a token of their job and step, so that two jobs that meet
     * at one address (the same MASTER_PORT, or derived ports that collide) never mix. It keeps
     * out mistakes, not an attacker (job ids are no secret): CDDP_STORE_TOKEN gives a secret. */
    if (srun)
        snprintf(l->slurm_token, sizeof l->slurm_token, "cddp-slurm-job-%d-step-%d", s.job, s.step);
    /* cddprun's own store (its workers post rank 0's store there). */
    const char *sa = env_str(CDDP_ENV_STORE_ADDR);
    snprintf(l->store_addr, sizeof l->store_addr, "%s", sa ? sa : "");
    l->store_port = env_int(CDDP_ENV_STORE_PORT);
    l->store_token = env_str(CDDP_ENV_STORE_TOKEN);
    int restart = env_int(CDDP_ENV_RESTART_COUNT);
    l->restart = restart > 0 ? restart : 0;
    return CDDP_OK;
}

void cddp_host_id(char *out, size_t n) {
    const char *id = cddp_knob_str(CDDP_KNOB_HOST_ID);
    if (*id && strcmp(id, "auto") != 0) {
        snprintf(out, n, "%s", id);
        return;
    }
    char boot[128], host[128] = "";
    cddp_net_loopback_id(boot, sizeof boot); /* "BOOT/NETNS": the boot id, "?" when unread */
    boot[strcspn(boot, "/")] = '\0';
    if (!strcmp(boot, "?")) boot[0] = '\0';
    gethostname(host, sizeof host - 1);
    snprintf(out, n, "%s/%s", boot, host);
}
