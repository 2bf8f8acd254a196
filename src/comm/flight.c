/* flight.c: the flight recorder (cddp/flight.h): a ring of the process's last collectives and
 * step marks, and its dump.
 *
 * One ring per process, under one lock: collectives come from the communication threads and the
 * callers of blocking calls, marks from the training thread. An entry is found again by its id
 * (the ring's slot is id % capacity, still its own while the id matches). The dump copies the
 * ring under the lock and writes it outside, to a temporary file renamed over the last dump, so a
 * reader never sees half a record. SIGUSR1's handler only counts it and writes a byte to a pipe;
 * a thread of the recorder's own reads what is there and answers it with one dump.
 */
#include "comm/internal.h"
#include "cddp/flight.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { T_CALL, T_MARK };
enum { S_QUEUED, S_STARTED, S_DONE, S_FAILED };

typedef struct entry {
    uint64_t id; /* 0: empty */
    uint8_t type, state;
    int16_t group;
    int32_t kind, op, dtype, root;
    int64_t count, step;
    uint64_t seq;
    double queued, started, ended;
    char label[88];
} entry;

/* Groups of collectives recorded beside a group's own (cddp_flight_group_open): what carries
 * them, and their sequence numbers. */
enum { OWN_GROUPS = 32 };
typedef struct own_group {
    int group; /* its number, from 1 */
    char device[24], transport[16];
    uint64_t seq;
} own_group;

static struct {
    pthread_mutex_t mu;
    entry *ring;
    size_t cap;
    uint64_t next; /* the last id given */
    int rank, world, groups;
    own_group own[OWN_GROUPS];
    int nown;
    bool joined, made; /* made: the ring was allocated (or is off), by the first entry or group */
    int pipe[2];
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .rank = -1};

const char *cddp__comm_kind_name(int kind) {
    static const char *const names[K_COUNT] = {[K_ALLREDUCE] = "allreduce",
                                               [K_BROADCAST] = "broadcast",
                                               [K_ALLGATHER] = "allgather",
                                               [K_BARRIER] = "barrier",
                                               [K_REDUCE_SCATTER] = "reduce_scatter",
                                               [K_GATHER] = "gather",
                                               [K_SCATTER] = "scatter",
                                               [K_ALLOC] = "alloc",
                                               [K_FREE] = "free",
                                               [K_CALL] = "call",
                                               [K_SEND] = "send",
                                               [K_RECV] = "recv"};
    return kind >= 0 && kind < K_COUNT ? names[kind] : "?";
}

static _Thread_local char next_label[sizeof((entry *)0)->label];

void cddp_flight_label(const char *label) {
    snprintf(next_label, sizeof next_label, "%s", label ? label : "");
}

/* The ring, under the lock: made by the first mark or group (a process without a group keeps
 * its marks too). */
static void make_ring(void) {
    F.made = true;
    long k = cddp_knob_int(CDDP_KNOB_FLIGHT_EVENTS);
    if (k > 0 && (F.ring = cddp_calloc((size_t)k, sizeof(entry)))) F.cap = (size_t)k;
}

/* A new entry, under the lock; NULL when the recorder is off. */
static entry *add(uint8_t type) {
    if (!F.made) make_ring();
    if (!F.ring) return NULL;
    uint64_t id = ++F.next;
    entry *e = &F.ring[id % F.cap];
    memset(e, 0, sizeof *e);
    e->id = id;
    e->type = type;
    return e;
}

static entry *find(uint64_t id) {
    entry *e = F.ring && id ? &F.ring[id % F.cap] : NULL;
    return e && e->id == id ? e : NULL;
}

void cddp_flight_mark(const char *phase, int64_t step) {
    double now = cddp_now_s();
    pthread_mutex_lock(&F.mu);
    entry *e = add(T_MARK);
    if (e) {
        snprintf(e->label, sizeof e->label, "%.63s", phase ? phase : "");
        e->step = step;
        e->started = now;
        e->state = S_DONE;
    }
    pthread_mutex_unlock(&F.mu);
}

