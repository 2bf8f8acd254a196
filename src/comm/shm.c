/* shm.c: the shared-memory transport, for ranks on one host.
 *
 * Setup. Rank 0 creates a segment, everyone maps it, and rank 0 unlinks its name once all have
 * mapped it: nothing is left in /dev/shm whatever happens to the processes afterwards. The
 * segment holds a header, per rank a control block (an arrival counter, the pid, fingerprints,
 * registered-memory names, an abort reason) and two staging slots of CDDP_SHM_CHUNK_KB (one for
 * collectives, one for the messages it sends), and a pair block per ordered pair of ranks for
 * point to point.
 *
 * Waiting. Synchronisation is a counter barrier: a rank bumps its counter to the next step and
 * waits until every counter reached it. A wait spins for 20 us (the peer is about to arrive:
 * the latency path), then blocks on a futex in the segment that arrivals wake (the peer is
 * computing, stopped or far behind: leave the core to whoever works; with more ranks than cores
 * this is what lets the late rank run). Every 10 ms at most it checks the deadline, an abort,
 * and whether the awaited peer's process still exists.
 *
 * Allreduce, per chunk of the message (each rank reads (n-1)/n of every other rank's chunk once
 * and writes its slice once, the 2(n-1)/n of a ring, with no ring latency): every rank stages
 * its chunk; barrier; rank r reduces slice r over all slots in rank order; barrier; every rank
 * copies every slice. When the buffer lies at the same place of memory from cddp_comm_alloc on
 * every rank, rank r reduces slice r straight from every rank's buffer into every rank's buffer:
 * one barrier, no copies. Each slice is reduced by one rank in one order, so every rank receives
 * bit-identical results.
 *
 * Moves (what the generic algorithms run on) are a byte stream between two ranks: the sender
 * copies up to a slot of bytes into its send slot and counts the chunk posted in the pair block;
 * the receiver copies out as much of it as its transfer wants (the rest goes to its next one)
 * and counts the chunk taken when it has all of it; the slot is reused once it was taken.
 */
#include "cddp/store.h"
#include "comm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- setup and teardown ------------------------------------------------------------------ */

/* Rank 0 creates the segment and posts its name; the others open it. */
static int open_segment(cddp_comm *c, struct cddp_store *st, char *name, size_t n, int *fd,
                        cddp_error *err) {
    shm *s = priv(c);
    char key[64];
    snprintf(key, sizeof key, "%scomm/shm", c->key_prefix);
    if (c->rank == 0) {
        uint64_t rnd = (uint64_t)(cddp_now_s() * 1e9) ^ ((uint64_t)getpid() << 20);
        snprintf(name, n, "/cddp-%d-%" PRIx64, (int)getpid(), rnd);
        *fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (*fd < 0 || ftruncate(*fd, (off_t)s->seg_size) != 0) {
            int e = errno;
            if (*fd >= 0) {
                close(*fd);
                shm_unlink(name);
            }
            return cddp_error_set(err, CDDP_EIO,
                                  "cannot create the shared-memory segment %s (%zu MiB): %s; is "
                                  "/dev/shm full?",
                                  name, s->seg_size >> 20, strerror(e));
        }
        return cddp_store_set_str(st, key, name, err);
    }
    void *v;
    size_t len;
    CDDP_TRY(cddp_store_get(st, key, -1, &v, &len, err));
    snprintf(name, n, "%s", (char *)v);
    cddp_free(v);
    if ((*fd = shm_open(name, O_RDWR | O_CLOEXEC, 0)) < 0)
        return cddp_error_set(err, CDDP_EIO, "cannot open the shared-memory segment %s: %s", name,
                              strerror(errno));
    return CDDP_OK;
}

/* Once every rank has mapped the segment, rank 0 unlinks its name (nothing is left in /dev/shm,
 * whatever happens to the processes afterwards) and says it is ready. */
static int all_mapped(cddp_comm *c, struct cddp_store *st, const char *name, cddp_error *err) {
    char key[64];
    snprintf(key, sizeof key, "%scomm/mapped/%d", c->key_prefix, c->rank);
    CDDP_TRY(cddp_store_set_str(st, key, "1", err));
    snprintf(key, sizeof key, "%scomm/ready", c->key_prefix);
    if (c->rank != 0) {
        const char *k = key;
        CDDP_TRY(cddp_store_wait(st, &k, 1, -1, err));
        if (header(c)->magic != SEG_MAGIC || header(c)->world != c->world)
            return cddp_error_set(err, CDDP_EIO, "the shared-memory segment %s is not this group's",
                                  name);
        return CDDP_OK;
    }
    const char **keys = cddp_calloc((size_t)c->world, sizeof *keys);
    char(*k)[64] = cddp_calloc((size_t)c->world, 64);
    int rc = keys && k ? CDDP_OK : cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    for (int r = 0; r < c->world && rc == CDDP_OK; r++) {
        snprintf(k[r], 64, "%scomm/mapped/%d", c->key_prefix, r);
        keys[r] = k[r];
    }
    if (rc == CDDP_OK) rc = cddp_store_wait(st, keys, c->world, -1, err);
    shm_unlink(name);
    cddp_free(keys);
    cddp_free(k);
    CDDP_TRY(rc);
    return cddp_store_set_str(st, key, "1", err);
}

