/* zero_check.c: the sharded optimizer (ZeRO-1) and sharded gradients (ZeRO-2) across real
 * processes, started by cddprun, against plain DistributedDataParallel in the same program: two
 * copies of a model, one wrapped with shard_optimizer (--stage 2: shard_gradients), one without,
 * the same batches on each rank.
 *
 *   zero_check [--stage 1|2] mlp|cnn|bn|gpt [CAP_MB] [sum|nosync|accum|accum_unused|unused|
 *                                                     bf16|fp16]
 *       (the stage also from CDDP_TEST_ZERO_STAGE)
 *       10 AdamW steps (the GPT: GPT-2's recipe, clipping at 0.5 and the schedule); after every
 *       step the parameters within 1e-6 of DDP's (relative to the model's largest), the reduced
 *       gradients of this rank's shard within 1e-6 too; each rank's optimizer state is its shard
 *       alone (the ranks' shards add up to the model, none larger than its share plus one element
 *       per bucket); the MLP's odd layer widths give every world size uneven shards. bn: the
 *       CNN with BatchNorm, whose running statistics (rank 0's, broadcast at each forward) are
 *       DDP's too, and its resumed run's the uninterrupted one's.
 *       A checkpoint saved at step 5 by the sharded run continues, loaded into a fresh sharded
 *       run, bit for bit like the uninterrupted one, and loaded into a fresh plain DDP run like
 *       DDP (within 1e-6).
 *       bf16, fp16: both runs with that hook (the sharded one reduce-scatters 16-bit copies, DDP
 *       allreduces them), the same bounds. nosync: two micro-batches a step, the first under
 *       no_sync; accum: two, each reduced (the shard adds up the means); accum_unused: the same,
 *       the aux head used in the first only (by every rank: its gradient stays the first's).
 *       Stage 2: the same, and after every synchronised backward the gradients outside this
 *       rank's shard are exactly zero (released).
 *   zero_check memory
 *       ZeRO-2 on a GPT of 3.4 MB of gradients on the CPU, and a parameter of 1 MB no rank uses
 *       (find_unused_parameters restores its gradient: in the shard only): after a step's backward,
 * and after zero_grad, the pages of the gradient block the system backs (mincore) are the shard's
 *       (1/world, plus one page at each end of each bucket's part); under ZeRO-1 all of them;
 *       cddp_ddp_memory_get says the stage and the bytes by the formula.
 *   zero_check refuse
 *       shard_optimizer with join and with the powersgd hook: wrapping fails saying why; a
 *       sharded optimizer's state cannot go through cddp_checkpoint_save, which names the way.
 * Prints "ok: ..." and exits 0 when every check holds on this rank; exits 1 saying why.
 */
#define CHECK_NAME "zero_check"
#include "check.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

enum { B = 4, D = 6, O = 3, STEPS = 10, SAVE_AT = 5, GPT_T = 8, GPT_V = 32 };

typedef enum { MLP, CNN, BN, GPT } kind;

typedef struct run {
    cddp_model *m;
    cddp_ddp *d;
    cddp_optim *opt;
} run;

static cddp_model *make_model(kind k) {
    cddp_error err = {0};
    cddp_model *m;
    int rc = 0;
    if (k == GPT) {
        cddp_gpt_config c = {
            .vocab_size = GPT_V, .block_size = GPT_T, .n_layer = 2, .n_head = 2, .n_embd = 16};
        m = cddp_model_create_with(cddp_nn_gpt(&c), &err);
        if (!m) FAIL("cannot make the GPT: %s", err.msg);
    } else if (k == CNN || k == BN) { /* bn: BatchNorm after the first convolution */
        m = cddp_model_create();
        rc |= cddp_model_add(m, "conv1", cddp_nn_conv2d(1, 4, 3, 1, 1));
        if (k == BN) rc |= cddp_model_add(m, "bn1", cddp_nn_batch_norm(4));
        rc |= cddp_model_add(m, "relu1", cddp_nn_relu());
        rc |= cddp_model_add(m, "pool1", cddp_nn_max_pool2d(2, 2));
        rc |= cddp_model_add(m, "conv2", cddp_nn_conv2d(4, 7, 3, 1, 1));
        rc |= cddp_model_add(m, "relu2", cddp_nn_relu());
        rc |= cddp_model_add(m, "pool2", cddp_nn_max_pool2d(2, 2));
        rc |= cddp_model_add(m, "flatten", cddp_nn_flatten());
        rc |= cddp_model_add(m, "fc", cddp_nn_linear(28, O));
    } else { /* odd widths: no bucket divides evenly by 2, 3 or 4 ranks */
        m = cddp_model_create();
        rc |= cddp_model_add(m, "fc1", cddp_nn_linear(D, 7));
        rc |= cddp_model_add(m, "relu1", cddp_nn_relu());
        rc |= cddp_model_add(m, "fc2", cddp_nn_linear(7, 13));
        rc |= cddp_model_add(m, "relu2", cddp_nn_relu());
        rc |= cddp_model_add(m, "fc3", cddp_nn_linear(13, O));
        rc |= cddp_model_add(m, "aux", cddp_nn_linear(13, O)); /* used on some steps (unused) */
    }
    if (rc || cddp_model_build(m, 11)) FAIL("cannot build the model: %s", cddp_model_error(m));
    return on_device(m);
}

