/* sampler.c: the DistributedSampler (semantics in cddp/data.h).
 *
 * Padding, as PyTorch does it. With N samples and R replicas and drop_last false, every rank
 * gets S = ceil(N / R) samples, so the permutation p of [0, N) is extended to T = S * R entries
 * by repeating its beginning (p[0], p[1], ... and around again if T - N > N, which happens only
 * when N < R). Rank r then takes entries r, r + R, r + 2R, ... of the extended list. With
 * drop_last the list is cut to T = floor(N / R) * R instead. So the ranks together see every
 * sample at least once (padding) or all but the N - T dropped ones (drop_last), and each sees the
 * same count, which DDP needs to keep the ranks in lockstep. The uneven mode takes entries r,
 * r + R, ... of p itself: every sample exactly once, counts differing by at most one.
 *
 * Resuming on another number of ranks: the state's position counts the entries of the list that
 * every rank together was handed (rank r's k-th sample is entry r + k R, so after c samples each
 * the ranks hold entries [0, c R)). A sampler given that position continues the same list at it,
 * entries start + r, start + r + R', ... for its own R' ranks, the rest cut or padded for R' as a
 * whole epoch is; when the global batch stays the same (R' B' = R B) every later step takes the
 * same entries as without the interruption.
 *
 * The permutation for an epoch is a Fisher-Yates shuffle driven by cddp_rng seeded with
 * seed + epoch, so every rank computes the same one without communicating. Above
 * cddp__sampler_list_max samples (a corpus of billions of token windows) a list of them all would
 * take gigabytes on every rank and seconds to shuffle, so the permutation is a rule instead: a
 * keyed bijection of the index's bits (a balanced Feistel network of 6 rounds over the smallest
 * even number of bits that holds N - 1, keyed by seed and epoch), walked again while it lands at
 * N or beyond ("cycle walking": at most 4 tries on average, as the bits hold under 4 N). Each
 * entry costs a few hashes and nothing is kept; the padding, the strides and the resumed
 * positions are the same functions of the entry either way.
 */
#include "cddp/data.h"
#include "cddp/core.h"
#include "data/internal.h"

#include <string.h>

struct cddp_sampler {
    int64_t n;
    cddp_sampler_options o;
    int64_t per_rank; /* samples this rank yields per epoch */
    int64_t total;    /* the padded or cut list length (not used in the uneven mode) */
    int64_t epoch, consumed;
    int64_t start;       /* entries of this epoch's list handed out before this run (set_state) */
    int64_t this_len;    /* samples this rank yields in this epoch from start */
    bool explicit_epoch; /* set_epoch or set_state since the last begin */
    bool begun;          /* begin has run at least once */
    int64_t *order;      /* this epoch's indices, valid for order_epoch; NULL: by the rule */
    int64_t order_epoch;
};

int64_t cddp__sampler_list_max = INT64_C(1) << 24;

cddp_sampler_options cddp_sampler_defaults(void) {
    return (cddp_sampler_options){.num_replicas = 0, .rank = -1, .shuffle = true};
}

cddp_sampler_options cddp_sampler_shards(int num_shards, int shard_id) {
    cddp_sampler_options o = cddp_sampler_defaults();
    o.num_replicas = num_shards;
    o.rank = shard_id;
    return o;
}

cddp_sampler *cddp_sampler_create(int64_t n, const cddp_sampler_options *opts, cddp_error *err) {
    cddp_sampler_options o = *opts;
    if (n < 0) {
        cddp_error_set(err, CDDP_EINVAL, "sampler: dataset length %lld", (long long)n);
        return NULL;
    }
    if (o.num_replicas <= 0 || o.rank < 0) {
        int rank, world;
        int rc = cddp_env_rank_world(&rank, &world, err);
        if (rc == CDDP_EINVAL) return NULL;
        if (o.num_replicas <= 0) o.num_replicas = world;
        if (o.rank < 0) o.rank = rank;
    }
    if (o.rank >= o.num_replicas) {
        cddp_error_set(err, CDDP_EINVAL,
                       "sampler: rank %d is out of range for %d replicas (want 0 <= rank < "
                       "num_replicas)",
                       o.rank, o.num_replicas);
        return NULL;
    }
    if (o.uneven && o.drop_last) {
        cddp_error_set(err, CDDP_EINVAL,
                       "sampler: uneven and drop_last exclude each other "
                       "(uneven sees every sample once; drop_last drops some)");
        return NULL;
    }
    cddp_sampler *s = cddp_calloc(1, sizeof *s);
    if (!s) goto oom;
    s->n = n;
    s->o = o;
    int64_t R = o.num_replicas;
    if (o.uneven) {
        s->per_rank = n > o.rank ? (n - o.rank + R - 1) / R : 0;
        s->total = n;
    } else {
        s->per_rank = o.drop_last ? n / R : (n + R - 1) / R;
        s->total = s->per_rank * R;
    }
    s->this_len = s->per_rank;
    s->order_epoch = -1;
    if (o.shuffle && n > cddp__sampler_list_max)
        cddp_log(CDDP_LOG_DEBUG, "data",
                 "sampler: %lld samples: each epoch's order by a keyed bijection (no list)",
                 (long long)n);
    else if (o.shuffle && !(s->order = cddp_malloc(sizeof(int64_t) * (size_t)(n ? n : 1))))
        goto oom;
    return s;
oom:
    cddp_sampler_destroy(s);
    cddp_error_set(err, CDDP_ENOMEM, "sampler: out of memory for %lld indices", (long long)n);
    return NULL;
}

