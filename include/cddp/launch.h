/* cddp/launch.h: the contract between cddprun and its workers, spelled once.
 *
 * Every worker cddprun starts gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and cddp's own
 * below. A group reads them once (cddp_comm_create); a program may read them too, for example to
 * connect to the launcher's store with cddp_store_connect.
 */
#ifndef CDDP_LAUNCH_H
#define CDDP_LAUNCH_H

/* The launcher's store, where a cddp group's rank 0 posts the port of the group's own store. */
#define CDDP_ENV_STORE_ADDR  "CDDP_STORE_ADDR"
#define CDDP_ENV_STORE_PORT  "CDDP_STORE_PORT"
#define CDDP_ENV_STORE_TOKEN "CDDP_STORE_TOKEN"
/* The job's id, and how many times cddprun restarted the group (0 at first). */
#define CDDP_ENV_RUN_ID        "CDDP_RUN_ID"
#define CDDP_ENV_RESTART_COUNT "CDDP_RESTART_COUNT"
/* This node's address as the other nodes reach it (the TCP transport listens on it). */
#define CDDP_ENV_LOCAL_ADDR "CDDP_LOCAL_ADDR"

#include "cddp/core.h"

#include <stdbool.h>

/* A Slurm step as srun describes it to each of its tasks, and where such a step's tasks meet
 * when nothing else says: the step's first host, at port
 * 10000 + 10 (job mod 2000) + (step mod 10), the same for every task and different for the
 * consecutive steps of a job. */
typedef struct cddp_slurm_step {
    int job, step;        /* SLURM_JOB_ID, SLURM_STEP_ID */
    int task, ntasks;     /* SLURM_PROCID, SLURM_NTASKS */
    int node, nnodes;     /* SLURM_NODEID, SLURM_STEP_NUM_NODES (else SLURM_NNODES) */
    char first_host[256]; /* the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) */
    int port;             /* the derived port */
} cddp_slurm_step;

/* This host's identity, the same for every process on it: CDDP_HOST_ID when set, else the
 * kernel's boot id and the hostname. */
CDDP_API void cddp_host_id(char *out, size_t n);

/* Fills *s and returns true inside an srun step (SLURM_STEP_ID, SLURM_JOB_ID, SLURM_PROCID,
 * SLURM_NTASKS and a node list set); false elsewhere, a batch script included. */
CDDP_API bool cddp_slurm_step_read(cddp_slurm_step *s);

#endif