static run start(kind k, cddp_comm *g, cddp_ddp_options o) {
    cddp_error err = {0};
    run r = {make_model(k), NULL, NULL};
    if (!(r.d = cddp_ddp_wrap(r.m, g, &o, &err))) FAIL("wrap: %s", err.msg);
    cddp_adamw_options a = cddp_adamw_defaults(1e-2f);
    a.beta2 = 0.95f;
    a.eps = 1e-5f; /* see tests/ddp/ddp_check.c: gpt_adamw */
    a.weight_decay = 0.1f;
    a.decay_matrices_only = true;
    if (!(r.opt = cddp_optim_adamw(r.m, &a, &err))) FAIL("adamw: %s", err.msg);
    return r;
}

static void stop(run *r) {
    cddp_optim_destroy(r->opt);
    cddp_ddp_destroy(r->d);
    cddp_model_destroy(r->m);
}

static bool sync_every; /* accumulation without no_sync: every micro-step reduced */
/* accum_unused: the aux head in the first micro-step only, on every rank: in the second no rank
 * uses it, so its gradient stays the first one's */
static bool aux_first_only;

/* The loss of this rank's micro-batch a (of accum) at step s: the same data for both copies. */
static cddp_tensor *loss_of(cddp_ctx *ctx, const run *r, kind k, int s, int a, int accum,
                            bool unused) {
    int64_t per = B * 2 / accum, first = (int64_t)rank * B * 2 + a * per;
    cddp_rng g;
    cddp_rng_seed(&g, (uint64_t)s * 7919u + (uint64_t)first);
    cddp_tensor *loss;
    if (k == GPT) {
        int64_t *x = malloc(sizeof(int64_t) * (size_t)(per * GPT_T));
        int64_t *y = malloc(sizeof(int64_t) * (size_t)(per * GPT_T)), rows = per * GPT_T;
        for (int64_t i = 0; i < per; i++) {
            int64_t tok[GPT_T + 1];
            for (int j = 0; j <= GPT_T; j++) tok[j] = (int64_t)cddp_rng_below(&g, GPT_V);
            memcpy(x + i * GPT_T, tok, sizeof tok - sizeof tok[0]);
            memcpy(y + i * GPT_T, tok + 1, sizeof tok - sizeof tok[0]);
        }
        cddp_tensor *xt = cddp_from_data(ctx, CDDP_I64, 2, (int64_t[]){per, GPT_T}, x);
        cddp_tensor *yt = cddp_from_data(ctx, CDDP_I64, 1, &rows, y);
        free(x);
        free(y);
        cddp_tensor *logits = cddp_model_forward(r->m, ctx, xt);
        loss = cddp_cross_entropy(ctx, cddp_reshape(ctx, logits, 2, (int64_t[]){rows, GPT_V}), yt,
                                  CDDP_REDUCE_MEAN);
    } else {
        bool conv = k == CNN || k == BN;
        int n = conv ? 64 : D;
        float *x = malloc(sizeof(float) * (size_t)(n * per));
        int64_t *y = malloc(sizeof(int64_t) * (size_t)per);
        for (int64_t i = 0; i < per * n; i++) x[i] = cddp_rng_uniform(&g) * 2 - 1;
        for (int64_t i = 0; i < per; i++) y[i] = (int64_t)cddp_rng_below(&g, O);
        cddp_tensor *xt = conv ? cddp_from_data(ctx, CDDP_F32, 4, (int64_t[]){per, 1, 8, 8}, x)
                               : cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){per, n}, x);
        cddp_tensor *yt = cddp_from_data(ctx, CDDP_I64, 1, &per, y);
        free(x);
        free(y);
        if (conv) {
            loss = cddp_cross_entropy(ctx, cddp_model_forward(r->m, ctx, xt), yt, CDDP_REDUCE_MEAN);
        } else { /* fc3, and the aux head on some steps and ranks */
            cddp_model_notify(r->m, CDDP_EVENT_FORWARD);
#define P(name) cddp_model_find(r->m, name)
            cddp_tensor *h = cddp_relu(ctx, cddp_linear(ctx, xt, P("fc1.weight"), P("fc1.bias")));
            h = cddp_relu(ctx, cddp_linear(ctx, h, P("fc2.weight"), P("fc2.bias")));
            loss = cddp_cross_entropy(ctx, cddp_linear(ctx, h, P("fc3.weight"), P("fc3.bias")), yt,
                                      CDDP_REDUCE_MEAN);
            if (aux_first_only ? a == 0 : !unused || (s + rank) % 2 == 0)
                loss = cddp_add(
                    ctx, loss,
                    cddp_cross_entropy(ctx, cddp_linear(ctx, h, P("aux.weight"), P("aux.bias")), yt,
                                       CDDP_REDUCE_MEAN));
#undef P
        }
    }
    return cddp_scale(ctx, loss, 1.0f / (float)accum);
}

