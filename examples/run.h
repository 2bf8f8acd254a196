/* run.h: what the examples share around a training run: the output folder, the random state of
 * every rank in a checkpoint's metadata, and a progress line.
 *
 * This is the examples' code, not the library's.
 */
#ifndef CDDP_EXAMPLES_RUN_H
#define CDDP_EXAMPLES_RUN_H

#include <cddp/cddp.h>

#include <stdio.h>

/* mkdir -p path. */
int run_make_dirs(const char *path, cddp_error *err);

/* Whether a file can be written at path, found now rather than after training: a probe file next
 * to it, made and removed. CDDP_EIO with "<what> <path>: cannot write there: <why>". */
int run_check_writable(const char *what, const char *path, cddp_error *err);

/* Every rank's generator state gathered into metadata pairs "rng.<rank>" = 64 hex digits
 * (at most RUN_MAX_RNG ranks), appended to meta at *n; the strings live in keep. Collective:
 * every rank calls it. */
#define RUN_MAX_RNG 64
typedef struct run_rng_meta {
    char hex[RUN_MAX_RNG][72], key[RUN_MAX_RNG][16];
} run_rng_meta;
int run_rng_gather(cddp_comm *group, const cddp_rng *mine, run_rng_meta *keep, const char **meta,
                   int *n, cddp_error *err);
/* Restores this rank's generator from a checkpoint's "rng.<rank>" (none: rng unchanged, a rank
 * the run did not have); CDDP_EFORMAT, naming path and the key, when it is not a generator's
 * state. */
int run_rng_restore(const cddp_safetensors *f, const char *path, int rank, cddp_rng *rng,
                    cddp_error *err);

/* The job this process runs in, kept in each checkpoint's metadata as "run_id": the launcher's
 * CDDP_RUN_ID, else "slurm-" and Slurm's job id; "" outside both. */
const char *run_job_id(void);
/* Where a run that saves into out resumes from when it was not told to (*resume NULL;
 * collective: rank 0 looks, every rank gets the answer). When this start is a restart of its job
 * (cddprun's CDDP_RESTART_COUNT above 0, after a failure or with a node that came; or a Slurm job
 * requeued: SLURM_RESTART_COUNT) and out holds a checkpoint of this job (its run_id), its path
 * goes to buf (cap bytes), *resume points there, *init_from is set to NULL and rank 0 says so:
 * the restart continues where the job's last save was, not from the start. Otherwise, when out
 * holds another run's checkpoint, rank 0 says on stderr that this run replaces it at its first
 * save. */
int run_restart_from(cddp_comm *group, const char *prog, const char *out, char *buf, size_t cap,
                     const char **resume, const char **init_from, cddp_error *err);

/* What rank 0 says on stderr when a stop is asked for (cddp_stop_catch). */
#define RUN_STOP_SAY "stopping after this step, with a checkpoint (again to end now)\n"
/* cddp_stop_watch, first in main; where it cannot, "prog: why" on stderr, and the program runs on
 * as without it. */
void run_stop_watch(const char *prog);
/* Rank 0's line once the ranks stopped on signal sig after `after` (the loop's words: "step 12 of
 * epoch 0"): where --resume continues from (ckpt), or that nothing was saved (ckpt NULL); returns
 * the exit status, 128 + sig. */
int run_stopped(const cddp_ddp *ddp, int sig, const char *after, const char *ckpt);

/* An option's or a checkpoint's number, checked by cddp_parse_int/_double; false, after printing
 * "prog: <what> <text>: expected ..." on stderr, when it is not one. */
bool run_int(const char *prog, const char *what, const char *text, int64_t lo, int64_t hi,
             int64_t *out);
/* A checkpoint's integer metadata under key, checked: dflt when the key is absent, CDDP_EFORMAT
 * with err naming the file, the key and the range when it is not a number in [lo, hi]. */
int run_meta_int(const cddp_safetensors *f, const char *path, const char *key, int64_t lo,
                 int64_t hi, int64_t dflt, int64_t *out, cddp_error *err);
bool run_double(const char *prog, const char *what, const char *text, double lo, double hi,
                bool lo_open, double *out);
/* --device and --dtype: the rank's device (cddp_device_for_rank(device)) into *dev, and dtype,
 * "fp32" (or "float32") or "bf16" (or "bfloat16"), into *compute, checked against what the device
 * can multiply in; false, after printing "prog: --device <name>: <why>" or "prog: --dtype <name>:
 * <why>" on stderr, when either is not one or the device cannot. Logs on what the products run. */
bool run_device(const char *prog, const char *device, const char *dtype, cddp_device **dev,
                cddp_dtype *compute);
/* The help text of --transport, --nccl and --ipc. */
#define RUN_TRANSPORT_HELP                                                                         \
    "  --transport NAME    how the gradients of a model on a device are reduced: nccl\n"           \
    "                      (NCCL, a GPU for each rank), ipc (CUDA IPC, each rank reading\n"        \
    "                      the others' GPU memory: the ranks of one host, which may share a\n"     \
    "                      GPU), host (through host memory) or auto (default: nccl where\n"        \
    "                      each rank has a GPU of its own, else host; CDDP_DDP_TRANSPORT)\n"       \
    "  --nccl, --ipc       --transport nccl, --transport ipc\n"
