/* ddp_check.c: DistributedDataParallel across real processes, started by cddprun, checked
 * against a single-process reference computed in the same program.
 *
 *   ddp_check equal mlp|cnn [CAP_MB]  5 SGD-momentum steps, batch B per rank on rank slices, vs
 *                                     one model on the whole N*B batch: within 1e-5 relative
 *   ddp_check nosync                  2 accumulation steps per update (no_sync), same equality
 *   ddp_check sum                     sum mode: N times the mean's gradients
 *   ddp_check unused                  a branch used on some steps and ranks, a parameter no
 *                                     rank uses: find_unused_parameters matches the reference;
 *                                     buckets are rebuilt in rank 0's ready order
 *   ddp_check unused_noflag           the same model without the flag: every rank fails
 *                                     naming the parameter and the flag
 *   ddp_check join                    rank i has 3 + i batches: join, final parameters equal
 *                                     the reference on every rank
 *   ddp_check join_throw              the same with join_throw: every rank fails naming rank 0
 *   ddp_check mismatch shape|option   rank 1 wraps another model / other options
 *   ddp_check resume DIR              3 steps, save on rank 0, load everywhere, 3 more = 6
 *                                     uninterrupted steps, bit for bit
 *   ddp_check buffers [off]           a BatchNorm model: rank 0's running statistics reach every
 *                                     rank at wrap and before each training forward (with off:
 *                                     only at wrap), then each rank updates them from its batch
 *   ddp_check buffers join            the BatchNorm model, rank i has 3 + i batches: join shadows
 *                                     the buffer broadcasts too; every rank ends with the buffers
 *                                     of the rank that trained longest
 *   ddp_check syncbn                  a ResNet whose BatchNorms take every rank's batch
 *                                     (cddp_model_sync_batch_norm): ranks with 8 + 2 rank
 *                                     samples give the running statistics of one process on all
 *                                     of them; then 5 steps on rank slices equal one process
 *                                     with plain BatchNorms on the whole batch (parameters and
 *                                     running statistics within 1e-5)
 *   ddp_check hook                    a communication hook of the user's (comm_hook): the mean
 *                                     by two collectives in the hook equals DDP's own, bit for
 *                                     bit, and the reference; a failing hook fails every rank
 *   ddp_check ignored                 a forward whose output is dropped before each step's, with
 *                                     and without find_unused_parameters: equal the reference
 *   ddp_check assign                  how parameters of given sizes are cut into buckets
 *   ddp_check gpt ACCUM [CAP_MB]      a GPT with its tied head, GPT-2's recipe (AdamW on matrices,
 *                                     clipping, warmup and cosine), ACCUM micro-steps per step
 *                                     (no_sync), B sequences per rank and micro-step: 5 steps
 *                                     equal one process on N*B (every reduced gradient within
 *                                     1e-5 of one process's at the same parameters, the
 *                                     parameters within 1e-5 of one process's after each step,
 *                                     see compare_grads and compare_to_scale); the tied weight is
 *                                     reduced once
 * Prints "ok: ..." and exits 0 when every check holds on this rank; exits 1 saying why. The models
 * live on the check device (check.h).
 */
#define CHECK_NAME "ddp_check"
#include "check.h"

enum { B = 8, D = 6, H = 5, O = 3, STEPS = 5 };

/* ---- models and data --------------------------------------------------------------------- */

typedef enum { MLP, CNN, CUSTOM, NORM, RESNET, WIDE } kind;
static int in_features(kind k) {
    return k == CNN || k == RESNET ? 64 : D;
}

static cddp_model *make_model(kind k, uint64_t seed, bool odd) {
    /* a stem, a block of 8 channels and one of 16 with a stride-2 shortcut: blocked activations,
     * the three BatchNorm ops */
    cddp_resnet_config rc8 = {.in_channels = 1, .classes = O, .widths = {8, 16}, .blocks = 1};
    cddp_error err = {0};
    cddp_model *m =
        k == RESNET ? cddp_model_create_with(cddp_nn_resnet(&rc8), &err) : cddp_model_create();
    if (!m) FAIL("cannot make the model: %s", err.msg);
    int rc = 0;
    if (k == MLP) {
        rc |= cddp_model_add(m, "fc1", cddp_nn_linear(D, odd ? 7 : 16));
        rc |= cddp_model_add(m, "relu1", cddp_nn_relu());
        rc |= cddp_model_add(m, "fc2", cddp_nn_linear(odd ? 7 : 16, 16));
        rc |= cddp_model_add(m, "relu2", cddp_nn_relu());
        rc |= cddp_model_add(m, "fc3", cddp_nn_linear(16, O));
    } else if (k == WIDE) { /* a 256 x 256 matrix, whose gradient has rank <= the batch */
        rc |= cddp_model_add(m, "fc1", cddp_nn_linear(D, 256));
        rc |= cddp_model_add(m, "relu1", cddp_nn_relu());
        rc |= cddp_model_add(m, "fc2", cddp_nn_linear(256, 256));
        rc |= cddp_model_add(m, "relu2", cddp_nn_relu());
        rc |= cddp_model_add(m, "fc3", cddp_nn_linear(256, O));
    } else if (k == NORM) {
        rc |= cddp_model_add(m, "bn", cddp_nn_batch_norm(D));
        rc |= cddp_model_add(m, "fc", cddp_nn_linear(D, O));
    } else if (k == CNN) {
        rc |= cddp_model_add(m, "conv1", cddp_nn_conv2d(1, 4, 3, 1, 1));
        rc |= cddp_model_add(m, "relu1", cddp_nn_relu());
        rc |= cddp_model_add(m, "pool1", cddp_nn_max_pool2d(2, 2));
        rc |= cddp_model_add(m, "conv2", cddp_nn_conv2d(4, 8, 3, 1, 1));
        rc |= cddp_model_add(m, "relu2", cddp_nn_relu());
        rc |= cddp_model_add(m, "pool2", cddp_nn_max_pool2d(2, 2));
        rc |= cddp_model_add(m, "flatten", cddp_nn_flatten());
        rc |= cddp_model_add(m, "fc", cddp_nn_linear(32, O));
    } else if (k == CUSTOM) {
        cddp_init u = {CDDP_INIT_UNIFORM, -0.5f, 0.5f};
        rc |= cddp_model_add_param(m, "a.weight", 2, (int64_t[]){H, D}, u, NULL);
        rc |= cddp_model_add_param(m, "b.weight", 2, (int64_t[]){H, H}, u, NULL);
        rc |= cddp_model_add_param(m, "branch.weight", 2, (int64_t[]){H, H}, u, NULL);
        rc |= cddp_model_add_param(m, "head.weight", 2, (int64_t[]){O, H}, u, NULL);
        rc |= cddp_model_add_param(m, "never.weight", 1, (int64_t[]){3}, u, NULL);
    }
    if (rc || cddp_model_build(m, seed)) FAIL("cannot build the model: %s", cddp_model_error(m));
    return on_device(m);
}

/* Sample i of step s: the same values in every process. */
static void sample(int s, int64_t i, float *x, int n, int64_t *label) {
    cddp_rng r;
    cddp_rng_seed(&r, (uint64_t)s * 100003u + (uint64_t)i);
    for (int k = 0; k < n; k++) x[k] = cddp_rng_uniform(&r) * 2 - 1;
    *label = (int64_t)(cddp_rng_next(&r) % O);
}

/* The loss of samples [first, first + count) of step s; CUSTOM uses the branch when branch. */
static cddp_tensor *loss_of(cddp_ctx *ctx, cddp_model *m, kind k, int s, int64_t first,
                            int64_t count, bool branch) {
    int n = in_features(k);
    float *x = malloc(sizeof(float) * (size_t)(n * count));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)count);
    for (int64_t i = 0; i < count; i++) sample(s, first + i, x + i * n, n, y + i);
    cddp_tensor *xt = k == CNN || k == RESNET
                          ? cddp_from_data(ctx, CDDP_F32, 4, (int64_t[]){count, 1, 8, 8}, x)
                          : cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){count, n}, x);
    cddp_tensor *yt = cddp_from_data(ctx, CDDP_I64, 1, (int64_t[]){count}, y);
    free(x);
    free(y);
    cddp_tensor *out;
    if (k != CUSTOM) {
        out = cddp_model_forward(m, ctx, xt);
    } else {
        cddp_tensor *h = cddp_relu(ctx, cddp_linear(ctx, xt, cddp_model_find(m, "a.weight"), NULL));
        if (branch)
            h = cddp_add(
                ctx, h,
                cddp_relu(ctx, cddp_linear(ctx, h, cddp_model_find(m, "branch.weight"), NULL)));
        h = cddp_relu(ctx, cddp_linear(ctx, h, cddp_model_find(m, "b.weight"), NULL));
        out = cddp_linear(ctx, h, cddp_model_find(m, "head.weight"), NULL);
    }
    return cddp_cross_entropy(ctx, out, yt, CDDP_REDUCE_MEAN);
}