static void step(cddp_ctx *ctx, run *r, kind k, int s, int accum, bool unused) {
    cddp_optim_set_lr(r->opt, cddp_lr_warmup_cosine(s, 1e-2f, 1e-3f, 2, STEPS));
    cddp_model_zero_grad(r->m);
    for (int a = 0; a < accum; a++) {
        cddp_ddp_no_sync(r->d, !sync_every && a + 1 < accum);
        cddp_ctx_reset(ctx);
        if (cddp_backward(ctx, loss_of(ctx, r, k, s, a, accum, unused)) != CDDP_OK)
            FAIL("step %d: backward: %s", s + 1, cddp_ctx_error(ctx));
    }
    if (k == GPT) cddp_clip_grad_norm(r->m, 0.5);
}

/* The largest difference of block a from block b over [lo, hi), relative to b's largest value. */
static double rel_diff(const float *a, const float *b, int64_t lo, int64_t hi, double scale) {
    double dmax = 0;
    for (int64_t e = lo; e < hi; e++) dmax = fmax(dmax, fabs((double)a[e] - (double)b[e]));
    return scale > 0 ? dmax / scale : dmax;
}

static double largest(const float *x, int64_t n) {
    double m = 0;
    for (int64_t e = 0; e < n; e++) m = fmax(m, fabs((double)x[e]));
    return m;
}

static void same_params(const run *got, const run *ref, double tol, const char *what, int s) {
    int64_t n = (int64_t)cddp_model_numel(ref->m);
    const float *a = on_host(cddp_model_data(got->m), n), *b = on_host(cddp_model_data(ref->m), n);
    double d = rel_diff(a, b, 0, n, largest(b, n));
    if (d > tol)
        FAIL("after step %d: %s's parameters differ from DDP's by %g of the largest", s + 1, what,
             d);
}

/* BatchNorm's running statistics (DDP's broadcast from rank 0 at each forward, under every stage)
 * within tol of the reference's, relative to its largest. */
static void same_buffers(const run *got, const run *ref, double tol, const char *what, int s) {
    int64_t n = (int64_t)cddp_model_buffer_numel(ref->m);
    if (n == 0) return;
    const float *a = on_host(cddp_model_buffer_data(got->m), n),
                *b = on_host(cddp_model_buffer_data(ref->m), n);
    double d = rel_diff(a, b, 0, n, largest(b, n));
    if (d > tol)
        FAIL("after step %d: %s's buffers differ from DDP's by %g of the largest", s + 1, what, d);
}

