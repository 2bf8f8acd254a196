/* cddp/ddp.h: DistributedDataParallel: one call wraps a model, and every backward then ends
 * with the gradients averaged (or summed) across the group.
 *
 *   cddp_comm *group = cddp_comm_create(NULL, &err);          // from cddprun's environment
 *   cddp_ddp *ddp = cddp_ddp_wrap(model, group, NULL, &err);  // the one added call
 *   ... the single-process loop, unchanged: forward, loss, zero_grad, backward, step ...
 *
 * Wrapping checks that every rank has the same parameters (count, names, shapes) and the same
 * options, failing on every rank with a message naming the rank and the value that differ, then
 * copies rank 0's parameters to everyone. From then on the parameters' ready hooks (autograd.h)
 * drive communication: the gradient block is cut into buckets, ranges of whole parameters in
 * reverse declaration order (the order backward produces them); a bucket closes once it holds
 * at least 1 MiB (the first) or bucket_cap_mb (the others), as in PyTorch. On the shared-memory
 * transport the gradient block is moved into memory from cddp_comm_alloc, so each bucket's
 * allreduce reads the peers' gradients in place. When every gradient of a bucket is ready, its
 * allreduce is queued on the group's communication thread, always in bucket order, while
 * backward goes on computing the earlier layers; when the host has no core to spare for that
 * thread (as many ranks as cores), the bucket is reduced right there on the training thread
 * instead (see cddp_ddp_overlap). cddp_backward returns once every bucket is reduced. After the
 * first step the buckets are rebuilt in the order rank 0's gradients actually became ready.
 *
 * A parameter that gets no gradient in a synchronised backward is an error naming it (on every
 * rank: the rank that saw it aborts the group with that message), unless find_unused_parameters
 * is set: then it counts as ready with this rank's current gradient as its contribution (zero
 * after zero_grad), and a parameter no rank used keeps its gradient untouched.
 *
 * Statistics: cddp_ddp_stats gives the last step's forward, backward, communication and wait
 * times; CDDP_DDP_STATS=1 prints them on rank 0 every CDDP_DDP_STATS_EVERY steps.
 * CDDP_TIMELINE=FILE writes a Chrome trace (forward, backward, each bucket's allreduce, the
 * optimizer step; one row per rank) that opens in Perfetto or chrome://tracing.
 *
 * Stragglers. Every CDDP_STRAGGLER_EVERY (50) synchronised steps the ranks compare how long each
 * was busy before the communication (the time between steps, forward, backward, the optimizer
 * step: one small allgather), and rank 0 names a rank busy more than CDDP_STRAGGLER_PCT (15)
 * percent longer than the median of the others, with the phase its time went to: "straggler:
 * rank 3 is 18 % slower than the median of the others over the last 50 steps: its data loading
 * (41.0 ms against 3.0 ms a step)". The stats below say the same. DDP also marks each phase in
 * the flight recorder (cddp/flight.h) and names each bucket's collective there.
 */
#ifndef CDDP_DDP_H
#define CDDP_DDP_H