static bool uses_branch(int s, int r) {
    return (s + r) % 2 == 0;
}

/* Every parameter within 1e-5 of the reference, relative to the tensor's largest value. */
static void compare(const cddp_model *got, const cddp_model *ref, const char *when) {
    for (int i = 0; i < cddp_model_num_params(ref); i++) {
        const cddp_tensor *a = cddp_model_param(got, i), *b = cddp_model_param(ref, i);
        const float *ah = on_host(a->data, a->numel), *bh = on_host(b->data, b->numel);
        double dmax = 0, rmax = 0;
        for (int64_t e = 0; e < b->numel; e++) {
            dmax = fmax(dmax, fabs(ah[e] - bh[e]));
            rmax = fmax(rmax, fabs(bh[e]));
        }
        if (dmax > 1e-5 * rmax)
            FAIL("%s: %s differs from the single-process reference by %g (largest value %g)", when,
                 b->name, dmax, rmax);
    }
}

/* Every buffer (running statistics) within 1e-5 of the reference's, relative to the largest. */
static void compare_buffers(const cddp_model *got, const cddp_model *ref, const char *when) {
    int64_t n = (int64_t)cddp_model_buffer_numel(ref);
    const float *a = on_host(cddp_model_buffer_data(got), n),
                *b = on_host(cddp_model_buffer_data(ref), n);
    double dmax = 0, rmax = 0;
    int64_t worst = 0;
    for (int64_t e = 0; e < n; e++) {
        if (fabs(a[e] - b[e]) > dmax) dmax = fabs(a[e] - b[e]), worst = e;
        rmax = fmax(rmax, fabs(b[e]));
    }
    if (dmax > 1e-5 * rmax)
        FAIL("%s: buffer value %lld is %.7g, the single-process reference's %.7g", when,
             (long long)worst, a[worst], b[worst]);
}

static cddp_optim *sgd(cddp_model *m) {
    cddp_error err = {0};
    cddp_optim *o = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.1f, .momentum = 0.9f}, &err);
    if (!o) FAIL("sgd: %s", err.msg);
    return o;
}

/* DDP over m, with the transport CDDP_DDP_TRANSPORT names (the option is left to it): nccl in
 * tests/nccl/nccl_test.sh with its stand-in for NCCL, ipc on the emulated device in ctest. */
static cddp_ddp *wrap(cddp_model *m, cddp_comm *g, cddp_ddp_options o) {
    cddp_error err = {0};
    cddp_ddp *d = cddp_ddp_wrap(m, g, &o, &err);
    if (!d) FAIL("wrap: %s", err.msg);
    return d;
}

static void backward(cddp_ctx *ctx, cddp_tensor *loss, const char *what) {
    if (cddp_backward(ctx, loss) != CDDP_OK) FAIL("%s: backward: %s", what, cddp_ctx_error(ctx));
}

/* Step s's backward of m (DDP) on this rank's slice of B, and of ref on the whole batch. */
static void ddp_and_reference(cddp_ctx *ctx, cddp_model *m, cddp_model *ref, kind k, int s) {
    cddp_model_zero_grad(m);
    cddp_model_zero_grad(ref);
    cddp_ctx_reset(ctx);
    backward(ctx, loss_of(ctx, m, k, s, (int64_t)rank * B, B, false), "ddp");
    cddp_ctx_reset(ctx);
    backward(ctx, loss_of(ctx, ref, k, s, 0, (int64_t)world * B, false), "reference");
}

/* Frees what a mode made (the optimizers may be NULL). */
static void release(cddp_ctx *ctx, cddp_optim *om, cddp_optim *oref, cddp_ddp *d, cddp_model *m,
                    cddp_model *ref) {
    cddp_ctx_destroy(ctx);
    cddp_optim_destroy(om);
    cddp_optim_destroy(oref);
    cddp_ddp_destroy(d);
    cddp_model_destroy(m);
    cddp_model_destroy(ref);
}

/* ---- modes ------------------------------------------------------------------------------- */

/* Uneven inputs with buffers: the joined ranks shadow the buffer broadcast of every step. */
static int buffers_join(cddp_comm *g) {
    cddp_model *m = make_model(NORM, 1, false);
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.join = true});
    cddp_optim *om = sgd(m);
    cddp_ctx *ctx = check_ctx();
    cddp_error err = {0};
    for (int s = 0; s < 3 + rank; s++) {
        cddp_model_zero_grad(m);
        cddp_ctx_reset(ctx);
        backward(ctx, loss_of(ctx, m, NORM, s, (int64_t)rank * B, B, false), "ddp");
        cddp_optim_step(om);
    }
    if (cddp_ddp_join(d, &err) != CDDP_OK) FAIL("join: %s", err.msg);
    int nb = (int)cddp_model_buffer_numel(m);
    float *all = malloc(sizeof(float) * (size_t)(nb * world));
    if (cddp_comm_allgather(g, on_host(cddp_model_buffer_data(m), nb), all, nb, CDDP_COMM_F32, 30,
                            &err))
        FAIL("allgather: %s", err.msg);
    for (int r = 0; r < world; r++)
        if (memcmp(all + r * nb, all + (world - 1) * nb, sizeof(float) * (size_t)nb) != 0)
            FAIL("after join, rank %d's buffers differ from rank %d's (which trained longest)", r,
                 world - 1);
    printf("ok: rank %d of %d: %d batches with buffers, joined; every rank has rank %d's buffers\n",
           rank, world, 3 + rank, world - 1);
    free(all);
    release(ctx, om, NULL, d, m, NULL);
    return 0;
}

/* BatchNorm's buffers: every rank starts from its own running statistics (rank + 1), which the
 * wrap replaces with rank 0's; each step, this rank's running statistics must be the momentum
 * update, from this rank's batch, of rank 0's values before the step (broadcast) or of its own
 * (off). Every value is checked against one computed here in double. */
static int buffers(cddp_comm *g, bool off) {
    cddp_model *m = make_model(NORM, 1, false);
    int nb = (int)cddp_model_buffer_numel(m); /* running_mean (D), running_var (D) */
    float mine[D];
    for (int i = 0; i < D; i++) mine[i] = (float)(rank + 1);
    to_device(cddp_model_buffer_data(m), mine, D);
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.no_broadcast_buffers = off});
    const float *buf = on_host(cddp_model_buffer_data(m), nb);
    for (int i = 0; i < D; i++)
        if (buf[i] != 1.0f) FAIL("after wrap, running_mean[%d] = %g, not rank 0's 1", i, buf[i]);
    cddp_optim *om = sgd(m);
    cddp_ctx *ctx = check_ctx();
    float *all = malloc(sizeof(float) * (size_t)(nb * world)), x[D];
    cddp_error err = {0};
    int differ = 0;
    for (int s = 0; s < STEPS; s++) {
        buf = on_host(cddp_model_buffer_data(m), nb);
        if (cddp_comm_allgather(g, buf, all, nb, CDDP_COMM_F32, 30, &err) != CDDP_OK)
            FAIL("allgather: %s", err.msg);
        for (int r = 1; r < world; r++)
            differ += memcmp(all, all + r * nb, sizeof(float) * (size_t)nb) != 0;
        const float *from = off ? buf : all; /* rank 0's block comes first */
        double want[2 * D];
        for (int i = 0; i < D; i++) {
            double sum = 0, sq = 0;
            for (int64_t j = 0; j < B; j++) {
                int64_t label;
                sample(s, (int64_t)rank * B + j, x, D, &label);
                sum += x[i];
                sq += (double)x[i] * x[i];
            }
            double mean = sum / B, var = (sq - B * mean * mean) / (B - 1);
            want[i] = 0.9 * from[i] + 0.1 * mean;
            want[D + i] = 0.9 * from[D + i] + 0.1 * var;
        }
        cddp_model_zero_grad(m);
        cddp_ctx_reset(ctx);
        backward(ctx, loss_of(ctx, m, NORM, s, (int64_t)rank * B, B, false), "ddp");
        cddp_optim_step(om);
        buf = on_host(cddp_model_buffer_data(m), nb);
        for (int i = 0; i < 2 * D; i++)
            if (fabs(buf[i] - want[i]) > 1e-5 * fmax(1.0, fabs(want[i])))
                FAIL("step %d: %s[%d] = %.7g, want %.7g (the update of %s)", s + 1,
                     i < D ? "running_mean" : "running_var", i % D, buf[i], want[i],
                     off ? "this rank's own" : "rank 0's broadcast");
    }
    if (world > 1 && differ == 0)
        FAIL("the ranks' buffers never differed before a step: the check proves nothing");
    printf("ok: rank %d of %d: BatchNorm buffers %s over %d steps\n", rank, world,
           off ? "kept per rank" : "broadcast from rank 0 before each forward", STEPS);
    free(all);
    release(ctx, om, NULL, d, m, NULL);
    return 0;
}

