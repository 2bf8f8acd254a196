/* linear_sampler.c: the CSDN seed's DistributedSampler program in C: Linear(10, 1) on a
 * 64-sample dataset, 4 samples per rank per step, set_epoch every epoch, a barrier, and rank 0
 * saving model.safetensors (names without a "module." prefix).
 *
 *   cddprun --nproc_per_node 4 build/bin/linear_sampler [--out model.safetensors]
 */
#include <cddp/cddp.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *out = argc > 2 && !strcmp(argv[1], "--out") ? argv[2] : "model.safetensors";
    cddp_error err = {0};
    cddp_comm *group = cddp_comm_create(NULL, &err);
    if (!group) goto fail;
    printf("rank: %d\n", cddp_comm_rank(group));

    cddp_model *m = cddp_model_create();
    cddp_model_add(m, NULL, cddp_nn_linear(10, 1));
    if (cddp_model_build(m, 0) != CDDP_OK) return 1;
    cddp_ddp *ddp = cddp_ddp_wrap(m, group, NULL, &err);
    if (!ddp) goto fail;

    /* The dataset: 64 samples of 10 features (a fixed pattern here; the seed's are
     * uninitialised), targets zero. */
    float x[64][10], y[64] = {0};
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 10; j++) x[i][j] = (float)((i * 7 + j * 3) % 11) / 10.0f - 0.5f;
    cddp_field f[2] = {{"x", CDDP_F32, 1, {10}}, {"y", CDDP_F32, 0, {0}}};
    cddp_dataset *ds = cddp_dataset_from_arrays(64, 2, f, (const void *const[]){x, y}, &err);
    /* New 1: the DistributedSampler, told this rank's place in the group; the batch size is per
     * rank. */
    cddp_sampler_options so = cddp_sampler_defaults();
    so.rank = cddp_comm_rank(group);
    so.num_replicas = cddp_comm_size(group);
    cddp_sampler *sampler = ds ? cddp_sampler_create(64, &so, &err) : NULL;
    cddp_loader_options lo = {.batch_size = 4};
    cddp_loader *loader = sampler ? cddp_loader_create(ds, sampler, &lo, &err) : NULL;
    if (!loader) goto fail;
    cddp_optim *opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.001f}, &err);
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    for (int epoch = 0; epoch < 4; epoch++) {
        /* New 2: set_epoch, so every rank shuffles alike and differently each epoch. */
        cddp_sampler_set_epoch(sampler, epoch);
        cddp_batch b;
        int rc;
        cddp_loader_begin(loader);
        while ((rc = cddp_loader_next(loader, &b, &err)) == 1) {
            cddp_ctx_reset(ctx);
            cddp_tensor *pred = cddp_model_forward(m, ctx, cddp_batch_tensor(ctx, &b, 0));
            cddp_tensor *target =
                cddp_reshape(ctx, cddp_batch_tensor(ctx, &b, 1), 2, (int64_t[]){b.size, 1});
            cddp_tensor *loss = cddp_mse_loss(ctx, pred, target, CDDP_REDUCE_MEAN);
            cddp_model_zero_grad(m);
            if (cddp_backward(ctx, loss) != CDDP_OK) {
                cddp_error_set(&err, cddp_ctx_status(ctx), "%s", cddp_ctx_error(ctx));
                goto fail;
            }
            cddp_optim_step(opt);
        }
        if (rc < 0) goto fail;
        /* Every rank finishes the epoch before the next begins. */
        if (cddp_ddp_barrier(ddp, &err) != CDDP_OK) goto fail;
        /* Only rank 0 saves. */
        if (cddp_ddp_save(ddp, out, NULL, NULL, &err) != CDDP_OK) goto fail;
    }
    cddp_ddp_print0(ddp, "saved %s\n", out);
    cddp_ctx_destroy(ctx);
    cddp_optim_destroy(opt);
    cddp_loader_destroy(loader);
    cddp_sampler_destroy(sampler);
    cddp_dataset_destroy(ds);
    cddp_ddp_destroy(ddp);
    cddp_model_destroy(m);
    cddp_comm_destroy(group);
    return 0;
fail:
    fprintf(stderr, "linear_sampler: %s\n", cddp_error_msg(&err));
    return 1;
}
