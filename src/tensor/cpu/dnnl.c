/* tensor/cpu/dnnl.c: the engine, the per-thread stream, the primitive cache and the runs with
 * reorders (see dnnl.h). */
#include "tensor/cpu/dnnl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS     8
#define MAX_REORDERS (2 * MAX_ARGS) /* an argument may come in two layouts */
#define BUCKETS      256

/* A reorder between an argument's layout as given (plain, or the md of the run's argument) and
 * the primitive's, made on first use. */
typedef struct reorder {
    int arg;
    dnnl_memory_desc_t given;
    dnnl_primitive_t prim;
    size_t scratch; /* bytes of its scratchpad */
} reorder;

struct cddp__dnnl_prim {
    struct cddp__dnnl_prim *next;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    size_t scratch;
    reorder reorders[MAX_REORDERS];
    int nreorders;
    size_t len;
    unsigned char key[];
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_primitive_attr_t attr; /* the scratchpad is the caller's */
static cddp__dnnl_prim *table[BUCKETS];
static pthread_key_t stream_key; /* each thread's stream, destroyed when the thread ends */

void cddp__dnnl_ok(dnnl_status_t s, const char *what) {
    CDDP_CHECK(s == dnnl_success, "oneDNN: %s failed (status %d)", what, (int)s);
}

static void end_stream(void *s) {
    dnnl_stream_destroy(s);
}

static void init(void) {
    CDDP_CHECK(pthread_key_create(&stream_key, end_stream) == 0, "oneDNN: no thread key left");
    cddp__dnnl_ok(dnnl_engine_create(&engine, dnnl_cpu, 0), "creating the CPU engine");
    cddp__dnnl_ok(dnnl_primitive_attr_create(&attr), "creating attributes");
    cddp__dnnl_ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
                  "setting the scratchpad mode");
}

dnnl_engine_t cddp__dnnl_engine(void) {
    pthread_once(&once, init);
    return engine;
}

static dnnl_stream_t thread_stream(void) {
    pthread_once(&once, init);
    dnnl_stream_t s = pthread_getspecific(stream_key);
    if (!s) {
        cddp__dnnl_ok(dnnl_stream_create(&s, cddp__dnnl_engine(), dnnl_stream_default_flags),
                      "creating a stream");
        CDDP_CHECK(pthread_setspecific(stream_key, s) == 0, "oneDNN: cannot keep a stream");
    }
    return s;
}

static size_t scratch_of(const_dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

static uint64_t hash(const void *key, size_t len) {
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static cddp__dnnl_prim *find(uint64_t h, const void *key, size_t len) {
    for (cddp__dnnl_prim *e = table[h % BUCKETS]; e; e = e->next)
        if (e->len == len && memcmp(e->key, key, len) == 0) return e;
    return NULL;
}

const cddp__dnnl_prim *cddp__dnnl_get(const void *key, size_t len, cddp__dnnl_make make) {
    pthread_once(&once, init);
    uint64_t h = hash(key, len);
    pthread_mutex_lock(&lock);
    cddp__dnnl_prim *e = find(h, key, len);
    pthread_mutex_unlock(&lock);
    if (e) return e;
    /* Made outside the lock: making a backward primitive gets its forward one first. */
    e = calloc(1, sizeof *e + len);
    CDDP_CHECK(e, "oneDNN: out of memory for a primitive");
    memcpy(e->key, key, len);
    e->len = len;
    cddp__dnnl_ok(make(&e->pd, key, attr), "making a primitive descriptor");
    cddp__dnnl_ok(dnnl_primitive_create(&e->prim, e->pd), "making a primitive");
    e->scratch = scratch_of(e->pd);
    pthread_mutex_lock(&lock);
    cddp__dnnl_prim *other = find(h, key, len);
    if (!other) {
        e->next = table[h % BUCKETS];
        table[h % BUCKETS] = e;
    }
    pthread_mutex_unlock(&lock);
    if (other) { /* another thread made it meanwhile */
        dnnl_primitive_destroy(e->prim);
        dnnl_primitive_desc_destroy(e->pd);
        free(e);
        return other;
    }
    return e;
}

dnnl_primitive_desc_t cddp__dnnl_pd(const cddp__dnnl_prim *p) {
    return p->pd;
}

const dnnl_memory_desc_t *cddp__dnnl_md(const cddp__dnnl_prim *p, int arg) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(p->pd, dnnl_query_exec_arg_md, arg);
    CDDP_CHECK(md && md->ndims > 0, "oneDNN: the primitive takes no argument %d", arg);
    return md;
}

/* The layout a's data is in. */
static dnnl_memory_desc_t given_md(const cddp__dnnl_arg *a) {
    if (a->md) return *a->md;
    dnnl_memory_desc_t md;
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(&md, a->ndims, a->dims,
                                               a->bf16 ? dnnl_bf16 : dnnl_f32, a->tag),
                  "describing a tensor");
    return md;
}