/* Sync BatchNorm in a ResNet (blocked activations; batch_norm_relu, batch_norm_add_relu and a
 * shortcut's batch_norm). First one training forward on batches of 8 + 2 rank samples: the
 * running statistics of every rank are those of one process on all of them (each rank's count
 * weighs its statistics). Then STEPS steps of DDP on slices of B equal the reference with plain
 * BatchNorms on the whole batch. */
static void compare_grads(const cddp_model *got, const cddp_model *ref, double tol,
                          const char *when);
static int syncbn(cddp_comm *g) {
    cddp_model *m = make_model(RESNET, 1, false), *ref = make_model(RESNET, 1, false);
    int nbn = cddp_model_sync_batch_norm(m, g);
    if (nbn != 6) FAIL("cddp_model_sync_batch_norm found %d BatchNorms, not the ResNet's 6", nbn);
    cddp_ctx *ctx = check_ctx();
    int64_t first = 0, total = 0;
    for (int r = 0; r < world; r++) total += 8 + 2 * r, first += r < rank ? 8 + 2 * r : 0;
    cddp_tensor *l = loss_of(ctx, m, RESNET, 100, first, 8 + 2 * rank, false);
    cddp_ctx_reset(ctx);
    cddp_tensor *lr = loss_of(ctx, ref, RESNET, 100, 0, total, false);
    if (!l || !lr) FAIL("uneven forward: %s", cddp_ctx_error(ctx));
    compare_buffers(m, ref, "uneven batches, after one forward");
    cddp_model_destroy(m);
    cddp_model_destroy(ref);
    m = make_model(RESNET, 1, false), ref = make_model(RESNET, 1, false);
    cddp_model_sync_batch_norm(m, g);
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.bucket_cap_mb = 0.0005});
    cddp_optim *om = sgd(m), *oref = sgd(ref);
    for (int s = 0; s < STEPS; s++) {
        ddp_and_reference(ctx, m, ref, RESNET, s);
        char when[64];
        snprintf(when, sizeof when, "step %d", s + 1);
        compare_grads(m, ref, 1e-5, when);
        cddp_optim_step(om);
        cddp_optim_step(oref);
        snprintf(when, sizeof when, "after step %d", s + 1);
        compare(m, ref, when);
        compare_buffers(m, ref, when);
    }
    printf("ok: rank %d of %d: a ResNet's %d BatchNorms on every rank's batch: uneven batches' "
           "running statistics and %d steps equal the single-process reference; products in %s\n",
           rank, world, nbn, STEPS, cddp_dtype_name(cddp_ctx_compute(ctx)));
    release(ctx, om, oref, d, m, ref);
    return 0;
}

/* STEPS steps of m (DDP d, on this rank's slices of B) and of ref (on the whole batch), each of
 * accumulate micro-steps (no_sync before the last), the parameters compared after each; with
 * dropped, each micro-step's forward of m comes after one on the same slice whose loss no
 * backward reads. */
static void steps_equal(cddp_ctx *ctx, cddp_ddp *d, cddp_model *m, cddp_model *ref, cddp_optim *om,
                        cddp_optim *oref, kind k, int accumulate, bool dropped, const char *what) {
    for (int s = 0; s < STEPS; s++) {
        cddp_model_zero_grad(m);
        cddp_model_zero_grad(ref);
        for (int a = 0; a < accumulate; a++) {
            int step = s * accumulate + a;
            cddp_ddp_no_sync(d, a + 1 < accumulate);
            cddp_ctx_reset(ctx);
            if (dropped && !loss_of(ctx, m, k, step, (int64_t)rank * B, B, false))
                FAIL("the dropped forward failed: %s", cddp_ctx_error(ctx));
            backward(ctx, loss_of(ctx, m, k, step, (int64_t)rank * B, B, false), "ddp");
            cddp_ctx_reset(ctx);
            backward(ctx, loss_of(ctx, ref, k, step, 0, (int64_t)world * B, false), "reference");
        }
        cddp_optim_step(om);
        cddp_optim_step(oref);
        char when[96];
        snprintf(when, sizeof when, "%safter step %d", what, s + 1);
        compare(m, ref, when);
    }
}

/* Forwards whose output is dropped (PyTorch's test_ignored_output and
 * test_ignored_output_with_unused_parameters): before each step's real forward, a training-mode
 * forward on the same slice whose loss no backward reads; with and without
 * find_unused_parameters, STEPS steps equal the reference. */
static int ignored(cddp_comm *g) {
    for (int flag = 0; flag < 2; flag++) {
        cddp_model *m = make_model(MLP, 1, false), *ref = make_model(MLP, 1, false);
        cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.find_unused_parameters = flag});
        cddp_optim *om = sgd(m), *oref = sgd(ref);
        cddp_ctx *ctx = check_ctx();
        steps_equal(ctx, d, m, ref, om, oref, MLP, 1, true,
                    flag ? "ignored outputs with find_unused_parameters, " : "ignored outputs, ");
        release(ctx, om, oref, d, m, ref);
    }
    printf("ok: rank %d of %d: a dropped forward before each step, with and without "
           "find_unused_parameters: %d steps equal the single-process reference\n",
           rank, world, STEPS);
    return 0;
}

/* The buckets DDP cuts a model of parameters of sizes[0..n) floats (declared in that order) into,
 * with bucket_cap_mb cap, as "[3] [2 1] [0]" (launch order: the last declared first). */
static void buckets_of(cddp_comm *g, const int64_t *sizes, int n, double cap, char *out,
                       size_t len) {
    cddp_model *m = cddp_model_create();
    cddp_init u = {CDDP_INIT_UNIFORM, -0.5f, 0.5f};
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "p%d", i);
        if (cddp_model_add_param(m, name, 1, &sizes[i], u, NULL)) FAIL("add_param %d", i);
    }
    if (cddp_model_build(m, 1)) FAIL("cannot build: %s", cddp_model_error(m));
    cddp_ddp *d = wrap(on_device(m), g, (cddp_ddp_options){.bucket_cap_mb = cap});
    size_t at = 0;
    out[0] = '\0';
    for (int b = 0; b < cddp_ddp_num_buckets(d); b++) {
        int params[16], k = cddp_ddp_bucket_params(d, b, params, 16);
        for (int j = 0; j < k && at < len; j++)
            at += (size_t)snprintf(out + at, len - at, "%s%d%s",
                                   j   ? " "
                                   : b ? " ["
                                       : "[",
                                   params[j], j + 1 == k ? "]" : "");
    }
    cddp_ddp_destroy(d);
    cddp_model_destroy(m);
}

/* Bucket assignment (PyTorch's ComputeBucketAssignmentTest, on DDP's rule: parameters join the
 * open bucket, in reverse declaration order, until it holds at least its limit, the first one's
 * min(1 MiB, cap), the others' cap; one that is not a range of the flat block stays open up to
 * twice the limit):
 *  - PyTorch's single limit: floats 50, 100, 200, 100 declared (the last launched first) with a
 *    400-byte cap: each its own bucket, [3] [2] [1] [0]; 10 floats each with 80 and 120 bytes;
 *  - the first bucket's 1 MiB under a 4 MB cap and under a 1 MB one. */