uint64_t cddp__flight_call(const cddp_comm *c, const coll *a) {
    if (c->flight_group <= 0 || a->kind == K_CALL || a->kind == K_FREE) return 0;
    double now = cddp_now_s();
    pthread_mutex_lock(&F.mu);
    entry *e = add(T_CALL);
    uint64_t id = 0;
    if (e) {
        id = e->id;
        e->group = (int16_t)(c->flight_group - 1);
        e->kind = a->kind;
        e->op = (int32_t)a->op;
        e->dtype = (int32_t)a->dtype;
        e->root = a->root;
        e->count = a->count;
        e->state = S_QUEUED; /* until it starts (cddp__flight_started) */
        e->queued = now;
        memcpy(e->label, next_label, sizeof e->label);
    }
    pthread_mutex_unlock(&F.mu);
    next_label[0] = '\0';
    return id;
}

int cddp_flight_group_open(const char *device, const char *transport) {
    pthread_mutex_lock(&F.mu);
    if (!F.made) make_ring();
    int g = 0;
    if (F.ring) {
        g = ++F.groups;
        if (F.nown < OWN_GROUPS) {
            own_group *o = &F.own[F.nown++];
            *o = (own_group){.group = g};
            snprintf(o->device, sizeof o->device, "%s", device ? device : "");
            snprintf(o->transport, sizeof o->transport, "%s", transport ? transport : "");
        }
    }
    pthread_mutex_unlock(&F.mu);
    return g;
}

/* The group's record of its own, under the lock; NULL for a group's own calls. */
static own_group *own_of(int group) {
    for (int i = 0; i < F.nown; i++)
        if (F.own[i].group == group) return &F.own[i];
    return NULL;
}

uint64_t cddp_flight_issued(int group, const char *kind, cddp_comm_op op, cddp_comm_dtype dtype,
                            int64_t count) {
    if (group <= 0) return 0;
    int k = 0;
    while (k < K_COUNT && strcmp(cddp__comm_kind_name(k), kind ? kind : "")) k++;
    double now = cddp_now_s();
    pthread_mutex_lock(&F.mu);
    entry *e = k < K_COUNT ? add(T_CALL) : NULL;
    own_group *o = own_of(group);
    uint64_t id = 0;
    if (e) {
        id = e->id;
        e->group = (int16_t)(group - 1);
        e->kind = k;
        e->op = (int32_t)op;
        e->dtype = (int32_t)dtype;
        e->count = count;
        e->seq = o ? ++o->seq : 0;
        e->state = S_STARTED; /* handed to the device */
        e->queued = e->started = now;
        memcpy(e->label, next_label, sizeof e->label);
    }
    pthread_mutex_unlock(&F.mu);
    next_label[0] = '\0';
    return id;
}

void cddp__flight_started(uint64_t id, uint64_t seq) {
    if (!id) return;
    double now = cddp_now_s();
    pthread_mutex_lock(&F.mu);
    entry *e = find(id);
    if (e) {
        e->state = S_STARTED;
        e->started = now;
        e->seq = seq;
    }
    pthread_mutex_unlock(&F.mu);
}

void cddp_flight_ended(uint64_t id, int status) {
    if (!id) return;
    double now = cddp_now_s();
    pthread_mutex_lock(&F.mu);
    entry *e = find(id);
    if (e) {
        e->state = status == CDDP_OK ? S_DONE : S_FAILED;
        e->ended = now;
    }
    pthread_mutex_unlock(&F.mu);
}

/* ---- the dump ---------------------------------------------------------------------------- */

void cddp_flight_dir(char *out, size_t n) {
    const char *dir = cddp_knob_str(CDDP_KNOB_FLIGHT_DIR);
    if (*dir) {
        snprintf(out, n, "%s", dir);
        return;
    }
    /* The job's id: cddprun's, Slurm's, else mpirun's (PMIx's namespace) */
    const char *run = getenv("CDDP_RUN_ID"), *tmp = getenv("TMPDIR");
    if (!run || !*run) run = getenv("SLURM_JOB_ID");
    if (!run || !*run) run = getenv("PMIX_NAMESPACE");
    if (!tmp || !*tmp) tmp = "/tmp";
    if (run && *run)
        snprintf(out, n, "%s/cddp-flight-%s", tmp, run);
    else
        snprintf(out, n, "%s/cddp-flight-uid%u", tmp, (unsigned)getuid());
    size_t from = strlen(tmp) + 1; /* a namespace may hold a '/' */
    for (size_t k = from; k < n && k < strlen(out); k++)
        if (out[k] == '/') out[k] = '_';
}