/* The reorder of argument a between its layout as given and want (into want when !out); made once
 * per primitive, argument and given layout. */
static reorder *reorder_for(cddp__dnnl_prim *p, const cddp__dnnl_arg *a,
                            const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want,
                            bool out) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < p->nreorders; i++)
        if (p->reorders[i].arg == a->arg && dnnl_memory_desc_equal(&p->reorders[i].given, plain)) {
            pthread_mutex_unlock(&lock);
            return &p->reorders[i];
        }
    CDDP_CHECK(p->nreorders < MAX_REORDERS, "oneDNN: more than %d reorders for one primitive",
               MAX_REORDERS);
    dnnl_primitive_desc_t pd;
    cddp__dnnl_ok(dnnl_reorder_primitive_desc_create(&pd, out ? want : plain, engine,
                                                     out ? plain : want, engine, attr),
                  "making a reorder");
    reorder *r = &p->reorders[p->nreorders];
    r->arg = a->arg;
    r->given = *plain;
    r->scratch = scratch_of(pd);
    cddp__dnnl_ok(dnnl_primitive_create(&r->prim, pd), "making a reorder primitive");
    dnnl_primitive_desc_destroy(pd);
    p->nreorders++;
    pthread_mutex_unlock(&lock);
    return r;
}

static dnnl_memory_t memory(const dnnl_memory_desc_t *md, void *data) {
    dnnl_memory_t m;
    cddp__dnnl_ok(dnnl_memory_create(&m, md, engine, data), "wrapping a buffer");
    return m;
}

static void exec(dnnl_primitive_t prim, int n, const dnnl_exec_arg_t *args) {
    sigset_t old;
    cddp__cpu_shield(&old);
    dnnl_status_t run = dnnl_primitive_execute(prim, thread_stream(), n, args);
    dnnl_status_t wait = run == dnnl_success ? dnnl_stream_wait(thread_stream()) : run;
    cddp__cpu_unshield(&old);
    cddp__dnnl_ok(run, "running a primitive");
    cddp__dnnl_ok(wait, "waiting for a primitive");
}

/* false when its scratchpad could not be had (the failure reported through q) */
static bool run_reorder(cddp__kq *q, const reorder *r, dnnl_memory_t from, dnnl_memory_t to) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    int n = 2;
    dnnl_memory_t sm = NULL;
    if (r->scratch) {
        const_dnnl_primitive_desc_t pd;
        cddp__dnnl_ok(dnnl_primitive_get_primitive_desc(r->prim, &pd), "querying a reorder");
        void *s = cddp__kq_scratch(q, r->scratch);
        if (!s) return false;
        sm = memory(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), s);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sm};
    }
    exec(r->prim, n, args);
    if (sm) dnnl_memory_destroy(sm);
    return true;
}