static int assign(cddp_comm *g) {
    struct {
        int64_t sizes[6];
        int n;
        double cap;
        const char *want;
    } cases[] = {
        {{50, 100, 200, 100}, 4, 400.0 / (1 << 20), "[3] [2] [1] [0]"},
        {{10, 10, 10, 10}, 4, 80.0 / (1 << 20), "[3 2] [1 0]"},
        {{10, 10, 10, 10, 10}, 5, 120.0 / (1 << 20), "[4 3 2] [1 0]"},
        /* 1 MiB closes the first bucket (its third parameter takes it to 1.5 MiB), then the
         * cap */
        {{1 << 18, 1 << 18, 1 << 18, 1 << 16, 1 << 16}, 5, 4, "[4 3 2] [1 0]"},
        {{1 << 20, 1 << 18, 1 << 16}, 3, 1, "[2 1] [0]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char got[128];
        buckets_of(g, cases[c].sizes, cases[c].n, cases[c].cap, got, sizeof got);
        if (strcmp(got, cases[c].want))
            FAIL("bucket assignment, case %zu: %s, not %s", c, got, cases[c].want);
    }
    printf("ok: rank %d of %d: bucket assignment as PyTorch's rule gives it in %zu cases\n", rank,
           world, sizeof cases / sizeof cases[0]);
    return 0;
}

/* DDP on slices vs the reference on the whole batch; accumulate micro-steps with no_sync. */
static int equal(cddp_comm *g, kind k, double cap_mb, int accumulate) {
    cddp_model *m = make_model(k, 1, false), *ref = make_model(k, 1, false);
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.bucket_cap_mb = cap_mb});
    cddp_optim *om = sgd(m), *oref = sgd(ref);
    cddp_ctx *ctx = check_ctx();
    steps_equal(ctx, d, m, ref, om, oref, k, accumulate, false, "");
    cddp_ddp_stats st = cddp_ddp_stats_get(d);
    if (st.steps != STEPS)
        FAIL("the statistics count %lld synchronised steps", (long long)st.steps);
    /* one rank: the mean of one gradient is itself, and nothing is reduced nor copied */
    size_t bytes = world == 1 ? 0 : cddp_model_numel(m) * sizeof(float);
    if ((world == 1 ? st.comm_s != 0 : st.comm_s <= 0) || st.bytes != bytes ||
        (st.comm_inline && st.overlap != 0) || st.overlap < 0 || st.overlap > 1)
        FAIL("the statistics say comm %g s, %zu bytes (expected %zu), overlap %g, inline %d",
             st.comm_s, st.bytes, bytes, st.overlap, (int)st.comm_inline);
    printf("ok: rank %d of %d: %s, %d buckets, %d accumulation step(s): %d steps equal the "
           "single-process reference; buckets %s %s; products in %s\n",
           rank, world, k == MLP ? "mlp" : "cnn", cddp_ddp_num_buckets(d), accumulate, STEPS,
           world == 1 ? "left as they are (one rank)," : "reduced",
           st.comm_inline ? "inline" : "on the communication thread",
           cddp_dtype_name(cddp_ctx_compute(ctx)));
    release(ctx, om, oref, d, m, ref);
    return 0;
}

/* A communication hook of the user's: the mean as DDP's allreduce makes it (the sum, then
 * divided by the ranks), in two halves, by two blocking collectives from inside the hook
 * (docs/DISTRIBUTED.md shows it: tests/check_doc_programs.sh checks that it is this one). */
static int mean_by_halves(void *state, cddp_comm *group, int bucket, float *grads, int64_t count,
                          cddp_error *err) {
    (void)state, (void)bucket;
    int64_t half = count / 2;
    CDDP_TRY(cddp_comm_allreduce(group, grads, grads, half, CDDP_COMM_F32, CDDP_COMM_SUM, -1, err));
    CDDP_TRY(cddp_comm_allreduce(group, grads + half, grads + half, count - half, CDDP_COMM_F32,
                                 CDDP_COMM_SUM, -1, err));
    cddp_comm_divide(CDDP_COMM_F32, grads, count, cddp_comm_size(group));
    return CDDP_OK;
}

/* mean_by_halves, counting its calls, and failing (a planted error) at call fail_call on rank
 * fail_rank. */
typedef struct mean_hook {
    int calls, fail_rank, fail_call;
} mean_hook;

static int counted_mean(void *state, cddp_comm *group, int bucket, float *grads, int64_t count,
                        cddp_error *err) {
    mean_hook *h = state;
    if (h->calls++ == h->fail_call && rank == h->fail_rank)
        return cddp_error_set(err, CDDP_EINVAL, "planted failure on rank %d", rank);
    return mean_by_halves(state, group, bucket, grads, count, err);
}

/* Linear(1, 5), the same on every rank. */
static cddp_model *linear_1_5(void) {
    cddp_model *m = cddp_model_create();
    if (cddp_model_add(m, "fc", cddp_nn_linear(1, 5)) || cddp_model_build(m, 7))
        FAIL("cannot build Linear(1, 5): %s", cddp_model_error(m));
    return on_device(m);
}

/* The backward of sum(m(x)) for x = this rank's number, a (1, 1) batch. */
static int rank_backward(cddp_ctx *ctx, cddp_model *m) {
    float x = (float)rank;
    cddp_model_zero_grad(m);
    cddp_ctx_reset(ctx);
    cddp_tensor *in = cddp_from_host(ctx, CDDP_F32, 2, (int64_t[]){1, 1}, &x);
    return cddp_backward(ctx, cddp_sum(ctx, cddp_model_forward(m, ctx, in)));
}

/* comm_hook (PyTorch's register_comm_hook), each step's buckets through mean_by_halves:
 *  - parity (PyTorch's test_ddp_hook_parity_allreduce): Linear(1, 5) with input = the rank's
 *    number, 100 steps: the weight's gradient is the ranks' mean, (W - 1) / 2, every time, with
 *    the hook and without it, and the two models' parameters are the same bits after every step;
 *  - the MLP in buckets of 0.0005 MB: 5 steps equal the single-process reference (1e-5), the hook
 *    called once per bucket and step;
 *  - a hook that fails (the last rank's, at its second call): that rank's backward fails naming
 *    the bucket and its reason, and every other rank's at once, naming that rank;
 *  - the wrap refuses it with another hook, sum, shard_optimizer, join and the nccl transport. */