/* Stage 2: after a synchronised backward, the gradients outside the shard are zero. */
static void released_outside(const run *r, int s) {
    int64_t n = (int64_t)cddp_model_numel(r->m), at = 0;
    const float *g = on_host(cddp_model_grad(r->m), n);
    const int64_t *shard;
    int nshard = cddp_model_shard(r->m, &shard, NULL);
    for (int i = 0; i <= nshard; i++) {
        int64_t end = i < nshard ? shard[2 * i] : n;
        for (int64_t e = at; e < end; e++)
            if (g[e] != 0.0f)
                FAIL("step %d: ZeRO-2 kept gradient %lld (%g), outside this rank's shard", s + 1,
                     (long long)e, (double)g[e]);
        if (i < nshard) at = shard[2 * i + 1];
    }
}

static int stage = 1;

static int equal(cddp_comm *g, kind k, double cap_mb, const char *variant) {
    aux_first_only = strcmp(variant, "accum_unused") == 0;
    bool sum = !strcmp(variant, "sum"), unused = !strcmp(variant, "unused") || aux_first_only;
    int accum = !strcmp(variant, "nosync") || !strncmp(variant, "accum", 5) ? 2 : 1;
    sync_every = strncmp(variant, "accum", 5) == 0;
    cddp_ddp_options o = {.bucket_cap_mb = cap_mb,
                          .sum = sum,
                          .find_unused_parameters = unused,
                          .hook = !strcmp(variant, "bf16")   ? CDDP_DDP_HOOK_BF16
                                  : !strcmp(variant, "fp16") ? CDDP_DDP_HOOK_FP16
                                                             : CDDP_DDP_HOOK_NONE};
    run ddp = start(k, g, o);
    o.shard_optimizer = true;
    o.shard_gradients = stage == 2;
    run zero = start(k, g, o);
    cddp_ctx *ctx = check_ctx();
    int64_t n = (int64_t)cddp_model_numel(ddp.m);
    const int64_t *shard; /* valid until the shard is set again (cddp_ddp_save does) */
    int nshard;
    char path[64];
    snprintf(path, sizeof path, "zero_%d.safetensors", (int)k);
    cddp_error err = {0};
    for (int s = 0; s < STEPS; s++) {
        step(ctx, &ddp, k, s, accum, unused);
        step(ctx, &zero, k, s, accum, unused);
        if (stage == 2) released_outside(&zero, s);
        const float *gz = on_host(cddp_model_grad(zero.m), n),
                    *gd = on_host(cddp_model_grad(ddp.m), n);
        double scale = largest(gd, n);
        nshard = cddp_model_shard(zero.m, &shard, NULL);
        for (int i = 0; i < nshard; i++) {
            double d = rel_diff(gz, gd, shard[2 * i], shard[2 * i + 1], scale);
            if (d > 1e-6)
                FAIL("step %d: the shard's reduced gradients differ from DDP's by %g of the "
                     "largest",
                     s + 1, d);
        }
        cddp_optim_step(ddp.opt);
        cddp_optim_step(zero.opt);
        same_params(&zero, &ddp, 1e-6, "the sharded run", s);
        same_buffers(&zero, &ddp, 1e-6, "the sharded run", s);
        /* At step 5: the sharded run's file and set (each rank writes its shard), and plain
         * DDP's set (each rank an even share). */
        if (s + 1 == SAVE_AT &&
            (cddp_ddp_save(zero.d, path, zero.opt, NULL, &err) != CDDP_OK ||
             cddp_ddp_save_set(zero.d, "zero_sets", s + 1, 1, zero.opt, NULL, &err) != CDDP_OK ||
             cddp_ddp_save_set(ddp.d, "ddp_sets", s + 1, 1, ddp.opt, NULL, &err) != CDDP_OK))
            FAIL("save: %s", err.msg);
    }
    /* The state is the shard's alone, and the shards make the model. */
    nshard = cddp_model_shard(zero.m, &shard, NULL);
    int64_t mine = 0, most = (n + world - 1) / world + cddp_ddp_num_buckets(zero.d);
    for (int i = 0; i < nshard; i++) mine += shard[2 * i + 1] - shard[2 * i];
    if ((int64_t)cddp_optim_state_numel(zero.opt) != mine || (world > 1 && mine > most))
        FAIL("the optimizer keeps %zu elements of state for a shard of %lld (at most %lld)",
             cddp_optim_state_numel(zero.opt), (long long)mine, (long long)most);
    int64_t total = mine;
    if (cddp_comm_allreduce(g, &total, &total, 1, CDDP_COMM_I64, CDDP_COMM_SUM, -1, &err))
        FAIL("allreduce: %s", err.msg);
    if (total != n)
        FAIL("the shards hold %lld elements, the model %lld", (long long)total, (long long)n);
    /* The step-5 checkpoints: the sharded set resumed sharded, the sharded file resumed plain,
     * plain DDP's set resumed sharded. */
    o.shard_optimizer = true;
    run again = start(k, g, o), cross = start(k, g, o);
    o.shard_optimizer = o.shard_gradients = false;
    run plain = start(k, g, o);
    if (cddp_ddp_load(again.d, "zero_sets", again.opt, NULL, &err) != CDDP_OK ||
        cddp_ddp_load(plain.d, path, plain.opt, NULL, &err) != CDDP_OK ||
        cddp_ddp_load(cross.d, "ddp_sets", cross.opt, NULL, &err) != CDDP_OK)
        FAIL("load: %s", err.msg);
    for (int s = SAVE_AT; s < STEPS; s++) {
        step(ctx, &again, k, s, accum, unused);
        step(ctx, &plain, k, s, accum, unused);
        step(ctx, &cross, k, s, accum, unused);
        cddp_optim_step(again.opt);
        cddp_optim_step(plain.opt);
        cddp_optim_step(cross.opt);
    }
    same_params(&again, &zero, 0.0, "the sharded run resumed from its set at step 5", STEPS - 1);
    same_buffers(&again, &zero, 0.0, "the sharded run resumed from its set at step 5", STEPS - 1);
    same_params(&plain, &ddp, 1e-6, "a plain DDP run resumed from the sharded checkpoint",
                STEPS - 1);
    same_params(&cross, &zero, 1e-6, "a sharded run resumed from plain DDP's set", STEPS - 1);
    printf("ok: rank %d of %d: ZeRO-%d, %s%s%s, %d buckets: %d AdamW steps with the optimizer "
           "sharded (%lld of %lld elements of state here) equal DDP; its file and set resume "
           "sharded and plain, DDP's set resumes sharded\n",
           rank, world, stage,
           k == GPT   ? "gpt"
           : k == CNN ? "cnn"
           : k == BN  ? "bn"
                      : "mlp",
           *variant ? " " : "", variant, cddp_ddp_num_buckets(zero.d), STEPS, (long long)mine,
           (long long)n);
    stop(&cross);
    stop(&plain);
    stop(&again);
    stop(&zero);
    stop(&ddp);
    cddp_ctx_destroy(ctx);
    return 0;
}