static int shm_setup(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err) {
    (void)deadline; /* the store's waits have CDDP_RDZV_TIMEOUT_S */
    shm *s = c->priv = cddp_calloc(1, sizeof *s);
    if (!s) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    s->slot_peer = -1;
    long kb = cddp_knob_int(CDDP_KNOB_SHM_CHUNK_KB);
    s->chunk = CDDP_MAX((size_t)(kb < 4 ? 4 : kb) * 1024, (size_t)c->world * 64);
    s->seg_size = 4096 + (size_t)c->world * CTL_SIZE + 2 * (size_t)c->world * s->chunk +
                  (size_t)c->world * c->world * PAIR_SIZE;
    s->acc = cddp_aligned_alloc(CDDP_COMM_RBLOCK * sizeof(float));
    s->tmp = cddp_aligned_alloc(CDDP_COMM_RBLOCK * sizeof(double));
    s->slots = cddp_calloc((size_t)c->world, sizeof *s->slots);
    s->src = cddp_calloc((size_t)c->world, sizeof *s->src);
    s->dst = cddp_calloc((size_t)c->world, sizeof *s->dst);
    s->taking = cddp_calloc((size_t)c->world, sizeof *s->taking);
    if (!s->acc || !s->tmp || !s->slots || !s->src || !s->dst || !s->taking)
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    char name[96];
    int fd = -1;
    CDDP_TRY(open_segment(c, st, name, sizeof name, &fd, err));
    void *p = mmap(NULL, s->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (c->rank == 0) shm_unlink(name);
        return cddp_error_set(err, CDDP_EIO, "cannot map %s: %s", name, strerror(errno));
    }
    s->seg = p;
    for (int r = 0; r < c->world; r++) s->slots[r] = slot_of(c, r);
    ctl_of(c, c->rank)->pid = (int32_t)getpid();
    if (c->rank == 0) {
        seg_header *h = header(c);
        h->world = c->world;
        h->chunk = s->chunk;
        atomic_thread_fence(memory_order_release);
        h->magic = SEG_MAGIC;
    }
    return all_mapped(c, st, name, err);
}

static void shm_close(cddp_comm *c) {
    shm *s = priv(c);
    if (!s) return;
    for (int i = 0; i < MAX_REGS; i++)
        if (s->regs[i].id) cddp__shm_unmap_reg(c, &s->regs[i]);
    if (s->seg) munmap(s->seg, s->seg_size);
    cddp_aligned_free(s->acc);
    cddp_aligned_free(s->tmp);
    cddp_free(s->slots);
    cddp_free(s->src);
    cddp_free(s->dst);
    cddp_free(s->taking);
    cddp_free(s);
    c->priv = NULL;
}

/* Tells the peers waiting for this rank in a move that the group failed here, and why (without
 * the "rank N: " the message starts with: the peers name this rank themselves). */
static void shm_failed(cddp_comm *c) {
    shm *s = priv(c);
    /* An abort (this rank's or a peer's) already tells every rank, with its own reason, which
     * the notice would overwrite. */
    if (!s || !s->seg || atomic_load(&c->aborted) || atomic_load(&header(c)->abort_rank)) return;
    int skip = 0;
    sscanf(c->failed.msg, "rank %*d: %n", &skip);
    ctl *mine = ctl_of(c, c->rank);
    snprintf(mine->abort_reason, sizeof mine->abort_reason, "%s", c->failed.msg + skip);
    atomic_store(&mine->failed, 1);
    cddp__shm_wake(c);
}

/* Tells the peers: the reason first, then the flag, then a wake-up for those asleep. */
static void shm_abort(cddp_comm *c, const char *reason) {
    shm *s = priv(c);
    if (!s || !s->seg) return;
    snprintf(ctl_of(c, c->rank)->abort_reason, sizeof ctl_of(c, c->rank)->abort_reason, "%s",
             reason);
    int32_t none = 0;
    atomic_compare_exchange_strong(&header(c)->abort_rank, &none, c->rank + 1);
    cddp__shm_wake(c);
}

const cddp__transport cddp__shm_transport = {
    .name = "shm",
    .says = "shared memory",
    .one_host = true,
    .setup = shm_setup,
    .close = shm_close,
    .abort = shm_abort,
    .failed = shm_failed,
    .begin = cddp__shm_begin,
    .move = cddp__shm_move,
    .p2p = cddp__shm_p2p,
    .alloc = cddp__shm_alloc,
    .free = cddp__shm_free,
};