static int hook(cddp_comm *g) {
    cddp_error err = {0};
    mean_hook h = {.fail_rank = -1, .fail_call = -1};
    cddp_model *bad = make_model(MLP, 1, false);
    struct {
        cddp_ddp_options o;
        const char *says;
    } refused[] = {{{.hook = CDDP_DDP_HOOK_BF16}, "does not go with a hook"},
                   {{.sum = true}, "does not go with sum"},
                   {{.shard_optimizer = true}, "does not go with shard_optimizer"},
                   {{.join = true}, "does not go with join"},
                   {{.transport = "nccl"},
                    "a comm_hook reduces host memory: it does not go with the nccl transport"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        refused[i].o.comm_hook = counted_mean;
        refused[i].o.comm_hook_state = &h;
        cddp_ddp *d = cddp_ddp_wrap(bad, g, &refused[i].o, &err);
        if (d || !strstr(err.msg, refused[i].says))
            FAIL("comm_hook: case %zu wrapped, or said '%s', not '%s'", i, d ? "" : err.msg,
                 refused[i].says);
    }
    cddp_model_destroy(bad);

    /* parity */
    cddp_model *plain = linear_1_5(), *hooked = linear_1_5();
    cddp_ddp *dp = wrap(plain, g, (cddp_ddp_options){0});
    cddp_ddp *dh =
        wrap(hooked, g, (cddp_ddp_options){.comm_hook = counted_mean, .comm_hook_state = &h});
    cddp_optim *op = sgd(plain), *oh = sgd(hooked);
    cddp_ctx *ctx = check_ctx();
    size_t n = cddp_model_numel(hooked);
    float *want = malloc(n * sizeof(float)), *pp = malloc(n * sizeof(float));
    for (int s = 0; s < 100; s++) {
        if (rank_backward(ctx, plain) || rank_backward(ctx, hooked))
            FAIL("comm_hook parity, step %d: backward: %s", s + 1, cddp_ctx_error(ctx));
        memcpy(pp, on_host(cddp_model_grad(plain), (int64_t)n), n * sizeof(float));
        const float *gh = on_host(cddp_model_grad(hooked), (int64_t)n);
        for (size_t e = 0; e < n; e++) /* fc.weight (5, 1), then fc.bias (5) */
            want[e] = e < 5 ? (float)(world - 1) / 2.0f : 1.0f;
        if (memcmp(gh, want, n * sizeof(float)) || memcmp(pp, want, n * sizeof(float)))
            FAIL("comm_hook parity, step %d: the gradients are not the mean of the ranks' "
                 "(weight %g with the hook, %g without; expected %g)",
                 s + 1, gh[0], pp[0], want[0]);
        cddp_optim_step(op);
        cddp_optim_step(oh);
        memcpy(pp, on_host(cddp_model_data(plain), (int64_t)n), n * sizeof(float));
        if (memcmp(pp, on_host(cddp_model_data(hooked), (int64_t)n), n * sizeof(float)))
            FAIL("comm_hook parity, after step %d: the parameters differ from DDP's own", s + 1);
    }
    if (h.calls != 100) FAIL("comm_hook parity: the hook was called %d times, not 100", h.calls);
    free(want);
    free(pp);
    release(ctx, op, NULL, dp, plain, NULL);
    cddp_optim_destroy(oh);
    cddp_ddp_destroy(dh);
    cddp_model_destroy(hooked);

    /* the MLP in several buckets against the reference */
    h.calls = 0;
    cddp_model *m = make_model(MLP, 1, false), *ref = make_model(MLP, 1, false);
    cddp_ddp *d =
        wrap(m, g,
             (cddp_ddp_options){
                 .bucket_cap_mb = 0.0005, .comm_hook = counted_mean, .comm_hook_state = &h});
    cddp_optim *om = sgd(m), *oref = sgd(ref);
    ctx = check_ctx();
    steps_equal(ctx, d, m, ref, om, oref, MLP, 1, false, "comm_hook, ");
    int buckets = cddp_ddp_num_buckets(d);
    if (buckets < 2 || h.calls != STEPS * buckets)
        FAIL("comm_hook: %d calls for %d steps of %d buckets", h.calls, STEPS, buckets);
    release(ctx, om, oref, d, m, ref);

    /* a failure: the last rank's hook at its second call (the second step) */
    h = (mean_hook){.fail_rank = world - 1, .fail_call = 1};
    m = linear_1_5();
    d = wrap(m, g, (cddp_ddp_options){.comm_hook = counted_mean, .comm_hook_state = &h});
    ctx = check_ctx();
    if (rank_backward(ctx, m)) FAIL("comm_hook, step 1: backward: %s", cddp_ctx_error(ctx));
    if (rank_backward(ctx, m) == CDDP_OK) FAIL("comm_hook: the planted failure went unnoticed");
    char says[160];
    if (rank == world - 1)
        snprintf(says, sizeof says,
                 "DDP: the comm_hook failed on bucket 0: planted failure on rank %d", rank);
    else
        snprintf(says, sizeof says, "rank %d aborted the group: DDP: the comm_hook failed",
                 world - 1);
    if (!strstr(cddp_ctx_error(ctx), says))
        FAIL("comm_hook: the failure says '%s', not '%s'", cddp_ctx_error(ctx), says);
    release(ctx, NULL, NULL, d, m, NULL);
    printf("ok: rank %d of %d: comm_hook: the mean in 100 steps as DDP's own, bit for bit; %d "
           "buckets equal the reference; a failing hook fails every rank, naming rank %d\n",
           rank, world, buckets, world - 1);
    return 0;
}

/* The largest difference between two gradient blocks, relative to b's largest value. */
static double grad_gap(const float *a, const float *b, size_t n) {
    double dmax = 0, rmax = 0;
    for (size_t e = 0; e < n; e++) {
        dmax = fmax(dmax, fabs(a[e] - b[e]));
        rmax = fmax(rmax, fabs(b[e]));
    }
    return dmax / rmax;
}

/* PowerSGD (a model whose 256 x 256 matrix is compressed, the other matrices being too small to
 * gain, and the biases travelling whole):
 *  - rank 32 from step 1: the matrix's gradient sums the outer products of at most 32 samples
 *    (8 a rank, 4 ranks at most), so the first approximation (Q random) spans it: step 1's
 *    gradients equal the reference's on the whole batch within 1e-5; the statistics count the
 *    bytes of P, Q and the whole gradients;
 *  - rank 1 from step 3: steps 1 and 2 are plain allreduces (within 1e-5), later steps are not
 *    the mean (compressed), and every rank holds the same parameters after each step;
 *  - error feedback: with the parameters fixed (lr 0) and the same batch every step, the mean
 *    of 200 rank-1 gradients comes within 2 % of the true mean gradient, which one rank-1
 *    gradient misses by 10 times more.
 * And the wrap refuses it with join, shard_optimizer, the nccl transport and a negative rank,
 * saying why. */
static int powersgd(cddp_comm *g) {
    cddp_error err = {0};
    size_t n = 0;
    cddp_model *bad = make_model(WIDE, 1, false);
    struct {
        cddp_ddp_options o;
        const char *says;
    } refused[] = {
        {{.hook = CDDP_DDP_HOOK_POWERSGD, .join = true}, "the powersgd hook does not go with join"},
        {{.hook = CDDP_DDP_HOOK_POWERSGD, .shard_optimizer = true},
         "shard_optimizer does not go with the powersgd hook"},
        {{.hook = CDDP_DDP_HOOK_POWERSGD, .transport = "nccl"},
         "the powersgd hook reduces host memory: it does not go with the nccl transport"},
        {{.hook = CDDP_DDP_HOOK_POWERSGD, .powersgd_rank = -1},
         "powersgd_rank and powersgd_start_step must not be negative"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        cddp_ddp *d = cddp_ddp_wrap(bad, g, &refused[i].o, &err);
        if (d || !strstr(err.msg, refused[i].says))
            FAIL("powersgd: case %zu wrapped, or said '%s', not '%s'", i, d ? "" : err.msg,
                 refused[i].says);
    }
    cddp_model_destroy(bad);
    for (int pass = 0; pass < 2; pass++) {
        int r = pass == 0 ? 32 : 1, start = pass == 0 ? 1 : 3;
        cddp_model *m = make_model(WIDE, 1, false), *ref = make_model(WIDE, 1, false);
        n = cddp_model_numel(m);
        cddp_ddp *d = wrap(m, g,
                           (cddp_ddp_options){.bucket_cap_mb = 0.0005,
                                              .hook = CDDP_DDP_HOOK_POWERSGD,
                                              .powersgd_rank = r,
                                              .powersgd_start_step = start});
        cddp_optim *om = sgd(m), *oref = sgd(ref);
        cddp_ctx *ctx = check_ctx();
        float *all = malloc(sizeof(float) * n * (size_t)world);
        for (int s = 0; s < (pass == 0 ? 1 : STEPS); s++) {
            ddp_and_reference(ctx, m, ref, WIDE, s);
            double gap = grad_gap(on_host(cddp_model_grad(m), (int64_t)n),
                                  on_host(cddp_model_grad(ref), (int64_t)n), n);
            bool mean = pass == 0 || s + 1 < start;
            if (mean && gap > 1e-5)
                FAIL("powersgd rank %d, step %d: the gradients are %g from the mean", r, s + 1,
                     gap);
            if (!mean && gap < 1e-3)
                FAIL("powersgd rank 1, step %d: the gradients are the mean (%g): not compressed",
                     s + 1, gap);
            cddp_optim_step(om);
            cddp_optim_step(oref);
            if (cddp_comm_allgather(g, on_host(cddp_model_data(m), (int64_t)n), all, (int64_t)n,
                                    CDDP_COMM_F32, 30, &err))
                FAIL("allgather: %s", err.msg);
            for (int q = 1; q < world; q++)
                if (memcmp(all, all + n * (size_t)q, n * sizeof(float)))
                    FAIL("powersgd, after step %d: rank %d's parameters differ from rank 0's",
                         s + 1, q);
        }
        /* rank 32: the 256 x 256 matrix sends 32 (256 + 256) floats */
        size_t want = (n - 256 * 256 + 32 * (256 + 256)) * sizeof(float);
        cddp_ddp_stats st = cddp_ddp_stats_get(d);
        if (pass == 0 && st.bytes != want)
            FAIL("powersgd: the statistics count %zu bytes a step, not %zu", st.bytes, want);
        free(all);
        release(ctx, om, oref, d, m, ref);
    }
    /* error feedback */
    cddp_model *m = make_model(WIDE, 1, false), *ref = make_model(WIDE, 1, false);
    cddp_ddp *d =
        wrap(m, g, (cddp_ddp_options){.hook = CDDP_DDP_HOOK_POWERSGD, .powersgd_start_step = 1});
    cddp_optim *om = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.0f}, &err);
    if (!om) FAIL("sgd: %s", err.msg);
    cddp_ctx *ctx = check_ctx();
    cddp_model_zero_grad(ref);
    backward(ctx, loss_of(ctx, ref, WIDE, 0, 0, (int64_t)world * B, false), "reference");
    const float *want = on_host(cddp_model_grad(ref), (int64_t)n);
    double *sum = calloc(n, sizeof(double)), first = 0;
    float *mean = malloc(n * sizeof(float));
    enum { T = 200 };
    for (int s = 0; s < T; s++) {
        cddp_model_zero_grad(m);
        cddp_ctx_reset(ctx);
        backward(ctx, loss_of(ctx, m, WIDE, 0, (int64_t)rank * B, B, false), "ddp");
        const float *got = on_host(cddp_model_grad(m), (int64_t)n);
        if (s == 0) first = grad_gap(got, want, n);
        for (size_t e = 0; e < n; e++) sum[e] += got[e];
        cddp_optim_step(om);
    }
    for (size_t e = 0; e < n; e++) mean[e] = (float)(sum[e] / T);
    double gap = grad_gap(mean, want, n);
    if (!(gap < 0.02 && first > 10 * gap))
        FAIL("powersgd error feedback: the mean of %d rank-1 gradients is %g from the true "
             "gradient (the first one %g)",
             T, gap, first);
    printf("ok: rank %d of %d: powersgd: rank 32 spans the batch's gradient, rank 1 the same "
           "parameters on every rank, error feedback: %d steps' mean %.3g from the gradient (one "
           "step %.3g)\n",
           rank, world, T, gap, first);
    free(sum);
    free(mean);
    release(ctx, om, NULL, d, m, ref);
    return 0;
}