static void expect(int rc, const cddp_error *err, const char *needle, const char *what) {
    if (rc == CDDP_OK) FAIL("%s was accepted", what);
    if (!strstr(err->msg, needle)) FAIL("%s: message '%s' lacks '%s'", what, err->msg, needle);
}

static int refuse(cddp_comm *g) {
    cddp_error err = {0};
    cddp_model *m = make_model(MLP);
    cddp_ddp *d =
        cddp_ddp_wrap(m, g, &(cddp_ddp_options){.shard_optimizer = true, .join = true}, &err);
    expect(d ? CDDP_OK : err.code, &err, "shard_optimizer does not go with join", "join");
    d = cddp_ddp_wrap(
        m, g, &(cddp_ddp_options){.shard_optimizer = true, .hook = CDDP_DDP_HOOK_POWERSGD}, &err);
    expect(d ? CDDP_OK : err.code, &err, "shard_optimizer does not go with the powersgd hook",
           "powersgd");
    cddp_model_destroy(m);
    run z = start(MLP, g, (cddp_ddp_options){.shard_optimizer = true});
    cddp_ctx *ctx = check_ctx();
    step(ctx, &z, MLP, 0, 1, false);
    cddp_optim_step(z.opt);
    if (world > 1) {
        int rc = cddp_checkpoint_save("refused.safetensors", z.m, z.opt, NULL, &err);
        expect(rc, &err, "sharded across the ranks (ZeRO-1): save and load it with cddp_ddp_save",
               "cddp_checkpoint_save of a sharded optimizer");
        if (fopen("refused.safetensors", "r")) FAIL("a refused save left a file");
    }
    printf("ok: rank %d of %d: shard_optimizer refuses join and powersgd, and "
           "cddp_checkpoint_save of its shard\n",
           rank, world);
    cddp_ctx_destroy(ctx);
    stop(&z);
    return 0;
}

