/* consumer.c: the smallest use of an installed cddp: build a model, one training step, and
 * check that the loss went down. */
#include <cddp/cddp.h>
#include <stdio.h>

int main(void) {
    cddp_model *m = cddp_model_create();
    cddp_model_add(m, "fc", cddp_nn_linear(2, 1));
    if (cddp_model_build(m, 0) != CDDP_OK) return 1;
    cddp_error err = {0};
    cddp_optim *opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.05f}, &err);
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    float x[] = {1, 2, 3, 4}, y[] = {1, 2};
    double first = 0, last = 0;
    for (int i = 0; i < 20; i++) {
        cddp_ctx_reset(ctx);
        cddp_tensor *pred =
            cddp_model_forward(m, ctx, cddp_wrap(ctx, CDDP_F32, CDDP_SHAPE(2, 2), x));
        cddp_tensor *loss = cddp_mse_loss(ctx, pred, cddp_wrap(ctx, CDDP_F32, CDDP_SHAPE(2, 1), y),
                                          CDDP_REDUCE_MEAN);
        cddp_model_zero_grad(m);
        if (cddp_backward(ctx, loss) != CDDP_OK) return 1;
        cddp_optim_step(opt);
        last = cddp_get(loss, 0);
        if (i == 0) first = last;
    }
    printf("consumer: loss %.4f -> %.4f\n", first, last);
    cddp_ctx_destroy(ctx);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    return last < first ? 0 : 1;
}