void cddp_sampler_destroy(cddp_sampler *s) {
    if (!s) return;
    cddp_free(s->order);
    cddp_free(s);
}

/* This rank's samples in an epoch whose first start entries were handed out already, on any
 * number of ranks: the rest of the list (the same padding or cut, for these replicas) in turn. */
static int64_t len_from(const cddp_sampler *s, int64_t start) {
    int64_t R = s->o.num_replicas, left = CDDP_MAX(s->n - start, 0), r = s->o.rank;
    if (start == 0) return s->per_rank;
    if (s->o.uneven) return left > r ? (left - r + R - 1) / R : 0;
    return s->o.drop_last ? left / R : (left + R - 1) / R;
}

static void start_epoch(cddp_sampler *s, int64_t epoch, int64_t start) {
    s->epoch = epoch;
    s->consumed = 0;
    s->start = start;
    s->this_len = len_from(s, start);
}

void cddp_sampler_set_epoch(cddp_sampler *s, int64_t epoch) {
    start_epoch(s, epoch, 0);
    s->explicit_epoch = true;
}

int64_t cddp_sampler_epoch(const cddp_sampler *s) {
    return s->epoch;
}

int64_t cddp_sampler_len(const cddp_sampler *s) {
    return s->per_rank;
}

int64_t cddp_sampler_dataset_len(const cddp_sampler *s) {
    return s->n;
}

int cddp_sampler_rank(const cddp_sampler *s) {
    return s->o.rank;
}

int cddp_sampler_num_replicas(const cddp_sampler *s) {
    return s->o.num_replicas;
}