static const char *state_name(int s) {
    return s == S_QUEUED ? "queued" : s == S_STARTED ? "started" : s == S_DONE ? "done" : "failed";
}

/* s as a JSON string's contents. */
static void put_string(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* e in JSON; own: what carries its group, when it is one of cddp_flight_group_open's. */
static void put_entry(FILE *f, const entry *e, const own_group *own) {
    if (e->type == T_MARK) {
        fprintf(f, "{\"id\": %" PRIu64 ", \"type\": \"mark\", \"phase\": \"", e->id);
        put_string(f, e->label);
        fprintf(f, "\", \"step\": %" PRId64 ", \"t\": %.6f}", e->step, e->started);
        return;
    }
    bool data = e->kind != K_BARRIER && e->kind != K_ALLOC;
    fprintf(f, "{\"id\": %" PRIu64 ", \"type\": \"collective\", \"group\": %d", e->id, e->group);
    if (e->started > 0) fprintf(f, ", \"seq\": %" PRIu64, e->seq); /* given at its start */
    fprintf(f, ", \"op\": \"%s\"", cddp__comm_kind_name(e->kind));
    if (e->kind == K_ALLREDUCE || e->kind == K_REDUCE_SCATTER)
        fprintf(f, ", \"reduce\": \"%s\"", cddp_comm_op_name((cddp_comm_op)e->op));
    if (data)
        fprintf(f, ", \"dtype\": \"%s\", \"count\": %" PRId64 ", \"bytes\": %" PRId64,
                cddp_comm_dtype_name((cddp_comm_dtype)e->dtype), e->count,
                e->count * (int64_t)cddp_comm_dtype_size((cddp_comm_dtype)e->dtype));
    if (e->kind == K_BROADCAST || e->kind == K_GATHER || e->kind == K_SCATTER)
        fprintf(f, ", \"root\": %d", e->root);
    if (e->kind == K_SEND || e->kind == K_RECV) fprintf(f, ", \"peer\": %d", e->root);
    if (own) {
        fprintf(f, ", \"device\": \"");
        put_string(f, own->device);
        fprintf(f, "\", \"transport\": \"");
        put_string(f, own->transport);
        fputc('"', f);
    }
    if (e->label[0]) {
        fprintf(f, ", \"label\": \"");
        put_string(f, e->label);
        fputc('"', f);
    }
    fprintf(f, ", \"state\": \"%s\", \"queued\": %.6f", state_name(e->state), e->queued);
    if (e->started > 0) fprintf(f, ", \"started\": %.6f", e->started);
    if (e->ended > 0) fprintf(f, ", \"ended\": %.6f", e->ended);
    fputc('}', f);
}

int cddp_flight_dump(const char *why, char *path, size_t n, cddp_error *err) {
    pthread_mutex_lock(&F.mu);
    size_t cap = F.cap;
    uint64_t last = F.next;
    int rank = F.rank, world = F.world ? F.world : 1; /* no group yet: a process of its own */
    entry *copy = cap ? cddp_malloc(cap * sizeof *copy) : NULL;
    if (copy) memcpy(copy, F.ring, cap * sizeof *copy);
    own_group own[OWN_GROUPS];
    int nown = F.nown;
    memcpy(own, F.own, sizeof own);
    pthread_mutex_unlock(&F.mu);
    if (cap && !copy) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    char dir[512], file[600], tmp[640];
    cddp_flight_dir(dir, sizeof dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        cddp_free(copy);
        return cddp_error_set(err, CDDP_EIO, "cannot make the flight record's folder %s: %s", dir,
                              strerror(e));
    }
    snprintf(file, sizeof file, "%s/rank-%d.json", dir, rank < 0 ? 0 : rank);
    static _Atomic unsigned dumps; /* two dumps at once (a failure, SIGUSR1) never share a file */
    snprintf(tmp, sizeof tmp, "%s.%d.%u.tmp", file, (int)getpid(), atomic_fetch_add(&dumps, 1));
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int e = errno;
        cddp_free(copy);
        return cddp_error_set(err, CDDP_EIO, "cannot write %s: %s", tmp, strerror(e));
    }
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    double now = cddp_now_s(), wall_s = (double)wall.tv_sec + wall.tv_nsec * 1e-9;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const char *run = getenv("CDDP_RUN_ID");
    fprintf(f, "{\"cddp_flight\": 1, \"rank\": %d, \"world\": %d, \"pid\": %d, \"host\": \"",
            rank < 0 ? 0 : rank, world, (int)getpid());
    put_string(f, host);
    fprintf(f, "\", \"run_id\": \"");
    put_string(f, run ? run : "");
    fprintf(f, "\", \"why\": \"");
    put_string(f, why ? why : "");
    fprintf(f, "\", \"now\": %.6f, \"wall\": %.6f, \"capacity\": %zu, \"events\": [", now, wall_s,
            cap);
    bool first = true;
    uint64_t from = last > cap ? last - cap + 1 : 1;
    for (uint64_t id = from; cap && id <= last; id++) {
        const entry *e = &copy[id % cap];
        if (e->id != id) continue;
        fprintf(f, "%s\n  ", first ? "" : ",");
        const own_group *o = NULL;
        for (int i = 0; i < nown && !o; i++)
            if (own[i].group == e->group + 1) o = &own[i];
        put_entry(f, e, o);
        first = false;
    }
    fprintf(f, "\n]}\n");
    cddp_free(copy);
    bool ok = fflush(f) == 0 && !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, file) != 0) {
        int e = errno;
        unlink(tmp);
        return cddp_error_set(err, CDDP_EIO, "cannot write %s: %s", file, strerror(e));
    }
    if (path) snprintf(path, n, "%s", file);
    return CDDP_OK;
}