/* --transport NAME (cddp_dcomm_transport_find) into *t; false, after printing "prog: --transport
 * <name>: <why>" on stderr, when it names none. */
bool run_transport(const char *prog, const char *text, const char **t);
/* The gradient hook --hook names (none, bf16, fp16, powersgd); -1 for any other name. */
int run_hook(const char *name);

/* A program's option (run_parse): --name, and --alias when not NULL, with kind:
 *   'i' an int64 in [lo, hi], 'n' an int in [lo, hi], 'f' a double in [lo, hi] and 'g' a float
 *       (lo excluded when lo_open), each checked (cddp_parse_int/_double's words);
 *   's' a string; 'b' a switch without a value (a bool set true); 'c' a switch that sets the
 *       string at to value; 't' a transport's name (run_transport); 'z' a ZeRO stage, --zero [N]
 *       into an int (run_zero);
 *   0   the program's own: run_parse calls its own(user, code, optarg, argc, argv), has_arg saying
 *       whether it takes a value (getopt's no_argument, required_argument, optional_argument).
 * given, when not NULL, is set once the option is on the command line. */
typedef struct run_opt {
    const char *name, *alias;
    char kind;
    void *at;
    double lo, hi;
    bool lo_open;
    int code, has_arg;
    bool *given;
    const char *value; /* 'c' */
} run_opt;
/* A table's rows: a number of kind 'i', 'n', 'f' or 'g'; a string; a switch; the program's own. */
#define RUN_NUM(name_, alias_, kind_, at_, lo_, hi_, lo_open_)                                     \
    {                                                                                              \
        .name = (name_), .alias = (alias_), .kind = (kind_), .at = (at_), .lo = (lo_),             \
        .hi = (hi_), .lo_open = (lo_open_)                                                         \
    }
#define RUN_STR(name_, alias_, at_)                                                                \
    { .name = (name_), .alias = (alias_), .kind = 's', .at = (at_) }
#define RUN_SWITCH(name_, alias_, at_)                                                             \
    { .name = (name_), .alias = (alias_), .kind = 'b', .at = (at_) }
/* --zero [N], --transport NAME, --nccl and --ipc into the ZeRO stage and the transport. */
#define RUN_ZERO_AND_TRANSPORT(zero_, transport_)                                                  \
    {.name = "zero", .kind = 'z', .at = (zero_)},                                                  \
        {.name = "transport", .kind = 't', .at = (transport_)},                                    \
        {.name = "nccl", .kind = 'c', .at = (transport_), .value = "nccl"}, {                      \
        .name = "ipc", .kind = 'c', .at = (transport_), .value = "ipc"                             \
    }
#define RUN_OWN(name_, alias_, code_, has_arg_)                                                    \
    { .name = (name_), .alias = (alias_), .code = (code_), .has_arg = (has_arg_) }
/* Parses argv by opts (n of them): --help prints usage on stdout and exits 0; an unknown option
 * says so and points at --help, a word that is no option is named, a bad value is said as
 * run_int/run_double say it, and own's false (it said why) fails too. 0, or -1. */
int run_parse(const char *prog, int argc, char **argv, const run_opt *opts, int n,
              bool (*own)(void *user, int code, const char *arg, int argc, char **argv), void *user,
              void (*usage)(FILE *out));

/* The run's group: one process on its own, or the ranks cddprun (or mpirun, srun) started; its
 * rank and size. CDDP_OK, or err's code. */
int run_group(cddp_comm **group, int *rank, int *world, cddp_error *err);
/* A program's exit status after its parts ran (rc: the first failure, said here as
 * "prog: why"; stopped: the status a stop asked for, or -1): 1 on a failure, the stop's, else 0. */
int run_exit(const char *prog, int rc, int stopped, const cddp_error *err);

/* The help text of --zero. */
#define RUN_ZERO_HELP                                                                              \
    "  --zero [N]          ZeRO stage: 1 shards the optimizer state across the ranks, 2 the\n"     \
    "                      gradients too (each rank keeps 1/N of them); 0 neither (default;\n"     \
    "                      --zero alone: 1)\n"
/* --zero's value (optarg, or the next word when it is a number: --zero 2 as well as --zero=2;
 * none: 1) into *stage; false, after printing "prog: --zero ..." on stderr, when it is not 0, 1
 * or 2. */
bool run_zero(const char *prog, const char *optarg_, int argc, char **argv, int *stage);
/* The DDP options of a ZeRO stage. */
void run_zero_options(int stage, cddp_ddp_options *o);
/* Every rank's line on stderr: what it holds for training (cddp_ddp_memory_get), "prog: rank R
 * holds parameters 18.4 MiB, gradients 9.2 MiB (ZeRO-2: its shard), optimizer state 18.4 MiB;
 * peak resident 301.0 MiB". */
void run_memory_line(const char *prog, const cddp_ddp *ddp, const cddp_optim *opt);
/* The same as JSON fields (no braces): "zero_stage": 2, "param_bytes": ..., "grad_bytes": .... */
int run_memory_json(char *buf, size_t cap, const cddp_ddp *ddp, const cddp_optim *opt);

#endif
