/* cddp/core.h: status codes, error messages, logging, allocation, the step arena and the
 * CDDP_* environment knobs.
 *
 * Everything in cddp reports failure the same way: a function returns a cddp_status (0 is
 * success, failures are negative) and writes a sentence into a cddp_error that says what failed,
 * on which rank, and what to do about it. Handles (contexts, models, optimizers) carry their own
 * cddp_error; free functions take a caller-owned one. Only programmer errors (a shape mismatch
 * while building a graph, a NULL where an object is required) abort, with file:line.
 *
 * The knobs are declared once, in CDDP_KNOB_LIST below, with their defaults and a sentence of
 * documentation; docs/LAUNCHER.md lists the same table (a test checks that they agree).
 */
#ifndef CDDP_CORE_H
#define CDDP_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CDDP_API __attribute__((visibility("default")))

/* Status codes: X(NAME, value, message). cddp_status_name() gives "CDDP_E<NAME>" style names. */
#define CDDP_STATUS_LIST(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EIO, -3, "input/output error")                                                               \
    X(EFORMAT, -4, "corrupt or unsupported file")                                                  \
    X(ESHAPE, -5, "shape, dtype or name mismatch")                                                 \
    X(ERANGE, -6, "value out of range")                                                            \
    X(ENOENT, -7, "no such file or key")                                                           \
    X(ETIMEDOUT, -8, "timed out")                                                                  \
    X(ESTATE, -9, "operation not valid in the current state")                                      \
    X(EUNSUPPORTED, -10, "not supported")

typedef enum cddp_status {
#define CDDP__STATUS_ENUM(name, value, msg) CDDP_##name = value,
    CDDP_STATUS_LIST(CDDP__STATUS_ENUM)
#undef CDDP__STATUS_ENUM
} cddp_status;

/* "CDDP_EINVAL" for CDDP_EINVAL; "CDDP_UNKNOWN" for a value not in the list. Never NULL. */
CDDP_API const char *cddp_status_name(int status);
/* The one-line meaning of a status ("invalid argument"). Never NULL. */
CDDP_API const char *cddp_status_str(int status);

/* An error: the status and a message that names what failed. Zero-initialise, or cddp_error_clear.
 */
#define CDDP_ERROR_MSG_MAX 512
typedef struct cddp_error {
    int code;
    char msg[CDDP_ERROR_MSG_MAX];
} cddp_error;

CDDP_API void cddp_error_clear(cddp_error *err);
/* Fills err (if not NULL) with code and a printf-formatted message; returns code. A message is
 * prefixed with "rank N: " when the process knows its rank (see cddp_log_set_rank). */
