/* shm.c: the shared-memory transport, for ranks on one host.
 *
 * Setup. Rank 0 creates a segment, an unnamed file in /dev/shm (O_TMPFILE), and posts its pid
 * and descriptor; everyone maps it through /proc/<pid>/fd, and rank 0 closes the descriptor once
 * all have mapped it. The memory has no name: nothing is ever in /dev/shm, and it goes away with
 * the last process that maps it, whenever and however the processes end. The
 * segment holds a header, per rank a control block (an arrival counter, the pid, fingerprints,
 * registered-memory descriptors, an abort reason) and two staging slots of CDDP_SHM_CHUNK_KB (one
 * for collectives, one for the messages it sends), and a pair block per ordered pair of ranks for
 * point to point.
 *
 * Waiting. Synchronisation is a counter barrier: a rank bumps its counter to the next step and
 * waits until every counter reached it. A wait spins first (the peer is about to arrive: the
 * latency path; CDDP_SPIN_US, cddp__comm_spin), then blocks on a futex in the segment that arrivals
 * wake (the peer is computing, stopped or far behind: leave the core to whoever works; with more
 * ranks than cores this is what lets the late rank run). Every 10 ms at most it checks the
 * deadline, an abort, and whether the awaited peer's process still exists.
 *
 * Allreduce, per chunk of the message (each rank reads (n-1)/n of every other rank's chunk once
 * and writes its slice once, the 2(n-1)/n of a ring, with no ring latency): every rank stages
 * its chunk; barrier; rank r reduces slice r over all slots in rank order; barrier; every rank
 * copies every slice. When the buffer lies at the same place of memory from cddp_comm_alloc on
 * every rank, the ranks take pieces of it in turn and reduce each straight from every rank's
 * buffer into every rank's buffer: one barrier, no copies, and a rank whose core is busy leaves
 * more of the work to the others. Each slice or piece is reduced by one rank in one order, so
 * every rank receives bit-identical results.
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

/* Rank 0 creates the segment and posts where it is (its pid, descriptor and inode); the others
 * map it. */
static int map_segment(cddp_comm *c, struct cddp_store *st, cddp_error *err) {
    shm *s = priv(c);
    char key[64], where[96];
    snprintf(key, sizeof key, "%scomm/shm", c->key_prefix);
    void *p = MAP_FAILED;
    if (c->rank == 0) {
        uint64_t ino = 0;
        s->seg_fd = cddp__shm_create(s->seg_size, &ino);
        if (s->seg_fd >= 0) p = cddp__shm_map_fd(s->seg_fd, s->seg_size);
        if (p == MAP_FAILED)
            return cddp_error_set(
                err, CDDP_EIO, "cannot create the shared-memory segment (%zu MiB) in /dev/shm: %s",
                s->seg_size >> 20, strerror(errno));
        s->seg = p;
        snprintf(where, sizeof where, "%d %d %" PRIu64, (int)getpid(), s->seg_fd, ino);
        return cddp_store_set_str(st, key, where, err);
    }
    void *v;
    size_t len;
    CDDP_TRY(cddp_store_get(st, key, -1, &v, &len, err));
    int pid = 0, fd = -1;
    uint64_t ino = 0;
    int got = sscanf((char *)v, "%d %d %" SCNu64, &pid, &fd, &ino);
    cddp_free(v);
    if (got != 3) return cddp_error_set(err, CDDP_EIO, "rank 0 posted no shared-memory segment");
    if ((p = cddp__shm_map_peer(pid, fd, ino, s->seg_size)) == MAP_FAILED) {
        int e = errno;
        return cddp_error_set(err, CDDP_EIO,
                              "cannot map rank 0's shared-memory segment (pid %d, descriptor %d): "
                              "%s%s",
                              pid, fd, strerror(e), cddp__shm_map_hint(e));
    }
    s->seg = p;
    return CDDP_OK;
}

/* Once every rank has mapped the segment, rank 0 closes its descriptor (the mappings keep the
 * memory) and says it is ready. */
static int all_mapped(cddp_comm *c, struct cddp_store *st, cddp_error *err) {
    char key[64];
    snprintf(key, sizeof key, "%scomm/mapped/%d", c->key_prefix, c->rank);
    CDDP_TRY(cddp_store_set_str(st, key, "1", err));
    snprintf(key, sizeof key, "%scomm/ready", c->key_prefix);
    if (c->rank != 0) {
        const char *k = key;
        CDDP_TRY(cddp_store_wait(st, &k, 1, -1, err));
        if (header(c)->magic != SEG_MAGIC || header(c)->world != c->world)
            return cddp_error_set(err, CDDP_EIO, "the shared-memory segment is not this group's");
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
    close(priv(c)->seg_fd);
    priv(c)->seg_fd = -1;
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
    s->seg_fd = -1;
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
    CDDP_TRY(map_segment(c, st, err));
    for (int r = 0; r < c->world; r++) s->slots[r] = slot_of(c, r);
    ctl_of(c, c->rank)->pid = (int32_t)getpid();
    if (c->rank == 0) {
        seg_header *h = header(c);
        h->world = c->world;
        h->chunk = s->chunk;
        atomic_thread_fence(memory_order_release);
        h->magic = SEG_MAGIC;
    }
    return all_mapped(c, st, err);
}

static void shm_close(cddp_comm *c) {
    shm *s = priv(c);
    if (!s) return;
    /* A peer still waiting for this rank fails at once, saying it left (not died), unless the
     * group failed here: then the peers have that notice. */
    if (s->seg && !c->failed.code && !atomic_load(&c->aborted)) {
        ctl *mine = ctl_of(c, c->rank);
        mine->left_after = c->seq;
        atomic_store_explicit(&mine->left, 1, memory_order_release);
        cddp__shm_wake(c);
    }
    for (int i = 0; i < MAX_REGS; i++)
        if (s->regs[i].id) cddp__shm_unmap_reg(c, &s->regs[i]);
    if (s->seg) munmap(s->seg, s->seg_size);
    if (s->seg_fd >= 0) close(s->seg_fd);
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
