/* ddp_train.c: the OneFlow seed's ddp_train.py in C: a linear model y = x w fitted data-parallel.
 *
 *   cddprun --nproc_per_node 2 build/bin/ddp_train [--device cpu|emu|cuda] [--optimizer adamw]
 *                                                  [--transport auto|host|ipc|nccl] [--zero 1|2]
 *
 * Each rank picks its own training data by rank (train_x[rank], train_y[rank]); w starts at
 * zero; the loss is the summed squared error; SGD with lr 0.01 runs 500 iterations. Both ranks'
 * data are consistent with w = [[2], [3]], and DistributedDataParallel averages the two ranks'
 * gradients, so both converge to it. The two changes from a single-process program are marked;
 * --device trains on another device (the model moved there, the data copied there); --optimizer
 * adamw uses AdamW (lr 0.05, no weight decay) instead of SGD; --transport says how the gradients
 * of a model on a device are reduced (default auto: NCCL where each rank has a GPU of its own, else
 * host copies; ipc: through CUDA IPC, the ranks of one host, sharing a GPU or not); --nccl and
 * --ipc are --transport nccl and --transport ipc; --zero 1 shards the optimizer state across the
 * ranks (ZeRO-1), --zero 2 the gradients too (ZeRO-2).
 */
#include <cddp/cddp.h>

#include <stdio.h>
#include <string.h>

static const float train_x[2][4] = {{1, 2, 2, 3}, {4, 6, 3, 1}};
static const float train_y[2][2] = {{8, 13}, {26, 9}};

int main(int argc, char **argv) {
    cddp_error err = {0};
    const char *spec = "cpu", *optimizer = "sgd";
    const char *transport = NULL;
    int zero = 0;
    bool usage = false;
    for (int i = 1; i < argc; i++) {
        bool value = i + 1 < argc;
        if (value && !strcmp(argv[i], "--zero")) {
            const char *z = argv[++i];
            zero = z[0] >= '0' && z[0] <= '2' && !z[1] ? z[0] - '0' : -1;
            usage |= zero < 0;
        } else if (!strcmp(argv[i], "--nccl"))
            transport = "nccl";
        else if (!strcmp(argv[i], "--ipc"))
            transport = "ipc";
        else if (value && !strcmp(argv[i], "--transport")) {
            const cddp_dcomm_transport_info *t = cddp_dcomm_transport_find(argv[++i], &err);
            if (!t) {
                fprintf(stderr, "ddp_train: --transport: %s\n", err.msg);
                return 2;
            }
            transport = t->name;
        } else if (value && !strcmp(argv[i], "--device"))
            spec = argv[++i];
        else if (value && !strcmp(argv[i], "--optimizer"))
            optimizer = argv[++i];
        else
            usage = true;
    }
    bool adamw = !strcmp(optimizer, "adamw");
    if (usage || (!adamw && strcmp(optimizer, "sgd"))) {
        fprintf(stderr, "usage: ddp_train [--device cpu|emu|cuda] [--optimizer sgd|adamw]\n"
                        "                 [--transport auto|host|ipc|nccl | --nccl | --ipc]\n"
                        "                 [--zero 0|1|2]\n");
        return 2;
    }
    cddp_device *dev = cddp_device_for_rank(spec, &err);
    if (!dev) {
        fprintf(stderr, "ddp_train: --device %s: %s\n", spec, err.msg);
        return 2;
    }
    cddp_model *m = cddp_model_create();
    int w_index = 0;
    cddp_model_add_param(m, "w", 2, (int64_t[]){2, 1}, (cddp_init){CDDP_INIT_CONSTANT, 0, 0},
                         &w_index);
    if (cddp_model_build(m, 0) != CDDP_OK || cddp_model_to(m, dev, &err) != CDDP_OK) {
        fprintf(stderr, "ddp_train: %s%s\n", cddp_model_error(m), err.msg);
        return 1;
    }
    /* Change 1: join the group the launcher started, and wrap the model. */
    cddp_comm *group = cddp_comm_create(NULL, &err);
    cddp_ddp_options o = {
        .transport = transport, .shard_optimizer = zero >= 1, .shard_gradients = zero == 2};
    cddp_ddp *ddp = group ? cddp_ddp_wrap(m, group, &o, &err) : NULL;
    if (!ddp) {
        fprintf(stderr, "ddp_train: %s\n", err.msg);
        return 1;
    }
    cddp_adamw_options aw = cddp_adamw_defaults(0.05f);
    aw.weight_decay = 0.0f;
    cddp_optim *opt = adamw ? cddp_optim_adamw(m, &aw, &err)
                            : cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.01f}, &err);
    if (!opt) {
        fprintf(stderr, "ddp_train: %s\n", err.msg);
        return 1;
    }
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    cddp_tensor *w = cddp_model_param(m, w_index);
    /* Change 2: each rank takes its own data. */
    int rank = cddp_ddp_rank(ddp) % 2;
    const int iters = 500;
    for (int i = 0; i < iters; i++) {
        cddp_ctx_reset(ctx);
        cddp_tensor *x = cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){2, 2}, train_x[rank]);
        cddp_tensor *y = cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){2, 1}, train_y[rank]);
        cddp_tensor *l =
            cddp_mse_loss(ctx, cddp_matmul(ctx, x, w, false, false), y, CDDP_REDUCE_SUM);
        if ((i + 1) % 50 == 0) printf("%d/%d loss:%g\n", i + 1, iters, cddp_get(l, 0));
        cddp_model_zero_grad(m);
        if (cddp_backward(ctx, l) != CDDP_OK) {
            fprintf(stderr, "ddp_train: %s\n", cddp_ctx_error(ctx));
            return 1;
        }
        cddp_optim_step(opt);
    }
    printf("\nw:[[%.4f],\n   [%.4f]]\n", cddp_get(w, 0), cddp_get(w, 1));
    cddp_ctx_destroy(ctx);
    cddp_optim_destroy(opt);
    cddp_ddp_destroy(ddp);
    cddp_comm_destroy(group);
    cddp_model_destroy(m);
    return 0;
}