CDDP_API int cddp_error_set(cddp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The message, or the status meaning when no message was set. Never NULL. */
CDDP_API const char *cddp_error_msg(const cddp_error *err);

/* Logging. Lines look like "[cddp rank 1] W data: message" and go to stderr. The threshold
 * comes from CDDP_LOG_LEVEL (error, warn, info, debug); the rank from cddp_log_set_rank, or from
 * the RANK environment variable that launchers set. */
typedef enum cddp_log_level {
    CDDP_LOG_ERROR = 0,
    CDDP_LOG_WARN = 1,
    CDDP_LOG_INFO = 2,
    CDDP_LOG_DEBUG = 3,
} cddp_log_level;

CDDP_API void cddp_log_set_rank(int rank);
CDDP_API int cddp_log_rank(void); /* -1 when unknown */
CDDP_API bool cddp_log_enabled(cddp_log_level level);
CDDP_API void cddp_log(cddp_log_level level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Allocation. These never abort: NULL means out of memory and the caller reports CDDP_ENOMEM.
 * cddp_aligned_alloc returns 64-byte aligned memory (for parameter and gradient blocks) that
 * must be released with cddp_aligned_free. Both frees accept NULL. */
CDDP_API void *cddp_malloc(size_t bytes);
CDDP_API void *cddp_calloc(size_t count, size_t size);
CDDP_API void *cddp_realloc(void *ptr, size_t bytes);
CDDP_API void cddp_free(void *ptr);
CDDP_API void *cddp_aligned_alloc(size_t bytes);
CDDP_API void cddp_aligned_free(void *ptr);
CDDP_API char *cddp_strdup(const char *s);

/* 16-bit floats, n of them: bfloat16 (f16 false) or IEEE half (f16) to float32, and float32 to
 * them rounded to nearest even (NaNs stay NaNs, quiet; past half's range: infinity), on the bits,
 * the same on every machine: what DDP's compressed buckets, 16-bit checkpoints and NumPy arrays
 * and the CPU's conversions use. */
CDDP_API void cddp_half_to_f32(const uint16_t *src, float *dst, int64_t n, bool f16);
CDDP_API void cddp_half_from_f32(const float *src, uint16_t *dst, int64_t n, bool f16);

/* The step arena: bump allocation for a step's activations and tape, one reset per step.
 *
 * On the heap the arena reserves max_bytes of address space at once, which becomes memory only as
 * steps touch it (in 2 MiB pages where the kernel gives them), so a training loop allocates and
 * faults in nothing after its first step. Where that reservation is refused, and on a device's
 * memory, it grows in chunks as a step needs more, up to max_bytes, and after a reset that
 * followed a step needing several chunks keeps one chunk of the high-water size. Running past
 * max_bytes fails with a message that says how much was needed and how to raise the limit
 * (CDDP_ARENA_MB). */
typedef struct cddp_arena cddp_arena;

/* max_bytes 0 takes CDDP_ARENA_MB. Returns NULL when out of memory. */
CDDP_API cddp_arena *cddp_arena_create(size_t initial_bytes, size_t max_bytes);
/* Where an arena's chunks come from, when not the heap: a device's memory (cddp/device.h).
 * alloc returns 64-byte aligned memory or NULL; the arena never reads or writes it. reset (may be
 * NULL) is told of every chunk a reset releases. shared: more than one thread allocates (each
 * allocation then takes a lock). */
typedef struct cddp_arena_memory {
    void *(*alloc)(void *user, size_t bytes);
    void (*free)(void *user, void *p);
    void *user;
    bool shared;
    void (*reset)(void *user, void *p, size_t bytes);
} cddp_arena_memory;
/* cddp_arena_create over mem (NULL: the heap). */
CDDP_API cddp_arena *cddp_arena_create_on(size_t initial_bytes, size_t max_bytes,
                                          const cddp_arena_memory *mem);
CDDP_API void cddp_arena_destroy(cddp_arena *arena);
/* 64-byte aligned, uninitialised memory valid until the next reset. NULL on failure, with err
 * filled (CDDP_ENOMEM) if err is not NULL. */
CDDP_API void *cddp_arena_alloc(cddp_arena *arena, size_t bytes, cddp_error *err);
CDDP_API void cddp_arena_reset(cddp_arena *arena);
CDDP_API size_t cddp_arena_used(const cddp_arena *arena);
CDDP_API size_t cddp_arena_high_water(const cddp_arena *arena);

/* Environment knobs: X(ID, type, default, doc). type is INT or STR. Each knob is read from the
 * environment variable CDDP_<ID>. An INT knob whose variable is not a number in range logs an
 * error naming the variable and uses the default. */
#define CDDP_KNOB_LIST(X)                                                                          \
    X(LOG_LEVEL, STR, "info",                                                                      \
      "Log threshold: error, warn, info (what each group runs on, once) or debug.")                \
    X(ARENA_MB, INT, "4096",                                                                       \
      "Most memory, in MiB, that one step's arena may grow to (a GPU's: unset, all it has).")      \
    X(BLOCKED, INT, "1",                                                                           \
      "1: a ResNet keeps its activations in oneDNN's channel-blocked layout between layers "       \
      "(cddp_to_blocked); 0: plain NCHW everywhere, each convolution reordering its own.")         \
    X(EMU_DEVICES, INT, "2", "How many emulated devices (emu:0, emu:1, ...) a process has.")       \
    X(BF16_EMULATE, STR, "auto",                                                                   \
      "bf16 matrix products on a processor without AVX512-BF16 or AMX: auto, emulated "            \
      "(bf16-rounded operands multiplied in float32: the same numbers, slower than float32) "      \
      "with a one-line warning; 1: emulated without it; 0: refused.")                              \
    X(BF16_ACTIVATIONS, INT, "0",                                                                  \
      "1: in mixed precision (bf16) a ResNet keeps its activations in bf16 between its "           \
      "convolutions and batch normalisations (half their memory; cddp_to_dtype); 0: float32.")     \
    X(FLASH_ATTENTION, INT, "1",                                                                   \
      "1: attention runs by rows (flash attention: the (B,NH,T,T) weights never stored) where "    \
      "the device has kernels for it (CUDA in bf16, heads of 32 or 64); 0: it keeps the weights.") \
    X(EMU_MB, INT, "4096",                                                                         \
      "Memory, in MiB, of each emulated device (reserved, taken as it is touched).")               \
    X(DATA, STR, "/usr/share/datasets/fashion-mnist",                                              \
      "Folder with the (Fashion-)MNIST IDX files (Debian's dataset-fashion-mnist).")               \
    X(RDZV_TIMEOUT_S, INT, "300",                                                                  \
      "Seconds that rendezvous may take: store connections and waits, nodes arriving.")            \
    X(TIMEOUT_S, INT, "300", "Default deadline, in seconds, of every collective.")                 \
    X(STALL_WARN_S, INT, "60",                                                                     \
      "A collective that has waited this many seconds logs which ranks it waits for (0: never).")  \
    X(STORE_AUTH_TIMEOUT_S, INT, "10",                                                             \
      "Seconds a store connection may take to prove it has the job token before it is closed.")    \
    X(STORE_REPLY_S, INT, "5",                                                                     \
      "Seconds a store request may wait for its reply (beyond a wait's own time) before the "      \
      "store counts as gone: its host died or the network to it is cut.")                          \
    X(HEAD_SILENT_S, INT, "10",                                                                    \
      "Seconds a node that cddprun --hosts started goes without the head's heartbeat (sent every " \
      "second on its control stream) before it stops its workers and exits: the head's host or "   \
      "the network to it is gone.")                                                                \
    X(STORE_MAX_PENDING, INT, "256",                                                               \
      "Store connections that have not yet proved the job token, at most (the oldest goes "        \
      "first).")                                                                                   \
    X(SHM_CHUNK_KB, INT, "1024",                                                                   \
      "Per-rank shared-memory staging buffer, in KiB (the pipeline chunk).")                       \
    X(TRANSPORT, STR, "auto",                                                                      \
      "Between ranks: auto (shared memory on one host, TCP across hosts), shm or tcp.")            \
    X(HOST_ID, STR, "auto",                                                                        \
      "This host's identity for grouping ranks (auto: boot id and hostname).")                     \
    X(LOCAL_ADDR, STR, "auto",                                                                     \
      "Address the TCP transport listens on, or a network interface whose address it takes; "      \
      "cddprun sets it from --local_addr or the hostname (auto: CDDP_SOCKET_IFNAME's address "     \
      "when "                                                                                      \
      "set, else 127.0.0.1 when MASTER_ADDR is local, else the hostname).")                        \
    X(SOCKET_IFNAME, STR, "",                                                                      \
      "A network interface (eth0) whose address ranks and cddprun listen on and advertise, as "    \
      "NCCL_SOCKET_IFNAME: for nodes whose host names resolve where peers cannot reach; "          \
      "--local_addr wins.")                                                                        \
    X(SPIN_US, STR, "auto",                                                                        \
      "Microseconds a rank waiting for another spins before it sleeps (auto: 20000 when every "    \
      "rank on this host has a core of its own, else 20).")                                        \
    X(TCP_SMALL_KB, INT, "64",                                                                     \
      "TCP allreduces up to this size take the one-hop path (every rank sends to every other).")   \
    X(TCP_CHUNK_KB, INT, "256",                                                                    \
      "Ring allreduce pipeline chunk, in KiB (reduced while the next arrives).")                   \
    X(COMM_ALGORITHM, STR, "auto",                                                                 \
      "auto: each collective on its transport's fastest path; ring: every one through the "        \
      "transport's point to point (ring and linear algorithms), for testing a transport.")         \
    X(SHM_ZERO_COPY, INT, "1",                                                                     \
      "1: cddp_comm_alloc (DDP's gradients) returns shared memory that allreduce reads in place.") \
    X(BACKEND, STR, "auto",                                                                        \
      "Collectives backend: auto (MPI under mpirun, PMI_RANK or srun --mpi=pmix when built in, "   \
      "else cddp's own), shm or mpi.")                                                             \
    X(DDP_OVERLAP, STR, "auto",                                                                    \
      "Where DDP reduces gradient buckets: thread, inline, or auto (thread when there are other "  \
      "ranks and each rank on this host has two cores of its own, else inline).")                  \
    X(DDP_TRANSPORT, STR, "auto",                                                                  \
      "How DDP reduces the gradients of a model on a device where the program leaves it to cddp: " \
      "host, ipc, nccl, or auto (nccl when every rank has a GPU of its own and NCCL opens on "     \
      "every rank, else host).")                                                                   \
    X(DDP_STATS, INT, "0", "1: rank 0 prints DistributedDataParallel's step timings.")             \
    X(DDP_STATS_EVERY, INT, "100", "Steps between two CDDP_DDP_STATS lines.")                      \
    X(TIMELINE, STR, "off",                                                                        \
      "File for a Chrome-trace timeline of DDP steps, every rank in one file (Perfetto).")         \
    X(FLIGHT_EVENTS, INT, "4096",                                                                  \
      "Collectives and step marks the flight recorder keeps (0: off).")                            \
    X(FLIGHT_DIR, STR, "",                                                                         \
      "Folder for the flight record (rank-R.json), written when a group fails or stalls, on "      \
      "SIGUSR1 (default $TMPDIR or /tmp, then cddp-flight-RUN; cddprun: its --logdir's flight/).") \
    X(STRAGGLER_EVERY, INT, "50",                                                                  \
      "Steps over which DDP compares the ranks' step phases to name a straggler (0: never).")      \
    X(STRAGGLER_PCT, INT, "15",                                                                    \
      "How much slower than the median (percent of its busy time) names a rank a straggler.")

typedef enum cddp_knob {
#define CDDP__KNOB_ENUM(id, type, def, doc) CDDP_KNOB_##id,
    CDDP_KNOB_LIST(CDDP__KNOB_ENUM)
#undef CDDP__KNOB_ENUM
        CDDP_KNOB_COUNT
} cddp_knob;

CDDP_API const char *cddp_knob_name(cddp_knob knob);    /* "CDDP_ARENA_MB" */
CDDP_API const char *cddp_knob_default(cddp_knob knob); /* "4096" */
CDDP_API const char *cddp_knob_doc(cddp_knob knob);
/* The value from the environment when set and non-empty, else the default. */
CDDP_API const char *cddp_knob_str(cddp_knob knob);
CDDP_API long cddp_knob_int(cddp_knob knob);

/* Threads per process for the math libraries (OpenBLAS's matrix products): sets
 * OMP_NUM_THREADS and OPENBLAS_NUM_THREADS to n (at least 1) and resizes the running pool. A
 * group whose ranks share a host calls it with 1 when none of those variables is set (as cddprun
 * does for its workers), so that N ranks do not start N thread pools on the same cores; with the
 * count of the rank's CPUs when a launcher bound each rank to CPUs of its own. */
CDDP_API void cddp_set_num_threads(int n);
/* The threads OpenBLAS uses now. */
CDDP_API int cddp_num_threads(void);
/* The cores this process may run on: its CPU affinity (a launcher's binding), or the online CPUs
 * when that cannot be read. At least 1. */
CDDP_API int cddp_num_cores(void);

/* Seconds on the monotonic clock (for measuring intervals; the origin is arbitrary). */
CDDP_API double cddp_now_s(void);

/* The rank and world size a launcher left in the environment, looked up in this order:
 * RANK/WORLD_SIZE (cddprun, torchrun), OMPI_COMM_WORLD_RANK/SIZE (Open MPI's mpirun),
 * PMI_RANK/PMI_SIZE (MPICH, Intel MPI), SLURM_PROCID/SLURM_NTASKS (Slurm's srun: inside a step
 * only, when SLURM_STEP_ID is set; a batch script has them for the allocation).
 * CDDP_OK with both filled; CDDP_ENOENT (rank 0, world 1) when none is set; CDDP_EINVAL, with err
 * naming the variables, when a pair is malformed or the rank is not in [0, world). */
CDDP_API int cddp_env_rank_world(int *rank, int *world, cddp_error *err);

/* The value of environment variable name as a decimal in [0, 2^30): -2 when it is unset or
 * empty, -1 when it holds something else. */
CDDP_API long cddp_env_int(const char *name);

/* Numbers from text that a person or a file gave (options, the environment, checkpoint
 * metadata), checked once, the same way everywhere: the whole string is the number (no trailing
 * junk, no empty string), an integer parses without overflow and has no fraction, a real number
 * is finite, and the value lies in its range. Returns CDDP_OK, or CDDP_EINVAL with err saying
 * "<what> <text>: expected a whole number from <lo> to <hi>" (or "a finite number in [lo, hi]";
 * lo_open writes "(lo, hi]" and excludes lo). *out is set only on success. */
CDDP_API int cddp_parse_int(const char *what, const char *text, int64_t lo, int64_t hi,
                            int64_t *out, cddp_error *err);
CDDP_API int cddp_parse_double(const char *what, const char *text, double lo, double hi,
                               bool lo_open, double *out, cddp_error *err);

/* Writes a shape as "(2,3,4)" into buf (n bytes, always terminated) and returns buf. */
CDDP_API const char *cddp_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* cddp_error_set with a va_list. */
CDDP_API int cddp_error_vset(cddp_error *err, int code, const char *fmt, va_list ap);

/* Propagation in cddp's style: CDDP_TRY returns a failing status to the caller; CDDP_TRY_GOTO
 * records it in a local `rc` and jumps to the function's single cleanup label, so no function
 * needs nested cleanup. */
#define CDDP_TRY(expr)                                                                             \
    do {                                                                                           \
        int cddp__rc = (expr);                                                                     \
        if (cddp__rc != CDDP_OK) return cddp__rc;                                                  \
    } while (0)

#define CDDP_TRY_GOTO(expr, label)                                                                 \
    do {                                                                                           \
        rc = (expr);                                                                               \
        if (rc != CDDP_OK) goto label;                                                             \
    } while (0)

#define CDDP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CDDP_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define CDDP_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* Put before a function of plain loops (an op's kernel, an optimizer's update) to have it
 * compiled twice on x86-64 with GCC: for AVX2 + FMA (x86-64-v3) and for the baseline the library
 * is built for; the loader runs the one the machine supports. Empty elsewhere (and under
 * AddressSanitizer or ThreadSanitizer, whose instrumented code must not run before the runtime
 * starts, as a resolver run by the loader would). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CDDP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CDDP_SIMD_CLONES
#endif

/* Programmer errors: print file:line and the message, then abort. */
CDDP_API void cddp__panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
#define CDDP_PANIC(...) cddp__panic(__FILE__, __LINE__, __VA_ARGS__)
#define CDDP_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) cddp__panic(__FILE__, __LINE__, __VA_ARGS__);                                 \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