/* The pages of [p, p + bytes) the system backs now (mincore). */
static size_t resident_pages(const void *p, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
    size_t n = ((uintptr_t)p + bytes - a + page - 1) / page, count = 0;
    unsigned char *vec = malloc(n);
    if (!vec || mincore((void *)a, n * page, vec) != 0) FAIL("mincore: %s", strerror(errno));
    for (size_t i = 0; i < n; i++) count += vec[i] & 1;
    free(vec);
    return count;
}

/* One step of a GPT of 3.4 MB of gradients and a parameter of 1 MB that no rank uses (wrapped with
 * find_unused_parameters: its gradient is restored as it was), in buckets of 0.25 MB, under ZeRO-1
 * and ZeRO-2: the gradient pages the system backs after backward and after zero_grad. */
static void memory_of(cddp_comm *g, int zero_stage, size_t *after_backward, size_t *after_zero,
                      size_t *pages, size_t *bound, cddp_ddp_memory *mem) {
    cddp_error err = {0};
    cddp_gpt_config c = {
        .vocab_size = 512, .block_size = 16, .n_layer = 4, .n_head = 4, .n_embd = 128};
    cddp_model *m = cddp_model_create_with(cddp_nn_gpt(&c), &err);
    int unused; /* 1 MB that no rank uses: its gradient restored as it was, each step */
    if (!m ||
        cddp_model_add_param(m, "unused", 1, (int64_t[]){1 << 18},
                             (cddp_init){CDDP_INIT_CONSTANT, 0, 0}, &unused) ||
        cddp_model_build(m, 11))
        FAIL("cannot make the GPT: %s", err.msg);
    run r = {m, NULL, NULL};
    cddp_ddp_options o = {.bucket_cap_mb = 0.25,
                          .find_unused_parameters = true,
                          .shard_optimizer = true,
                          .shard_gradients = zero_stage == 2,
                          .overlap = CDDP_DDP_OVERLAP_INLINE};
    if (!(r.d = cddp_ddp_wrap(m, g, &o, &err))) FAIL("wrap: %s", err.msg);
    cddp_adamw_options a = cddp_adamw_defaults(1e-3f);
    if (!(r.opt = cddp_optim_adamw(m, &a, &err))) FAIL("adamw: %s", err.msg);
    cddp_ctx *ctx = check_ctx();
    int64_t x[2 * 16], y[2 * 16], rows = 2 * 16;
    for (int i = 0; i < 2 * 16; i++) x[i] = (i * 7 + rank) % 512, y[i] = (i * 5 + 1) % 512;
    cddp_model_zero_grad(m);
    cddp_tensor *logits =
        cddp_model_forward(m, ctx, cddp_from_data(ctx, CDDP_I64, 2, (int64_t[]){2, 16}, x));
    cddp_tensor *loss =
        cddp_cross_entropy(ctx, cddp_reshape(ctx, logits, 2, (int64_t[]){rows, 512}),
                           cddp_from_data(ctx, CDDP_I64, 1, &rows, y), CDDP_REDUCE_MEAN);
    if (cddp_backward(ctx, loss) != CDDP_OK) FAIL("backward: %s", cddp_ctx_error(ctx));
    size_t bytes = cddp_model_numel(m) * sizeof(float), page = (size_t)sysconf(_SC_PAGESIZE);
    *pages = (bytes + page - 1) / page + 1;
    *after_backward = resident_pages(cddp_model_grad(m), bytes);
    cddp_optim_step(r.opt);
    cddp_model_zero_grad(m);
    *after_zero = resident_pages(cddp_model_grad(m), bytes);
    *mem = cddp_ddp_memory_get(r.d, r.opt);
    *bound = (mem->grads + page - 1) / page + 2 * (size_t)cddp_ddp_num_buckets(r.d) + 2;
    cddp_ctx_destroy(ctx);
    stop(&r);
}

