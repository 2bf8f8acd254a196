/* device_comm.c: the collectives DDP runs on the device's own memory (the nccl and ipc options):
 * NCCL's communicator (nccl.c) or CUDA IPC's (ipc.c), behind one table (ddp/internal.h), chosen
 * once when the model is wrapped. */
#include "ddp/internal.h"

#include "cddp/ipc.h"

/* ---- NCCL ---------------------------------------------------------------------------------- */

static int nccl_allreduce(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_nccl_allreduce(c, send, recv, count, dtype, op, err);
}
static int nccl_reduce_scatter(void *c, const void *send, void *recv, int64_t count,
                               cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_nccl_reduce_scatter(c, send, recv, count, dtype, op, err);
}
static int nccl_allgather(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_error *err) {
    return cddp_nccl_allgather(c, send, recv, count, dtype, err);
}
static int nccl_join(void *c, cddp_error *err) {
    return cddp_nccl_join(c, err);
}
static int nccl_watch(void *c, cddp_error *err) {
    return cddp_nccl_watch(c, err);
}
static void nccl_destroy(void *c) {
    cddp_nccl_destroy(c);
}

static const cddp__device_comm nccl = {
    "NCCL",         "reduced there by NCCL, on a stream of its own",
    nccl_allreduce, nccl_reduce_scatter,
    nccl_allgather, nccl_join,
    nccl_watch,     nccl_destroy,
};

/* ---- CUDA IPC ------------------------------------------------------------------------------ */

static int ipc_allreduce(void *c, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_ipc_allreduce(c, send, recv, count, dtype, op, err);
}
static int ipc_reduce_scatter(void *c, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_ipc_reduce_scatter(c, send, recv, count, dtype, op, err);
}
static int ipc_allgather(void *c, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_error *err) {
    return cddp_ipc_allgather(c, send, recv, count, dtype, err);
}
static int ipc_join(void *c, cddp_error *err) {
    return cddp_ipc_join(c, err);
}
static int ipc_check(void *c, cddp_error *err) {
    return cddp_ipc_check(c, err);
}
static void ipc_destroy(void *c) {
    cddp_ipc_destroy(c);
}

static const cddp__device_comm ipc = {
    "CUDA IPC",
    "reduced there through CUDA IPC (each rank sums its part from the others' memory), on a "
    "stream of its own",
    ipc_allreduce,
    ipc_reduce_scatter,
    ipc_allgather,
    ipc_join,
    ipc_check,
    ipc_destroy,
};

const cddp__device_comm *cddp__ddp_device_comm(const cddp_ddp_options *o) {
    return o->nccl ? &nccl : o->ipc ? &ipc : NULL;
}

int cddp__ddp_device_comm_create(cddp_ddp *d, cddp_error *err) {
    if (!(d->dc = cddp__ddp_device_comm(&d->o))) return CDDP_OK;
    double t = d->o.timeout_s;
    if (d->o.nccl)
        d->dcomm = cddp_nccl_create(d->group, d->dev, &(cddp_nccl_options){.timeout_s = t}, err);
    else /* a scratch as large as the gradients: a step's buckets never wait to start it over */
        d->dcomm =
            cddp_ipc_create(d->group, d->dev,
                            &(cddp_ipc_options){.scratch_bytes = (cddp_model_numel(d->model) +
                                                                  (size_t)(d->nparams + 1) *
                                                                      (size_t)d->world * 64) *
                                                                 sizeof(float),
                                                .timeout_s = t},
                            err);
    return d->dcomm ? CDDP_OK : err->code;
}
