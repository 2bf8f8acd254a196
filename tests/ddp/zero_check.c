/* zero_check.c: the sharded optimizer (ZeRO-1) across real processes, started by cddprun,
 * against plain DistributedDataParallel in the same program: two copies of a model, one wrapped
 * with shard_optimizer, one without, the same batches on each rank.
 *
 *   zero_check mlp|cnn|gpt [CAP_MB] [sum|nosync|unused|bf16]
 *       10 AdamW steps (the GPT: GPT-2's recipe, clipping at 0.5 and the schedule); after every
 *       step the parameters within 1e-6 of DDP's (relative to the model's largest), the reduced
 *       gradients of this rank's shard within 1e-6 too; each rank's optimizer state is its shard
 *       alone (the ranks' shards add up to the model, none larger than its share plus one element
 *       per bucket); the MLP's odd layer widths give every world size uneven shards.
 *       A checkpoint saved at step 5 by the sharded run continues, loaded into a fresh sharded
 *       run, bit for bit like the uninterrupted one, and loaded into a fresh plain DDP run like
 *       DDP (within 1e-6).
 *       bf16: both runs with the bf16 hook (the sharded one reduce-scatters 16-bit copies, DDP
 *       allreduces them), the same bounds.
 *   zero_check refuse
 *       shard_optimizer with join and with the powersgd hook: wrapping fails saying why; a
 *       sharded optimizer's state cannot go through cddp_checkpoint_save, which names the way.
 * Prints "ok: ..." and exits 0 when every check holds on this rank; exits 1 saying why.
 */
#define CHECK_NAME "zero_check"
#include "check.h"

enum { B = 4, D = 6, O = 3, STEPS = 10, SAVE_AT = 5, GPT_T = 8, GPT_V = 32 };

typedef enum { MLP, CNN, GPT } kind;

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
    } else if (k == CNN) {
        m = cddp_model_create();
        rc |= cddp_model_add(m, "conv1", cddp_nn_conv2d(1, 4, 3, 1, 1));
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
        int n = k == CNN ? 64 : D;
        float *x = malloc(sizeof(float) * (size_t)(n * per));
        int64_t *y = malloc(sizeof(int64_t) * (size_t)per);
        for (int64_t i = 0; i < per * n; i++) x[i] = cddp_rng_uniform(&g) * 2 - 1;
        for (int64_t i = 0; i < per; i++) y[i] = (int64_t)cddp_rng_below(&g, O);
        cddp_tensor *xt = k == CNN ? cddp_from_data(ctx, CDDP_F32, 4, (int64_t[]){per, 1, 8, 8}, x)
                                   : cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){per, n}, x);
        cddp_tensor *yt = cddp_from_data(ctx, CDDP_I64, 1, &per, y);
        free(x);
        free(y);
        if (k == CNN) {
            loss = cddp_cross_entropy(ctx, cddp_model_forward(r->m, ctx, xt), yt, CDDP_REDUCE_MEAN);
        } else { /* fc3, and the aux head on some steps and ranks */
            cddp_model_notify(r->m, CDDP_EVENT_FORWARD);
#define P(name) cddp_model_find(r->m, name)
            cddp_tensor *h = cddp_relu(ctx, cddp_linear(ctx, xt, P("fc1.weight"), P("fc1.bias")));
            h = cddp_relu(ctx, cddp_linear(ctx, h, P("fc2.weight"), P("fc2.bias")));
            loss = cddp_cross_entropy(ctx, cddp_linear(ctx, h, P("fc3.weight"), P("fc3.bias")), yt,
                                      CDDP_REDUCE_MEAN);
            if (!unused || (s + rank) % 2 == 0)
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
        cddp_ddp_no_sync(r->d, a + 1 < accum);
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

static int equal(cddp_comm *g, kind k, double cap_mb, const char *variant) {
    bool sum = !strcmp(variant, "sum"), unused = !strcmp(variant, "unused");
    int accum = !strcmp(variant, "nosync") ? 2 : 1;
    cddp_ddp_options o = {.bucket_cap_mb = cap_mb,
                          .sum = sum,
                          .find_unused_parameters = unused,
                          .hook =
                              !strcmp(variant, "bf16") ? CDDP_DDP_HOOK_BF16 : CDDP_DDP_HOOK_NONE};
    run ddp = start(k, g, o);
    o.shard_optimizer = true;
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
    o.shard_optimizer = false;
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
    same_params(&plain, &ddp, 1e-6, "a plain DDP run resumed from the sharded checkpoint",
                STEPS - 1);
    same_params(&cross, &zero, 1e-6, "a sharded run resumed from plain DDP's set", STEPS - 1);
    printf("ok: rank %d of %d: %s%s%s, %d buckets: %d AdamW steps with the optimizer sharded "
           "(%lld of %lld elements of state here) equal DDP; its file and set resume sharded and "
           "plain, DDP's set resumes sharded\n",
           rank, world,
           k == GPT   ? "gpt"
           : k == CNN ? "cnn"
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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: zero_check mlp|cnn|gpt [CAP_MB] [sum|nosync|unused] | refuse\n");
        return 2;
    }
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) FAIL("cannot create the group: %s", err.msg);
    rank = cddp_comm_rank(g);
    world = cddp_comm_size(g);
    int status;
    const char *mode = argv[1];
    if (!strcmp(mode, "refuse"))
        status = refuse(g);
    else if (!strcmp(mode, "mlp") || !strcmp(mode, "cnn") || !strcmp(mode, "gpt"))
        status = equal(g,
                       !strcmp(mode, "gpt")   ? GPT
                       : !strcmp(mode, "cnn") ? CNN
                                              : MLP,
                       argc > 2 ? atof(argv[2]) : 0, argc > 3 ? argv[3] : "");
    else
        FAIL("unknown mode %s", mode);
    cddp_comm_destroy(g);
    return status;
}