/* The shuffled permutation of [0, n) for epoch, as a list. */
static void permutation(const cddp_sampler *s, int64_t epoch, int64_t *p) {
    for (int64_t i = 0; i < s->n; i++) p[i] = i;
    cddp_rng rng;
    cddp_rng_seed(&rng, s->o.seed + (uint64_t)epoch);
    for (int64_t i = s->n - 1; i > 0; i--) {
        int64_t j = (int64_t)cddp_rng_below(&rng, (uint64_t)i + 1), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* The permutation of an epoch, computed once and kept until another epoch is asked for. The
 * cache is an optimisation of a pure function, so it may change under const. */
static const int64_t *cached_permutation(const cddp_sampler *s, int64_t epoch) {
    if (s->order_epoch != epoch) {
        permutation(s, epoch, s->order);
        ((cddp_sampler *)s)->order_epoch = epoch;
    }
    return s->order;
}

/* splitmix64's finaliser: every bit of z moves about half of the result's */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The rule for epoch, entry k of this rank's run being list entry first + k stride. */
static cddp__sampler_run rule_of(const cddp_sampler *s, int64_t epoch, int64_t first) {
    int bits = 0;
    while (bits < 63 && (UINT64_C(1) << bits) < (uint64_t)s->n) bits++;
    int half = (bits + 1) / 2;
    return (cddp__sampler_run){
        .key = mix64(s->o.seed ^ mix64((uint64_t)epoch + UINT64_C(0x9e3779b97f4a7c15))),
        .mask = (UINT64_C(1) << half) - 1,
        .n = s->n,
        .half = half,
        .shuffle = s->o.shuffle,
        .first = first,
        .stride = s->o.num_replicas};
}

int64_t cddp__sampler_run_index(const cddp__sampler_run *r, int64_t k) {
    uint64_t x = (uint64_t)((r->first + k * r->stride) % r->n);
    if (!r->shuffle) return (int64_t)x;
    do {
        uint64_t hi = x >> r->half, lo = x & r->mask;
        for (uint64_t round = 0; round < 6; round++) {
            uint64_t f = mix64(r->key ^ (round << 58) ^ lo) & r->mask;
            uint64_t t = hi ^ f;
            hi = lo;
            lo = t;
        }
        x = hi << r->half | lo;
    } while (x >= (uint64_t)r->n);
    return (int64_t)x;
}

/* This rank's len entries of epoch's list from entry start on: start + rank, + R, ... Entry k of
 * the padded list is p[k mod n]: the padding repeats the start. */
static void rank_entries(const cddp_sampler *s, int64_t epoch, int64_t start, int64_t len,
                         int64_t *out) {
    int64_t R = s->o.num_replicas;
    if (s->order) {
        const int64_t *p = cached_permutation(s, epoch);
        for (int64_t j = 0; j < len; j++) out[j] = p[(start + s->o.rank + j * R) % s->n];
        return;
    }
    cddp__sampler_run r = rule_of(s, epoch, start + s->o.rank);
    for (int64_t j = 0; j < len; j++) out[j] = cddp__sampler_run_index(&r, j);
}

bool cddp__sampler_run_rule(const cddp_sampler *s, cddp__sampler_run *run) {
    if (s->order) return false;
    *run = rule_of(s, s->epoch, s->start + s->o.rank);
    return true;
}

void cddp_sampler_indices(const cddp_sampler *s, int64_t epoch, int64_t *out) {
    rank_entries(s, epoch, 0, s->per_rank, out);
}

void cddp__sampler_run_indices(const cddp_sampler *s, int64_t *out) {
    rank_entries(s, s->epoch, s->start, s->this_len, out);
}

int64_t cddp_sampler_begin(cddp_sampler *s) {
    if (s->begun && !s->explicit_epoch) {
        start_epoch(s, s->epoch + 1, 0);
        cddp_log(CDDP_LOG_DEBUG, "data",
                 "sampler: epoch advanced to %lld (cddp_sampler_set_epoch was not called)",
                 (long long)s->epoch);
    }
    s->begun = true;
    s->explicit_epoch = false;
    return s->this_len - s->consumed;
}

int64_t cddp_sampler_next(cddp_sampler *s) {
    if (s->consumed >= s->this_len) return -1;
    int64_t i;
    rank_entries(s, s->epoch, s->start + s->consumed * s->o.num_replicas, 1, &i);
    s->consumed++;
    return i;
}

cddp_sampler_state cddp_sampler_get_state(const cddp_sampler *s) {
    return (cddp_sampler_state){s->epoch, s->consumed, s->start + s->consumed * s->o.num_replicas};
}

int cddp_sampler_set_state(cddp_sampler *s, cddp_sampler_state st, cddp_error *err) {
    if (st.position > 0) { /* the ranks' position together: any number of replicas */
        int64_t R = s->o.num_replicas;
        /* Past the dataset's end only by padding, which repeats at most the whole list. */
        if (st.position > s->n && (s->o.drop_last || s->o.uneven || st.position > 2 * s->n + R))
            return cddp_error_set(err, CDDP_ERANGE,
                                  "sampler state: %lld samples of the epoch handed out, but the "
                                  "dataset has %lld (was the state saved for another dataset?)",
                                  (long long)st.position, (long long)s->n);
        if (st.position % R == 0 && st.position / R <= s->per_rank) { /* these ranks' lockstep */
            start_epoch(s, st.epoch, 0);
            s->consumed = st.position / R;
        } else { /* the rest of the list from there; past the end: nothing left */
            start_epoch(s, st.epoch, CDDP_MIN(st.position, s->n));
        }
    } else {
        if (st.consumed < 0 || st.consumed > s->per_rank)
            return cddp_error_set(err, CDDP_ERANGE,
                                  "sampler state: %lld samples consumed, but an epoch has %lld on "
                                  "rank %d (was the state saved with another world size or "
                                  "dataset?)",
                                  (long long)st.consumed, (long long)s->per_rank, s->o.rank);
        start_epoch(s, st.epoch, 0);
        s->consumed = st.consumed;
    }
    s->explicit_epoch = true;
    return CDDP_OK;
}

void cddp__sampler_advance(cddp_sampler *s, int64_t n) {
    s->consumed = CDDP_MIN(s->consumed + n, s->this_len);
}