bool cddp__dnnl_run(cddp__kq *q, const cddp__dnnl_prim *cp, int nargs, const cddp__dnnl_arg *args) {
    cddp__dnnl_prim *p = (cddp__dnnl_prim *)cp; /* its reorders are added on first use */
    CDDP_CHECK(nargs <= MAX_ARGS, "oneDNN: %d arguments", nargs);
    dnnl_exec_arg_t ex[MAX_ARGS + 1] = {{0}};
    dnnl_memory_t own[MAX_ARGS + 1] = {0}, plain[MAX_ARGS] = {0};
    const reorder *back[MAX_ARGS] = {0};
    float *sum_into[MAX_ARGS] = {0};
    int64_t sum_n[MAX_ARGS] = {0};
    bool ok = false;
    int n = 0;
    for (int i = 0; i < nargs; i++) {
        const cddp__dnnl_arg *a = &args[i];
        const dnnl_memory_desc_t *want = cddp__dnnl_md(p, a->arg);
        ex[n].arg = a->arg;
        dnnl_memory_desc_t md = given_md(a);
        bool same = dnnl_memory_desc_equal(&md, want);
        void *data = a->data;
        if (a->io == CDDP__DNNL_ADD) { /* the result into a temporary, then added */
            sum_n[i] = (int64_t)(dnnl_memory_desc_get_size(&md) / sizeof(float));
            sum_into[i] = a->data;
            if (!(data = cddp__kq_scratch(q, dnnl_memory_desc_get_size(&md)))) goto out;
        }
        if (same) {
            ex[n++].memory = own[i] = memory(want, data);
            continue;
        }
        cddp__dnnl_copy *copy = a->io == CDDP__DNNL_IN ? a->copy : NULL;
        if (copy && copy->data && dnnl_memory_desc_equal(&copy->md, want)) {
            ex[n++].memory = own[i] = memory(want, copy->data); /* reordered by an earlier run */
            continue;
        }
        void *tmp = cddp__kq_scratch(q, dnnl_memory_desc_get_size(want));
        if (!tmp) goto out;
        ex[n++].memory = own[i] = memory(want, tmp);
        plain[i] = memory(&md, data);
        const reorder *r = reorder_for(p, a, &md, want, a->io != CDDP__DNNL_IN);
        if (a->io == CDDP__DNNL_IN) {
            if (!run_reorder(q, r, plain[i], own[i])) goto out;
            if (copy) *copy = (cddp__dnnl_copy){tmp, *want};
        } else {
            back[i] = r;
        }
    }
    if (p->scratch) {
        void *s = cddp__kq_scratch(q, p->scratch);
        if (!s) goto out;
        ex[n].arg = DNNL_ARG_SCRATCHPAD;
        ex[n++].memory = own[nargs] =
            memory(dnnl_primitive_desc_query_md(p->pd, dnnl_query_scratchpad_md, 0), s);
    }
    exec(p->prim, n, ex);
    for (int i = 0; i < nargs; i++) {
        if (back[i] && !run_reorder(q, back[i], own[i], plain[i])) goto out;
        if (sum_into[i]) {
            void *from;
            cddp__dnnl_ok(dnnl_memory_get_data_handle(plain[i] ? plain[i] : own[i], &from),
                          "reading a result");
            cddp__add_into(sum_into[i], from, sum_n[i]);
        }
    }
    ok = true;
out:
    for (int i = 0; i <= nargs; i++)
        if (own[i]) dnnl_memory_destroy(own[i]);
    for (int i = 0; i < nargs; i++)
        if (plain[i]) dnnl_memory_destroy(plain[i]);
    return ok;
}

/* The layout a forward-training convolution of 16 -> 16 channels, 3x3 on 8x8, picks for its
 * output, when that blocks the channels. */
static int block_size;
static pthread_once_t block_once = PTHREAD_ONCE_INIT;

static void find_block(void) {
    dnnl_memory_desc_t src, w, dst;
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(&src, 4, (dnnl_dims_t){1, 16, 8, 8}, dnnl_f32,
                                               dnnl_format_tag_any),
                  "describing a probe");
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(&w, 4, (dnnl_dims_t){16, 16, 3, 3}, dnnl_f32,
                                               dnnl_format_tag_any),
                  "describing a probe");
    dst = src;
    dnnl_convolution_desc_t d;
    cddp__dnnl_ok(dnnl_convolution_forward_desc_init(
                      &d, dnnl_forward_training, dnnl_convolution_direct, &src, &w, NULL, &dst,
                      (dnnl_dims_t){1, 1}, (dnnl_dims_t){1, 1}, (dnnl_dims_t){1, 1}),
                  "describing a probe");
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, &d, NULL, cddp__dnnl_engine(), NULL) != dnnl_success)
        return;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    if (md->format_kind == dnnl_blocked && bd->inner_nblks == 1 && bd->inner_idxs[0] == 1 &&
        (bd->inner_blks[0] == 8 || bd->inner_blks[0] == 16))
        block_size = (int)bd->inner_blks[0];
    dnnl_primitive_desc_destroy(pd);
}

int cddp__dnnl_block(void) {
    pthread_once(&block_once, find_block);
    return block_size;
}

dnnl_format_tag_t cddp__dnnl_tag(int block) {
    switch (block) {
    case 0:
        return dnnl_nchw;
    case 8:
        return dnnl_nChw8c;
    case 16:
        return dnnl_nChw16c;
    }
    CDDP_PANIC("a tensor blocked by %d channels", block);
}