static int sum_mode(cddp_comm *g) {
    cddp_model *m = make_model(MLP, 1, false), *ref = make_model(MLP, 1, false);
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.sum = true});
    cddp_ctx *ctx = check_ctx();
    cddp_model_zero_grad(m);
    cddp_model_zero_grad(ref);
    backward(ctx, loss_of(ctx, m, MLP, 0, (int64_t)rank * B, B, false), "ddp");
    cddp_ctx_reset(ctx);
    backward(ctx, loss_of(ctx, ref, MLP, 0, 0, (int64_t)world * B, false), "reference");
    const float *a = on_host(cddp_model_grad(m), (int64_t)cddp_model_numel(m)),
                *b = on_host(cddp_model_grad(ref), (int64_t)cddp_model_numel(ref));
    double dmax = 0, rmax = 0;
    for (size_t e = 0; e < cddp_model_numel(m); e++) {
        dmax = fmax(dmax, fabs(a[e] - world * b[e]));
        rmax = fmax(rmax, fabs(world * b[e]));
    }
    if (dmax > 1e-5 * rmax) FAIL("sum: gradients are not %d x the mean's (off by %g)", world, dmax);
    printf("ok: rank %d of %d: sum mode gives %d x the mean's gradients\n", rank, world, world);
    release(ctx, NULL, NULL, d, m, ref);
    return 0;
}

/* The branch is used when (step + rank) is even; never.weight by nobody. */
static int unused(cddp_comm *g, bool flag) {
    cddp_model *m = make_model(CUSTOM, 2, false), *ref = make_model(CUSTOM, 2, false);
    cddp_ddp *d =
        wrap(m, g, (cddp_ddp_options){.bucket_cap_mb = 0.0002, .find_unused_parameters = flag});
    cddp_optim *om = sgd(m), *oref = sgd(ref);
    cddp_ctx *ctx = check_ctx();
    cddp_tensor *never = cddp_model_find(m, "never.weight");
    for (int s = 0; s < STEPS; s++) {
        cddp_model_zero_grad(m);
        cddp_model_zero_grad(ref);
        to_device(never->grad, (float[]){7, 8, 9}, 3); /* must stay untouched */
        cddp_ctx_reset(ctx);
        int rc = cddp_backward(
            ctx, loss_of(ctx, m, CUSTOM, s, (int64_t)rank * B, B, uses_branch(s, rank)));
        if (!flag) {
            if (rc == CDDP_OK) continue; /* every rank used the branch this step */
            const char *msg = cddp_ctx_error(ctx);
            /* never.weight is unused everywhere; the branch is named by the ranks that did not
             * use it (the others report the first such rank's message). */
            if (!strstr(msg, "'never.weight'") || !strstr(msg, "find_unused_parameters"))
                FAIL("the error '%s' does not name the parameter and the flag", msg);
            char own[64];
            snprintf(own, sizeof own, "rank %d: parameters", rank);
            if (strstr(msg, own) && !uses_branch(s, rank) && !strstr(msg, "'branch.weight'"))
                FAIL("the error '%s' does not name branch.weight", msg);
            printf("ok: rank %d of %d failed as expected at step %d: %s\n", rank, world, s, msg);
            exit(0);
        }
        if (rc != CDDP_OK) FAIL("backward: %s", cddp_ctx_error(ctx));
        const float *ng = on_host(never->grad, 3);
        for (int e = 0; e < 3; e++)
            if (ng[e] != 7.0f + (float)e) FAIL("never.weight's gradient changed to %g", ng[e]);
        cddp_tensor *total = NULL;
        cddp_ctx_reset(ctx);
        for (int r = 0; r < world; r++) {
            cddp_tensor *l =
                cddp_scale(ctx, loss_of(ctx, ref, CUSTOM, s, (int64_t)r * B, B, uses_branch(s, r)),
                           1.0f / (float)world);
            total = total ? cddp_add(ctx, total, l) : l;
        }
        backward(ctx, total, "reference");
        to_device(never->grad, (float[]){0, 0, 0}, 3); /* the reference's is zero */
        cddp_optim_step(om);
        cddp_optim_step(oref);
        char when[64];
        snprintf(when, sizeof when, "after step %d", s + 1);
        compare(m, ref, when);
        /* Rank 0's ready order: head (60 bytes), b (100), branch (100), a (120); then never
         * (12). A bucket closes once it holds at least 0.0002 MiB (209 bytes). */
        if (s == 0) {
            int want[2][3] = {{3, 1, 2}, {0, 4, -1}}, got[5];
            if (cddp_ddp_num_buckets(d) != 2)
                FAIL("%d buckets after the rebuild, want 2", cddp_ddp_num_buckets(d));
            for (int b = 0; b < 2; b++) {
                int n = cddp_ddp_bucket_params(d, b, got, 5);
                for (int j = 0; j < n; j++)
                    if (n != 3 - b || got[j] != want[b][j])
                        FAIL("bucket %d after the rebuild holds parameter %d (position %d)", b,
                             got[j], j);
            }
        }
    }
    if (!flag) FAIL("no step failed without find_unused_parameters%s", "");
    printf("ok: rank %d of %d: find_unused_parameters matches the reference over %d steps; "
           "buckets rebuilt in ready order; an unused parameter's gradient untouched\n",
           rank, world, STEPS);
    release(ctx, om, oref, d, m, ref);
    return 0;
}

/* Rank r has 3 + r batches. */
static int join(cddp_comm *g, bool throw) {
    cddp_model *m = make_model(MLP, 3, false), *ref = make_model(MLP, 3, false);
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.join = true, .join_throw = throw});
    cddp_optim *om = sgd(m), *oref = sgd(ref);
    cddp_ctx *ctx = check_ctx();
    cddp_error err = {0};
    for (int s = 0; s < 3 + rank; s++) {
        cddp_model_zero_grad(m);
        cddp_ctx_reset(ctx);
        int rc = cddp_backward(ctx, loss_of(ctx, m, MLP, s, (int64_t)rank * B, B, false));
        if (rc != CDDP_OK && throw) {
            const char *msg = cddp_ctx_error(ctx);
            if (!strstr(msg, "rank 0 ran out of inputs"))
                FAIL("the error '%s' does not say that rank 0 ran out of inputs", msg);
            printf("ok: rank %d of %d failed as expected at step %d: %s\n", rank, world, s, msg);
            exit(0);
        }
        if (rc != CDDP_OK) FAIL("backward at step %d: %s", s, cddp_ctx_error(ctx));
        cddp_optim_step(om);
    }
    int rc = cddp_ddp_join(d, &err);
    if (throw) {
        if (world == 1 && rc == CDDP_OK) {
            printf("ok: rank 0 of 1: join_throw with one rank has nobody to shadow\n");
            exit(0);
        }
        if (rc == CDDP_OK || !strstr(err.msg, "ran out of inputs"))
            FAIL("join with join_throw: '%s'", rc ? err.msg : "succeeded");
        printf("ok: rank %d of %d failed as expected in join: %s\n", rank, world, err.msg);
        exit(0);
    }
    if (rc != CDDP_OK) FAIL("join: %s", err.msg);
    /* The reference: step s averages the gradients of the ranks that still had data. */
    for (int s = 0; s < 3 + world - 1; s++) {
        cddp_model_zero_grad(ref);
        cddp_ctx_reset(ctx);
        cddp_tensor *total = NULL;
        for (int r = 0; r < world; r++) {
            if (s >= 3 + r) continue;
            cddp_tensor *l = cddp_scale(ctx, loss_of(ctx, ref, MLP, s, (int64_t)r * B, B, false),
                                        1.0f / (float)world);
            total = total ? cddp_add(ctx, total, l) : l;
        }
        backward(ctx, total, "reference");
        cddp_optim_step(oref);
    }
    compare(m, ref, "after join");
    printf("ok: rank %d of %d: %d batches, joined; the final parameters equal the reference\n",
           rank, world, 3 + rank);
    release(ctx, om, oref, d, m, ref);
    return 0;
}