static int memory(cddp_comm *g) {
    if (strcmp(cddp_device_name(check_device()), "cpu") != 0)
        FAIL("memory: the CPU's pages only (CDDP_TEST_DEVICE is %s)",
             cddp_device_name(check_device()));
    size_t b1, z1, b2, z2, pages, bound1, bound2;
    cddp_ddp_memory m1, m2;
    memory_of(g, 1, &b1, &z1, &pages, &bound1, &m1);
    memory_of(g, 2, &b2, &z2, &pages, &bound2, &m2);
    size_t numel = m1.params / sizeof(float);
    if (m1.stage != 1 || m2.stage != 2 || m1.grads != m1.params || m2.params != m1.params ||
        m2.optimizer != m1.optimizer || m2.optimizer != 2 * m2.grads)
        FAIL("cddp_ddp_memory_get: stage %d/%d, parameters %zu/%zu, gradients %zu/%zu, "
             "optimizer %zu/%zu bytes (ZeRO-1/ZeRO-2)",
             m1.stage, m2.stage, m1.params, m2.params, m1.grads, m2.grads, m1.optimizer,
             m2.optimizer);
    /* the shard: a world'th of the gradients, give or take an element a bucket */
    size_t share = (numel + (size_t)world - 1) / (size_t)world * sizeof(float);
    if (m2.grads > share + 64 * sizeof(float) ||
        m2.grads + 64 * sizeof(float) * (size_t)world < share)
        FAIL("ZeRO-2 keeps %zu bytes of gradients, where a world'th is %zu", m2.grads, share);
    /* ZeRO-1 keeps every page; ZeRO-2 the shard's, after backward and after zero_grad */
    if (b1 + 2 < pages - 1 || z1 + 2 < pages - 1)
        FAIL("ZeRO-1 backs %zu and %zu of the gradients' %zu pages: all expected", b1, z1,
             pages - 1);
    if (b2 > bound2 || z2 > bound2)
        FAIL("ZeRO-2 backs %zu pages after backward and %zu after zero_grad, of %zu: at most %zu "
             "(the shard's)",
             b2, z2, pages - 1, bound2);
    printf("ok: rank %d of %d: the gradients' pages the system backs: ZeRO-1 %zu and %zu of %zu, "
           "ZeRO-2 %zu and %zu (bound %zu), after backward and after zero_grad; %zu of %zu "
           "bytes of gradients kept\n",
           rank, world, b1, z1, pages - 1, b2, z2, bound2, m2.grads, m2.params);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: zero_check [--stage 1|2] mlp|cnn|bn|gpt [CAP_MB] "
                        "[sum|nosync|accum|accum_unused|unused|bf16|fp16] | refuse | memory\n");
        return 2;
    }
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) FAIL("cannot create the group: %s", err.msg);
    rank = cddp_comm_rank(g);
    world = cddp_comm_size(g);
    int status;
    const char *env = getenv("CDDP_TEST_ZERO_STAGE");
    if (env && *env) stage = atoi(env);
    if (!strcmp(argv[1], "--stage") && argc > 3) {
        stage = atoi(argv[2]);
        if (stage != 1 && stage != 2) FAIL("--stage %s: 1 or 2", argv[2]);
        argv += 2, argc -= 2;
    }
    if (stage != 1 && stage != 2) FAIL("stage %d: 1 or 2 (CDDP_TEST_ZERO_STAGE, --stage)", stage);
    const char *mode = argv[1];
    if (!strcmp(mode, "refuse"))
        status = refuse(g);
    else if (!strcmp(mode, "memory"))
        status = memory(g);
    else if (!strcmp(mode, "mlp") || !strcmp(mode, "cnn") || !strcmp(mode, "bn") ||
             !strcmp(mode, "gpt"))
        status = equal(g,
                       !strcmp(mode, "gpt")   ? GPT
                       : !strcmp(mode, "cnn") ? CNN
                       : !strcmp(mode, "bn")  ? BN
                                              : MLP,
                       argc > 2 ? atof(argv[2]) : 0, argc > 3 ? argv[3] : "");
    else
        FAIL("unknown mode %s", mode);
    cddp_comm_destroy(g);
    return status;
}