#include "cddp/checkpoint.h"
#include "cddp/comm.h"
#include "cddp/dcomm.h"
#include "cddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How each bucket travels: as float32, or compressed to a 16-bit float for the allreduce (the
 * sum accumulates in float32; the mean is applied in float32 after decompression), or by PowerSGD
 * (PyTorch's powerSGD_hook; Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression",
 * 2019): from step powersgd_start_step on, each weight matrix's gradient M (n x m: a
 * convolution's kernels as rows of its output channels) travels as two thin matrices, P = M Q
 * (n x r) summed over the ranks and orthonormalised, then Q = M^T P (m x r) summed, and arrives as
 * P Q^T (divided by the ranks for the mean): r (n + m) floats instead of n m. What the
 * approximation leaves out of this rank's gradient is added to its next one (error feedback),
 * and each Q starts from the last (warm start). Vectors (biases, norms' weights) and matrices too
 * small to gain twice travel in float32 with the first sum. Every rank gets the same gradients;
 * they are not the plain mean, but training with them reaches about the same accuracy for far
 * fewer bytes. Before powersgd_start_step the
 * buckets are allreduced as without a hook. On host memory only (not with the nccl or ipc
 * transports), and not with shard_optimizer or join. */
typedef enum cddp_ddp_hook {
    CDDP_DDP_HOOK_NONE,
    CDDP_DDP_HOOK_BF16,
    CDDP_DDP_HOOK_FP16,
    CDDP_DDP_HOOK_POWERSGD,
} cddp_ddp_hook;

/* Where each bucket's allreduce runs while backward goes on. */
typedef enum cddp_ddp_overlap {
    CDDP_DDP_OVERLAP_AUTO,   /* CDDP_DDP_OVERLAP, whose default picks: thread when the group has
                                other ranks and every rank on this host can have a core for each
                                of its two threads, else inline */
    CDDP_DDP_OVERLAP_THREAD, /* queued on the group's communication thread, overlapping the
                                layers backward still computes (needs a core to run on) */
    CDDP_DDP_OVERLAP_INLINE, /* run on the training thread as soon as the bucket is ready: no
                                overlap, but no thread switches and no second thread competing
                                for a core that the ranks' training threads already fill */
} cddp_ddp_overlap;

/* A communication hook of your own (PyTorch's DistributedDataParallel.register_comm_hook): called
 * once per bucket in each synchronised step, once the bucket's gradients are all ready, with them
 * as one float32 array in host memory (grads: count elements, the gradients of the bucket's
 * parameters back to back in the bucket's order, cddp_ddp_bucket_params; bucket: its index) and
 * the group. It leaves in grads the gradients this rank's optimizer will step with, which must be
 * the same on every rank (for DDP's meaning, the mean over the ranks), and may use the group's
 * collectives for it, the blocking ones (it runs on the group's communication thread while
 * backward goes on, or inline on the training thread, as cddp_ddp_options.overlap says; every
 * rank calls it for the buckets in the same order). It returns CDDP_OK, or a failure with err
 * filled: this rank's backward then fails with it, and the group is aborted so that the other
 * ranks fail at once, naming this one and the reason. */
typedef int (*cddp_ddp_comm_hook_fn)(void *state, cddp_comm *group, int bucket, float *grads,
                                     int64_t count, cddp_error *err);

/* Zero-initialised options are PyTorch's defaults; see cddp_ddp_defaults. */
typedef struct cddp_ddp_options {
    double bucket_cap_mb;        /* 0: 25 (the first bucket closes at 1 MiB, as in PyTorch) */
    bool sum;                    /* sum the gradients instead of averaging (MindSpore's
                                    gradients_mean=False) */
    bool find_unused_parameters; /* allow parameters without a gradient in a backward */
    cddp_ddp_hook hook;
    /* Your own hook (above) instead of the allreduce, with its state (yours: DDP only passes it
     * on). On host memory (not the nccl or ipc transports); not with hook, sum, shard_optimizer or
     * join (wrapping fails saying so). */
    cddp_ddp_comm_hook_fn comm_hook;
    void *comm_hook_state;
    int powersgd_rank;           /* PowerSGD: r (0: 1, PyTorch's matrix_approximation_rank) */
    int64_t powersgd_start_step; /* PowerSGD: the first compressed step, counted from 1 at the
                                    wrap (0: 1001: 1000 plain steps first, PyTorch's
                                    start_powerSGD_iter); the steps before are plain allreduces */
    bool join;       /* uneven inputs: ranks may run out of batches at different steps (each
                        synchronised step then also reduces who is still training) */
    bool join_throw; /* with join: fail every rank when one runs out, instead of shadowing */
    bool no_broadcast_buffers; /* keep each rank's buffers (BatchNorm's running statistics);
                                  default: rank 0's go to every rank before each forward in
                                  training mode (PyTorch's broadcast_buffers=True) */
    double timeout_s;          /* deadline of each collective; 0: the group's */
    cddp_ddp_overlap overlap;  /* a rank's own choice: ranks may differ */
    /* ZeRO-1: each bucket is reduce-scattered instead of allreduced, so each rank receives the
     * averaged gradients of its part of every bucket (its shard: about 1/N of the parameters,
     * any N, the parts of a bucket differ by at most one element per rank); its optimizer keeps
     * state and updates parameters for that shard only (cddp_model_set_shard: the optimizer
     * follows at its next step), and after each optimizer step the updated parts are allgathered
     * so that every rank again holds every parameter. Outside its shard a rank's gradients are
     * its own, not reduced (and set to zero by the forward of a micro-step that accumulates over
     * synchronised backwards: they were reduced already). cddp_clip_grad_norm adds the shards'
     * squares across the ranks; cddp_ddp_save gathers the optimizer state into one file,
     * cddp_ddp_save_set writes each rank's shard as it is, and cddp_ddp_load reads each rank's
     * shard from either, so a checkpoint loads on any number of ranks, with or without this option.
     * Works with sum, no_sync, find_unused_parameters and the bf16/fp16 hooks (16-bit copies
     * reduce-scattered, each rank's part unpacked in float32; on host memory: not with the nccl or
     * ipc transports); not with the powersgd hook or join (wrapping fails saying so). */
    bool shard_optimizer;
    /* ZeRO-2 (shard_optimizer's sharding, and more): a rank keeps the gradients of its shard only.
     * As each bucket's reduce-scatter ends (during backward, on the thread that ran it), the
     * bucket's gradients outside this rank's part are released (cddp_model_shard_gradients: on
     * the CPU their pages go back to the system and read as zero; cddp_model_zero_grad releases
     * them too, instead of writing zeros), so between steps a rank holds 1/N of the gradients,
     * and during backward its shard plus the buckets not yet reduced. The reduction is
     * shard_optimizer's, bit for bit: the same losses and weights. Gradient accumulation: with
     * cddp_ddp_no_sync, the micro-steps' local gradients are kept whole until the synchronised
     * backward (as PyTorch FSDP's no_sync: the least communication, and DDP's memory
     * meanwhile); without it, each micro-step's backward reduce-scatters and the shard adds the
     * results up (the memory of ZeRO-2 throughout, a reduce-scatter a micro-step; the sum of
     * the means in another order than DDP's mean of the sums: equal to rounding). On a device
     * (the emulated one, a GPU) the gradients outside the shard are set to zero instead: the
     * same training, the device's memory not yet given back. Sets shard_optimizer; the same
     * combinations. */
    bool shard_gradients;
    /* How the gradients of a model on a device (not the CPU) are reduced, by cddp/dcomm.h's
     * names:
     *  - "nccl": with NCCL on the model's device, each bucket queued on its stream after
     *    backward's kernels: each rank on a GPU of its own (NCCL refuses two ranks on one). With
     *    shard_optimizer the buckets are reduce-scattered and the parameters allgathered by NCCL
     *    too; with the bf16/fp16 hooks the gradients are rounded on the device and summed by NCCL
     *    in 16 bits.
     *  - "ipc": through CUDA IPC: every rank on one host, each bucket's sums read by each rank
     *    from the others' GPU memory on a stream of its own, while backward computes (no copy to
     *    the host; ranks sharing a GPU too). The emulated device shares its memory alike. Not
     *    with the bf16/fp16 hooks (float32 only), nor on the CPU.
     *  - "host": each bucket copied to page-locked host memory as it is ready, reduced by the
     *    group's transport (shared memory, TCP, MPI: any job), copied back.
     *  - NULL or "auto" (default): CDDP_DDP_TRANSPORT (auto, host, ipc or nccl), whose auto is
     *    cddp_dcomm_choose's: NCCL where every rank has a GPU of its own and NCCL opens on every
     *    rank, else host. Rank 0 logs what was chosen and why.
     * Every rank passes the same; a transport that cannot serve the job fails the wrap saying
     * why. */
    const char *transport;
} cddp_ddp_options;

typedef struct cddp_ddp cddp_ddp;

/* Wraps a built model. Collective: every rank calls it with its model; the group and the model
 * must outlive the wrapper. NULL with err set (the same message on every rank) on failure. */
CDDP_API cddp_ddp *cddp_ddp_wrap(cddp_model *m, cddp_comm *group, const cddp_ddp_options *opts,
                                 cddp_error *err);
/* Unhooks the model and frees the wrapper (waits for nothing still queued: call it after the
 * last backward returned). Accepts NULL. */
CDDP_API void cddp_ddp_destroy(cddp_ddp *ddp);

CDDP_API cddp_model *cddp_ddp_model(const cddp_ddp *ddp);
CDDP_API cddp_comm *cddp_ddp_group(const cddp_ddp *ddp);
CDDP_API int cddp_ddp_rank(const cddp_ddp *ddp);
CDDP_API int cddp_ddp_world_size(const cddp_ddp *ddp);
CDDP_API int cddp_ddp_local_rank(const cddp_ddp *ddp);

/* Gradient accumulation: while on, backward only accumulates local gradients (no
 * communication); the first backward after turning it off reduces the accumulated sum. */
CDDP_API void cddp_ddp_no_sync(cddp_ddp *ddp, bool on);

/* Uneven inputs (needs the join option). Call when this rank has no more batches: it then shadows
 * the other ranks' gradient allreduces (contributing zeros) until every rank has joined, and
 * finally every rank takes the parameters of the rank that trained longest, so the models agree.
 * With join_throw, every rank's next synchronised backward fails instead, naming the rank that ran
 * out. Every rank must call it once after its last step. */
CDDP_API int cddp_ddp_join(cddp_ddp *ddp, cddp_error *err);

/* The group's barrier, with the wrapper's deadline. */
CDDP_API int cddp_ddp_barrier(cddp_ddp *ddp, cddp_error *err);

/* printf on rank 0 only (the seeds' "print on the main process"); returns what printf did, or 0
 * on other ranks. */
CDDP_API int cddp_ddp_print0(const cddp_ddp *ddp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Rank 0 writes the checkpoint (the model's own parameter names: no "module." prefix) and every
 * rank returns its status. Collective. With shard_optimizer, the ranks first gather the whole
 * optimizer state (for the time of the save every rank holds all of it, as without the option),
 * so the file is the same as DDP's. */
CDDP_API int cddp_ddp_save(cddp_ddp *ddp, const char *path, cddp_optim *opt,
                           const char *const *metadata, cddp_error *err);
/* Saves a checkpoint set ROOT/step-<step> (cddp/checkpoint.h): every rank writes its own shard at
 * the same time (with shard_optimizer its ZeRO shard, so no rank gathers the whole state;
 * otherwise an even share of the flat block), then rank 0 commits the manifest (with metadata)
 * and keeps the newest keep sets of ROOT (0: all). Collective; fails on every rank if any rank
 * failed, and then ROOT's newest complete set is the one before. */
CDDP_API int cddp_ddp_save_set(cddp_ddp *ddp, const char *root, int64_t step, int keep,
                               cddp_optim *opt, const char *const *metadata, cddp_error *err);
/* Every rank loads the checkpoint (see cddp_checkpoint_load); fails on every rank if any rank
 * failed. Collective. path may be a file, a set or a folder of sets (its newest complete set),
 * saved by any number of ranks, with or without shard_optimizer. Each rank reads the parameters
 * and, with shard_optimizer, the optimizer state of its own shard alone, and checks the CRC-32 of
 * every range it reads. From a folder of sets, a set that fails its checks on any rank gives way
 * to the newest complete set before it, on every rank, and the log says so; cddp_ddp_load_from
 * says which set it loaded. */
CDDP_API int cddp_ddp_load(cddp_ddp *ddp, const char *path, cddp_optim *opt,
                           cddp_safetensors **file, cddp_error *err);
/* cddp_ddp_load, the path of what it loaded (a file, or a set of the folder) into loaded (cap
 * bytes). */
CDDP_API int cddp_ddp_load_from(cddp_ddp *ddp, const char *path, cddp_optim *opt,
                                cddp_safetensors **file, char *loaded, size_t cap, cddp_error *err);

/* The last synchronised step, in seconds. forward: from cddp_model_forward to backward (0 for
 * models with a hand-written forward); backward: the tape walk (inline: including the
 * allreduces run inside it); comm: the buckets' allreduces, summed; wait: after the walk, until
 * the last bucket was reduced; overlap: the share of comm hidden behind the walk, 1 - wait /
 * comm (0 inline, where nothing is hidden). */
typedef struct cddp_ddp_stats {
    int64_t steps; /* synchronised backwards so far */
    double forward_s, backward_s, comm_s, wait_s, overlap;
    int buckets;
    size_t bytes;       /* gradient bytes reduced per step (0 on one rank: nothing to reduce;
                           with a comm_hook, those handed to it: what it sends is its own) */
    bool comm_inline;   /* the buckets ran on the training thread (CDDP_DDP_OVERLAP_INLINE) */
    double allgather_s; /* shard_optimizer: the parameters' allgather after the last step */
    /* Straggler attribution (every CDDP_STRAGGLER_EVERY steps, on every rank alike): the step of
     * the last comparison (0: none yet), the rank busiest before the communication then and by
     * how much (percent over the median of the others), and, when that is over
     * CDDP_STRAGGLER_PCT, the straggler (-1: none), the phase its time went to ("forward", ...)
     * and that phase's mean time a step, its own and the median of the others'. */
    int64_t compared_at;
    int slowest, straggler;
    double slowest_pct;
    const char *straggler_phase;
    double straggler_phase_s, median_phase_s;
} cddp_ddp_stats;
CDDP_API cddp_ddp_stats cddp_ddp_stats_get(const cddp_ddp *ddp);

/* What a rank holds for training, in bytes: the ZeRO stage (0: plain DDP, 1: shard_optimizer, 2:
 * shard_gradients); the parameters (every stage so far: all of them); the gradients it keeps
 * between steps (all of them, or under ZeRO-2 its shard's: on the CPU, where the rest is given
 * back; on a device all of them, the rest zeroed); the optimizer's state (opt's, its shard's under
 * ZeRO-1 and 2; opt NULL: 0); and the process's peak resident memory so far (the system's count:
 * what the CPU device's blocks, the activations and everything else took at most; 0 where the
 * system does not say). */
typedef struct cddp_ddp_memory {
    int stage;
    size_t params, grads, optimizer, peak_rss;
} cddp_ddp_memory;
CDDP_API cddp_ddp_memory cddp_ddp_memory_get(const cddp_ddp *ddp, const cddp_optim *opt);

/* The buckets, for tools and tests: how many, and bucket b's parameter indices in launch order
 * (returns the count; fills up to cap). */
CDDP_API int cddp_ddp_num_buckets(const cddp_ddp *ddp);
CDDP_API int cddp_ddp_bucket_params(const cddp_ddp *ddp, int b, int *params, int cap);

#ifdef __cplusplus
}
#endif
#endif