static int mismatch(cddp_comm *g, const char *what) {
    bool odd = rank == 1;
    cddp_model *m = make_model(MLP, 1, odd && !strcmp(what, "shape"));
    cddp_ddp_options o = {.find_unused_parameters = odd && !strcmp(what, "option")};
    cddp_error err = {0};
    cddp_ddp *d = cddp_ddp_wrap(m, g, &o, &err);
    if (d) FAIL("the wrap succeeded although rank 1 differs (%s)", what);
    const char *want = !strcmp(what, "shape") ? "parameter 0 differs: rank 1 has 'fc1.weight' (7,6)"
                                              : "rank 1 wraps with find_unused_parameters = 1";
    if (!strstr(err.msg, want)) FAIL("the error '%s' lacks '%s'", err.msg, want);
    printf("ok: rank %d of %d failed as expected: %s\n", rank, world, err.msg);
    cddp_model_destroy(m);
    return 0;
}

/* 6 steps straight vs 3 steps, save, a fresh model loading it, 3 steps: bit for bit. */
static int resume(cddp_comm *g, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    cddp_ctx *ctx = check_ctx();
    cddp_error err = {0};
    cddp_model *straight = make_model(MLP, 4, false);
    cddp_ddp *d = wrap(straight, g, (cddp_ddp_options){0});
    cddp_optim *o = sgd(straight);
    for (int s = 0; s < 6; s++) {
        cddp_model_zero_grad(straight);
        cddp_ctx_reset(ctx);
        backward(ctx, loss_of(ctx, straight, MLP, s, (int64_t)rank * B, B, false), "straight");
        cddp_optim_step(o);
    }
    cddp_optim_destroy(o);
    cddp_ddp_destroy(d);

    cddp_model *first = make_model(MLP, 4, false);
    d = wrap(first, g, (cddp_ddp_options){0});
    o = sgd(first);
    for (int s = 0; s < 3; s++) {
        cddp_model_zero_grad(first);
        cddp_ctx_reset(ctx);
        backward(ctx, loss_of(ctx, first, MLP, s, (int64_t)rank * B, B, false), "first half");
        cddp_optim_step(o);
    }
    if (cddp_ddp_save(d, path, o, NULL, &err) != CDDP_OK) FAIL("save: %s", err.msg);
    cddp_optim_destroy(o);
    cddp_ddp_destroy(d);
    cddp_model_destroy(first);

    cddp_model *second = make_model(MLP, 99, false); /* other weights: the load must matter */
    d = wrap(second, g, (cddp_ddp_options){0});
    o = sgd(second);
    if (cddp_ddp_load(d, path, o, NULL, &err) != CDDP_OK) FAIL("load: %s", err.msg);
    for (int s = 3; s < 6; s++) {
        cddp_model_zero_grad(second);
        cddp_ctx_reset(ctx);
        backward(ctx, loss_of(ctx, second, MLP, s, (int64_t)rank * B, B, false), "second half");
        cddp_optim_step(o);
    }
    int64_t n = (int64_t)cddp_model_numel(straight);
    if (memcmp(on_host(cddp_model_data(second), n), on_host(cddp_model_data(straight), n),
               (size_t)n * sizeof(float)) != 0)
        FAIL("3 + 3 steps through a checkpoint differ from 6 straight steps%s", "");
    printf("ok: rank %d of %d: 3 steps, save, load, 3 steps = 6 steps, bit for bit\n", rank, world);
    cddp_optim_destroy(o);
    cddp_ddp_destroy(d);
    cddp_model_destroy(second);
    cddp_model_destroy(straight);
    cddp_ctx_destroy(ctx);
    return 0;
}

/* ---- a GPT ----------------------------------------------------------------------------- */

enum { GPT_T = 8, GPT_V = 32 };

/* 2 heads of 8, or of CDDP_TEST_GPT_HEAD_SIZE (32: heads a GPU attends to by rows, which the
 * emulated device does too, in bf16) */
static cddp_model *gpt_model(void) {
    cddp_error err = {0};
    const char *hs = getenv("CDDP_TEST_GPT_HEAD_SIZE");
    cddp_gpt_config c = {.vocab_size = GPT_V,
                         .block_size = GPT_T,
                         .n_layer = 2,
                         .n_head = 2,
                         .n_embd = 2 * (hs ? atoi(hs) : 8)};
    cddp_model *m = cddp_model_create_with(cddp_nn_gpt(&c), &err);
    if (!m || cddp_model_build(m, 5))
        FAIL("cannot build the GPT: %s", m ? cddp_model_error(m) : err.msg);
    return on_device(m);
}

static cddp_optim *gpt_adamw(cddp_model *m) {
    cddp_error err = {0};
    cddp_adamw_options o = cddp_adamw_defaults(1e-2f);
    o.beta2 = 0.95f;
    /* 1e-5 rather than 1e-8, as in tests/reference/make_fixtures.py: the keys' bias has a zero
     * gradient in exact arithmetic (softmax ignores a shift of every score), so its float32
     * gradient is rounding noise, and Adam would turn the noise's sign into a full step that
     * differs between any two summation orders. */
    o.eps = 1e-5f;
    o.weight_decay = 0.1f;
    o.decay_matrices_only = true;
    cddp_optim *opt = cddp_optim_adamw(m, &o, &err);
    if (!opt) FAIL("adamw: %s", err.msg);
    return opt;
}

/* Mean cross-entropy over the next-token targets of sequences [first, first + count) of step s,
 * divided by accumulate. Token j of sequence i is the same in every process. */
static cddp_tensor *gpt_loss(cddp_ctx *ctx, cddp_model *m, int s, int64_t first, int64_t count,
                             int accumulate) {
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(count * GPT_T)),
            *y = malloc(sizeof(int64_t) * (size_t)(count * GPT_T));
    for (int64_t i = 0; i < count; i++) {
        cddp_rng r;
        cddp_rng_seed(&r, (uint64_t)s * 7919u + (uint64_t)(first + i));
        int64_t tok[GPT_T + 1];
        for (int j = 0; j <= GPT_T; j++) tok[j] = (int64_t)cddp_rng_below(&r, GPT_V);
        memcpy(x + i * GPT_T, tok, sizeof(int64_t) * GPT_T);
        memcpy(y + i * GPT_T, tok + 1, sizeof(int64_t) * GPT_T);
    }
    int64_t rows = count * GPT_T;
    cddp_tensor *xt = cddp_from_data(ctx, CDDP_I64, 2, (int64_t[]){count, GPT_T}, x);
    cddp_tensor *yt = cddp_from_data(ctx, CDDP_I64, 1, &rows, y);
    free(x);
    free(y);
    cddp_tensor *logits = cddp_model_forward(m, ctx, xt);
    cddp_tensor *loss = cddp_cross_entropy(
        ctx, cddp_reshape(ctx, logits, 2, (int64_t[]){rows, GPT_V}), yt, CDDP_REDUCE_MEAN);
    return cddp_scale(ctx, loss, 1.0f / (float)accumulate);
}

/* Every reduced gradient within tol of the reference's, relative to its tensor's largest. */
static void compare_grads(const cddp_model *got, const cddp_model *ref, double tol,
                          const char *when) {
    for (int i = 0; i < cddp_model_num_params(ref); i++) {
        const cddp_tensor *a = cddp_model_param(got, i), *b = cddp_model_param(ref, i);
        const float *ag = on_host(a->grad, a->numel), *bg = on_host(b->grad, b->numel);
        double dmax = 0, rmax = 0;
        for (int64_t e = 0; e < b->numel; e++) {
            dmax = fmax(dmax, fabs(ag[e] - bg[e]));
            rmax = fmax(rmax, fabs(bg[e]));
        }
        if (dmax > tol * rmax)
            FAIL("%s: the gradient of %s differs from the reference's by %g (largest %g)", when,
                 b->name, dmax, rmax);
    }
}