/* A dump for a reason of the library's own: logged where it went, or why it did not. */
void cddp__flight_dump_because(const char *why) {
    if (!F.ring) return;
    char path[600];
    cddp_error err = {0};
    if (cddp_flight_dump(why, path, sizeof path, &err) == CDDP_OK)
        cddp_log(CDDP_LOG_WARN, "comm",
                 "flight record written to %s (cddp-trace %.*s says where every rank stands)", path,
                 (int)(strrchr(path, '/') - path), path);
    else
        cddp_log(CDDP_LOG_WARN, "comm", "no flight record: %s", err.msg);
}

/* ---- SIGUSR1 ----------------------------------------------------------------------------- */

/* SIGUSR1s taken, and answered: each answered by a dump that began after it was taken. */
static _Atomic unsigned long usr1_asked, usr1_answered;

static void on_signal(int sig) {
    (void)sig;
    int saved = errno;
    atomic_fetch_add(&usr1_asked, 1);
    char b = 1;
    ssize_t w = write(F.pipe[1], &b, 1);
    (void)w;
    errno = saved;
}

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        char b[64]; /* the requests so far, answered by one dump */
        ssize_t r = read(F.pipe[0], b, sizeof b);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return NULL;
        unsigned long asked = atomic_load(&usr1_asked);
        cddp__flight_dump_because("SIGUSR1: asked for the record");
        atomic_store(&usr1_answered, asked);
    }
}

void cddp__flight_settle(double timeout_s) {
    for (double end = cddp_now_s() + timeout_s;
         atomic_load(&usr1_answered) < atomic_load(&usr1_asked) && cddp_now_s() < end;)
        usleep(1000);
}

/* Installs the handler, unless the program has its own. */
static void install_signal(void) {
    struct sigaction old;
    if (sigaction(SIGUSR1, NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO))
        return;
    if (pipe2(F.pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
    fcntl(F.pipe[0], F_SETFL, 0); /* the thread's reads block; the handler's writes do not */
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, signal_thread, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(F.pipe[0]);
        close(F.pipe[1]);
        return;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

void cddp__flight_join(cddp_comm *c) {
    pthread_mutex_lock(&F.mu);
    if (!F.made) make_ring();
    if (!F.joined) {
        F.joined = true;
        F.rank = c->rank;
        F.world = c->world;
        if (F.ring) install_signal();
    }
    c->flight_group = F.ring ? ++F.groups : 0;
    pthread_mutex_unlock(&F.mu);
}
