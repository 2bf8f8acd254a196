/* stage.c: DistributedDataParallel for a model whose blocks the host cannot read (cddp_model_to a
 * GPU, or the emulated device): its collectives run on host copies of the blocks.
 *
 * The gradients' copy is the block the collectives see (d->hgrad; for a model on the CPU, the
 * model's own block): memory from cddp_comm_alloc where the group has it, so that the
 * shared-memory transport still reads every rank's copy in place. The host copies are
 * page-locked where the device has such memory (a GPU), so that a bucket's copy to the host runs
 * while backward goes on queuing kernels. When a bucket is complete, the
 * device is asked to copy its gradients into the host copy and an event is recorded after that
 * copy (stage_in); the bucket's reduction first waits for the event, on the communication thread
 * when buckets are reduced there (so the training thread goes on queuing the rest of backward),
 * then packs, reduces and unpacks on the host as for the CPU; when it is done, the result goes
 * back to the device (stage_out), queued before anything the training thread queues next (the
 * optimizer's update). Broadcasts and the sharded optimizer's allgather of the parameters and
 * buffers go through host copies of those blocks the same way, whole. */
#include "ddp/internal.h"

#include "cddp/internal/device.h"

#include <string.h>

/* The model's device, and whether DDP stages its blocks; the host copies it then needs. */
int cddp__ddp_stage_setup(cddp_ddp *d, cddp_error *err) {
    d->dev = cddp_model_device(d->model);
    d->staged = !cddp_device_host_accessible(d->dev);
    if (!d->staged) return CDDP_OK;
    size_t np = cddp_model_numel(d->model), nb = cddp_model_buffer_numel(d->model);
    /* with nccl or ipc the gradients are reduced where they are, and alone not at all: no host
     * copy of them (nor events) */
    bool dc = cddp__ddp_on_device(d);
    if (!dc && !d->alone) {
        cddp_error e = {0};
        d->hgrad = cddp_comm_alloc(d->group, np * sizeof(float), &e);
        if (!d->hgrad && cddp_comm_error(d->group)) { /* the group failed: a peer died, say */
            *err = e;
            return e.code;
        }
        /* the group's memory made page-locked where it is, or a copy of its own */
        if ((d->hgrad_comm = d->hgrad != NULL)) {
            d->locked[0] =
                cddp_device_host_register(d->dev, d->hgrad, np * sizeof(float), &e) == CDDP_OK;
            if (!d->locked[0])
                cddp_log(CDDP_LOG_DEBUG, "ddp", "the gradients' host copy stays pageable: %s",
                         e.msg);
        } else {
            d->hgrad = cddp_device_host_copy(d->dev, np * sizeof(float), &d->locked[0]);
        }
    }
    d->hparams = cddp_device_host_copy(d->dev, np * sizeof(float), &d->locked[1]);
    d->hbufs = cddp_device_host_copy(d->dev, nb * sizeof(float), &d->locked[2]);
    if ((!d->hgrad && !dc && !d->alone) || !d->hparams || !d->hbufs)
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for the host copies of the model");
    for (int k = 0; k < d->nbuckets; k++) CDDP_TRY(cddp__ddp_stage_bucket(d, &d->buckets[k], err));
    return CDDP_OK;
}

void cddp__ddp_stage_release(cddp_ddp *d) {
    if (!d->staged) return;
    cddp_device_synchronize(d->dev, NULL); /* the last copies out of the host copies have run */
    if (d->hgrad_comm) {
        if (d->locked[0]) cddp_device_host_unregister(d->dev, d->hgrad);
        cddp_comm_free(d->group, d->hgrad);
    } else {
        cddp_device_host_copy_free(d->dev, d->hgrad, d->locked[0]);
    }
    cddp_device_host_copy_free(d->dev, d->hparams, d->locked[1]);
    cddp_device_host_copy_free(d->dev, d->hbufs, d->locked[2]);
    d->hgrad = d->hparams = d->hbufs = NULL;
}

int cddp__ddp_stage_bucket(cddp_ddp *d, bucket *b, cddp_error *err) {
    if (!d->staged || cddp__ddp_on_device(d) || d->alone || b->ready_ev) return CDDP_OK;
    return (b->ready_ev = cddp_event_create(d->dev, err)) ? CDDP_OK : err->code;
}

/* Each of the bucket's ranges of the gradient block, in order: fn(d, offset, n). */
static int each_range(cddp_ddp *d, bucket *b,
                      int (*fn)(cddp_ddp *d, size_t at, size_t n, cddp_error *err),
                      cddp_error *err) {
    if (b->offset >= 0) return fn(d, (size_t)b->offset, b->numel, err);
    for (int j = 0; j < b->nparams; j++)
        CDDP_TRY(fn(d, cddp_model_param_offset(d->model, b->params[j]),
                    (size_t)cddp_model_param(d->model, b->params[j])->numel, err));
    return CDDP_OK;
}

static int range_in(cddp_ddp *d, size_t at, size_t n, cddp_error *err) {
    return cddp_device_download_async(d->dev, d->hgrad + at, cddp_model_grad(d->model) + at,
                                      n * sizeof(float), err);
}

/* Queued, not waited for (an upload from page-locked memory would wait for the device's queue):
 * the optimizer's kernels after it on the same queue see the sums, and the host copy is next
 * written after the next step's copy into it, which that queue runs after this one (the group's
 * thread writes it only after that copy's event). */
static int range_out(cddp_ddp *d, size_t at, size_t n, cddp_error *err) {
    return cddp_device_upload_async(d->dev, cddp_model_grad(d->model) + at, d->hgrad + at,
                                    n * sizeof(float), err);
}

int cddp__ddp_stage_in(cddp_ddp *d, bucket *b, cddp_error *err) {
    if (!d->staged) return CDDP_OK;
    CDDP_TRY(each_range(d, b, range_in, err));
    return cddp_event_record(b->ready_ev, err);
}

int cddp__ddp_stage_wait(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    return cddp_event_synchronize(b->ready_ev, err);
}

int cddp__ddp_stage_out(cddp_ddp *d, bucket *b, cddp_error *err) {
    return d->staged ? each_range(d, b, range_out, err) : CDDP_OK;
}

int cddp__ddp_params_in(cddp_ddp *d, cddp_error *err) {
    if (!d->staged) return CDDP_OK;
    CDDP_TRY(cddp_device_download(d->dev, d->hparams, cddp_model_data(d->model),
                                  cddp_model_numel(d->model) * sizeof(float), err));
    return cddp_device_download(d->dev, d->hbufs, cddp_model_buffer_data(d->model),
                                cddp_model_buffer_numel(d->model) * sizeof(float), err);
}

int cddp__ddp_params_out(cddp_ddp *d, bool params, bool buffers, cddp_error *err) {
    if (!d->staged) return CDDP_OK;
    if (params)
        CDDP_TRY(cddp_device_upload(d->dev, cddp_model_data(d->model), d->hparams,
                                    cddp_model_numel(d->model) * sizeof(float), err));
    if (buffers)
        CDDP_TRY(cddp_device_upload(d->dev, cddp_model_buffer_data(d->model), d->hbufs,
                                    cddp_model_buffer_numel(d->model) * sizeof(float), err));
    return CDDP_OK;
}

float *cddp__ddp_params(const cddp_ddp *d) {
    return d->staged ? d->hparams : cddp_model_data(d->model);
}

float *cddp__ddp_buffers(const cddp_ddp *d) {
    return d->staged ? d->hbufs : cddp_model_buffer_data(d->model);
}