/* Every parameter within tol of the reference, relative to the model's largest parameter value.
 * Per tensor (as compare does) would not measure DDP under Adam: a bias that starts at zero is
 * Adam's update alone, about lr whatever its gradient, and the update of an element whose
 * gradient is near zero moves by up to lr / eps times a rounding difference in that gradient
 * (the sums of a batch split over ranks round differently from the sums of the whole batch). */
static void compare_to_scale(const cddp_model *got, const cddp_model *ref, double tol,
                             const char *when) {
    double dmax = 0, rmax = 0;
    const char *worst = "";
    for (int i = 0; i < cddp_model_num_params(ref); i++) {
        const cddp_tensor *a = cddp_model_param(got, i), *b = cddp_model_param(ref, i);
        const float *ah = on_host(a->data, a->numel), *bh = on_host(b->data, b->numel);
        for (int64_t e = 0; e < b->numel; e++) {
            double d = fabs(ah[e] - bh[e]);
            if (d > dmax) {
                dmax = d;
                worst = b->name;
            }
            rmax = fmax(rmax, fabs(bh[e]));
        }
    }
    if (dmax > tol * rmax)
        FAIL("%s: %s differs from the single-process reference by %g (largest parameter %g)", when,
             worst, dmax, rmax);
}

/* dst's parameters become src's (models of the same shape on the check device). */
static void copy_params(cddp_model *dst, const cddp_model *src) {
    for (int i = 0; i < cddp_model_num_params(src); i++) {
        const cddp_tensor *p = cddp_model_param(src, i);
        to_device(cddp_model_param(dst, i)->data, on_host(p->data, p->numel), p->numel);
    }
}

/* DDP's model m against one process on the whole batch two ways: `at`, the reference's gradients
 * at m's parameters, which every reduced gradient matches within 1e-5 of its tensor's largest at
 * every step in float32 (only the order of the sums differs), and `ref`, the reference trained
 * alongside, whose parameters m's stay within tol of. The two models' parameters part by rounding
 * after the first step, and a gradient that is a sum with much cancellation (an attention
 * projection's bias, over every position) then differs from ref's by more than 1e-5 of
 * itself: 1.04e-5 on 4 ranks on an AVX2 EPYC, where its parameters were 1.3e-6 apart. */
static int gpt(cddp_comm *g, int accumulate, double cap_mb) {
    cddp_model *m = gpt_model(), *ref = gpt_model(), *at = gpt_model();
    cddp_ddp *d = wrap(m, g, (cddp_ddp_options){.bucket_cap_mb = cap_mb});
    cddp_optim *om = gpt_adamw(m), *oref = gpt_adamw(ref);
    cddp_ctx *ctx = check_ctx();
    /* In bf16, once two values differ by float32's rounding (the parameters after a step, a sum
     * split over ranks), an operand may round to the neighbouring bf16 value in one model and not
     * in the other: its products then differ by up to bf16's 2^-8, so later steps hold to 1e-2
     * there (at `at`'s parameters too: 2e-5 on 4 ranks at step 4, the tied embedding's). */
    double tol = cddp_ctx_compute(ctx) == CDDP_BF16 ? 1e-2 : 1e-5;
    for (int s = 0; s < STEPS; s++) {
        float lr = cddp_lr_warmup_cosine(s, 1e-2f, 1e-3f, 2, STEPS);
        cddp_optim_set_lr(om, lr);
        cddp_optim_set_lr(oref, lr);
        copy_params(at, m);
        cddp_model_zero_grad(m);
        cddp_model_zero_grad(ref);
        cddp_model_zero_grad(at);
        for (int a = 0; a < accumulate; a++) {
            int micro = s * accumulate + a;
            cddp_ddp_no_sync(d, a + 1 < accumulate);
            cddp_ctx_reset(ctx);
            backward(ctx, gpt_loss(ctx, m, micro, (int64_t)rank * B, B, accumulate), "ddp");
            cddp_ctx_reset(ctx);
            backward(ctx, gpt_loss(ctx, ref, micro, 0, (int64_t)world * B, accumulate),
                     "reference");
            cddp_ctx_reset(ctx);
            backward(ctx, gpt_loss(ctx, at, micro, 0, (int64_t)world * B, accumulate),
                     "reference at DDP's parameters");
        }
        /* The norms agree before clipping: clipping after DDP's reduction clips alike. */
        double n1 = cddp_clip_grad_norm(m, 0.5), n2 = cddp_clip_grad_norm(at, 0.5);
        cddp_clip_grad_norm(ref, 0.5);
        if (fabs(n1 - n2) > (s == 0 ? 1e-5 : tol) * n2)
            FAIL("step %d: gradient norm %.9g, reference %.9g", s, n1, n2);
        char when[64];
        snprintf(when, sizeof when, "step %d", s + 1);
        compare_grads(m, at, s == 0 ? 1e-5 : tol, when);
        cddp_optim_step(om);
        cddp_optim_step(oref);
        snprintf(when, sizeof when, "after step %d", s + 1);
        compare_to_scale(m, ref, tol, when);
    }
    /* The tied head is one parameter: reduced once, in one bucket (one rank reduces nothing). */
    cddp_ddp_stats st = cddp_ddp_stats_get(d);
    if (st.bytes != (world == 1 ? 0 : cddp_model_numel(m) * sizeof(float)))
        FAIL("DDP reduces %zu bytes per step for %zu parameters", st.bytes, cddp_model_numel(m));
    int wte = -1, seen = 0;
    for (int i = 0; i < cddp_model_num_params(m); i++)
        if (cddp_model_param(m, i) == cddp_model_find(m, "lm_head.weight")) wte = i;
    for (int b = 0; b < cddp_ddp_num_buckets(d); b++) {
        int params[64], n = cddp_ddp_bucket_params(d, b, params, 64);
        for (int i = 0; i < n; i++) seen += params[i] == wte;
    }
    if (wte < 0 || seen != 1) FAIL("the tied weight (parameter %d) is in %d buckets", wte, seen);
    printf("ok: rank %d of %d: gpt, %d buckets, %d micro-step(s): %d steps of GPT-2's recipe equal "
           "the single-process reference; the tied head reduced once; products in %s\n",
           rank, world, cddp_ddp_num_buckets(d), accumulate, STEPS,
           cddp_dtype_name(cddp_ctx_compute(ctx)));
    release(ctx, om, oref, d, m, ref);
    cddp_model_destroy(at);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: ddp_check equal mlp|cnn [CAP_MB] | nosync | sum | unused | "
                "unused_noflag | join | join_throw | mismatch shape|option | resume DIR | "
                "buffers [off|join] | syncbn | powersgd | hook | ignored | assign | gpt ACCUM "
                "[CAP_MB]\n");
        return 2;
    }
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) FAIL("cannot create the group: %s", err.msg);
    rank = cddp_comm_rank(g);
    world = cddp_comm_size(g);
    const char *mode = argv[1];
    int status;
    if (!strcmp(mode, "equal") && argc > 2)
        status = equal(g, !strcmp(argv[2], "cnn") ? CNN : MLP, argc > 3 ? atof(argv[3]) : 0, 1);
    else if (!strcmp(mode, "nosync"))
        status = equal(g, MLP, 0.0005, 2);
    else if (!strcmp(mode, "sum"))
        status = sum_mode(g);
    else if (!strcmp(mode, "unused") || !strcmp(mode, "unused_noflag"))
        status = unused(g, !strcmp(mode, "unused"));
    else if (!strcmp(mode, "join") || !strcmp(mode, "join_throw"))
        status = join(g, !strcmp(mode, "join_throw"));
    else if (!strcmp(mode, "mismatch") && argc > 2)
        status = mismatch(g, argv[2]);
    else if (!strcmp(mode, "resume") && argc > 2)
        status = resume(g, argv[2]);
    else if (!strcmp(mode, "buffers") && argc > 2 && !strcmp(argv[2], "join"))
        status = buffers_join(g);
    else if (!strcmp(mode, "buffers"))
        status = buffers(g, argc > 2 && !strcmp(argv[2], "off"));
    else if (!strcmp(mode, "powersgd"))
        status = powersgd(g);
    else if (!strcmp(mode, "hook"))
        status = hook(g);
    else if (!strcmp(mode, "ignored"))
        status = ignored(g);
    else if (!strcmp(mode, "assign"))
        status = assign(g);
    else if (!strcmp(mode, "syncbn"))
        status = syncbn(g);
    else if (!strcmp(mode, "gpt") && argc > 2)
        status = gpt(g, atoi(argv[2]), argc > 3 ? atof(argv[3]) : 0);
    else
        FAIL("unknown mode %s", mode);
    cddp_comm_destroy(g);
    return status;
}
