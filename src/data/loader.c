/* loader.c: the DataLoader: batches collated from the sampler's choice, optionally prepared
 * ahead by a worker thread.
 *
 * Batch b of an epoch is built in slot b mod S of a ring of S = prefetch + 1 slots. The worker
 * fills batches in order, each as soon as its slot is free; the caller takes them in order and
 * holds one slot until its next call, so with prefetch P up to P batches are ready while the
 * training step runs. Without prefetching the single slot is filled on the caller's thread.
 * Either way a batch depends only on (epoch, position in the epoch), never on timing: the
 * random transforms draw from a generator seeded by (seed, epoch, position).
 *
 * With a device (other than the CPU), each slot also has the batch's memory there, and two events
 * of the device: `copied`, recorded on the loader's queue after the slot's copy to the device, and
 * `released`, recorded on the device's default queue when the caller gives the slot back (after
 * the step that read it was queued). The slot's next copy waits for `released` on the device, its
 * next collation for `copied` on the host (the copy reads the page-locked buffer as it runs), and
 * the step waits for `copied` on the device (cddp_batch_tensor). The host never waits for a step.
 */
#include "cddp/data.h"
#include "cddp/core.h"
#include "data/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct slot {
    void *data[CDDP_MAX_FIELDS];
    void *dev_data[CDDP_MAX_FIELDS]; /* with a device: the batch there */
    cddp_event *copied, *released;   /* with a device: see above */
    int64_t *indices;
    int64_t size, index;
    bool ready; /* filled and not yet released by the caller */
    int status;
    cddp_error err;
} slot;

struct cddp_loader {
    cddp_dataset *ds;
    cddp_sampler *sampler;
    cddp_loader_options o;
    int nfields;
    size_t field_bytes[CDDP_MAX_FIELDS];
    int64_t image_c, image_h, image_w;
    float *scratch; /* one image, for cropping (worker or caller, never both) */

    int nslots;
    slot *slots;
    int held; /* slot the caller holds, -1 for none */

    cddp_device *dev; /* where batches are copied to; NULL: they stay in host memory */
    cddp_queue *queue;
    int release_status; /* a failed record of `released`, reported by the next cddp_loader_next */
    cddp_error release_err;

    /* The epoch being iterated. */
    int64_t *all;           /* this rank's indices for the epoch, when the sampler keeps a list */
    const int64_t *todo;    /* the ones still to deliver at begin */
    cddp__sampler_run rule; /* else what computes them (with no sampler: k itself) */
    bool made;              /* the synchronisation objects exist */
    int64_t count, nbatches, next_batch, epoch, base;
    int64_t own_epoch; /* epoch counter when there is no sampler */

    pthread_t thread;
    bool running, stop;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    double wait_s;
};

/* The transforms, on one (C,H,W) image, in the documented order. */
static void transform(cddp_loader *l, float *img, int64_t position) {
    const cddp_loader_options *o = &l->o;
    int64_t C = l->image_c, H = l->image_h, W = l->image_w, plane = H * W;
    cddp_rng rng;
    cddp_rng_seed(&rng, o->seed * 0x9E3779B97F4A7C15ull +
                            (uint64_t)l->epoch * 0xBF58476D1CE4E5B9ull + (uint64_t)position);
    if (o->random_crop_padding > 0) {
        int64_t p = o->random_crop_padding;
        int64_t oy = (int64_t)cddp_rng_below(&rng, (uint64_t)(2 * p + 1)) - p;
        int64_t ox = (int64_t)cddp_rng_below(&rng, (uint64_t)(2 * p + 1)) - p;
        memcpy(l->scratch, img, sizeof(float) * (size_t)(C * plane));
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < H; y++)
                for (int64_t x = 0; x < W; x++) {
                    int64_t sy = y + oy, sx = x + ox;
                    img[c * plane + y * W + x] = (sy >= 0 && sy < H && sx >= 0 && sx < W)
                                                     ? l->scratch[c * plane + sy * W + sx]
                                                     : 0.0f;
                }
    }
    if (o->random_hflip && (cddp_rng_next(&rng) >> 63))
        for (int64_t r = 0; r < C * H; r++)
            for (int64_t a = 0, b = W - 1; a < b; a++, b--) {
                float t = img[r * W + a];
                img[r * W + a] = img[r * W + b];
                img[r * W + b] = t;
            }
    if (o->rescale)
        for (int64_t i = 0; i < C * plane; i++)
            img[i] = img[i] * o->rescale_scale + o->rescale_shift;
    if (o->normalize_channels)
        for (int64_t c = 0; c < C; c++) {
            int k = o->normalize_channels == 1 ? 0 : (int)c;
            float m = o->mean[k], inv = 1.0f / o->std[k];
            for (int64_t i = 0; i < plane; i++) img[c * plane + i] = (img[c * plane + i] - m) * inv;
        }
}

static bool has_transforms(const cddp_loader_options *o) {
    return o->rescale || o->normalize_channels || o->random_hflip || o->random_crop_padding > 0;
}

/* Builds batch b into s. Runs on the worker, or on the caller without prefetching. */
static void fill(cddp_loader *l, slot *s, int64_t b) {
    int64_t first = b * l->o.batch_size;
    s->index = b;
    s->size = CDDP_MIN(l->o.batch_size, l->count - first);
    s->status = CDDP_OK;
    for (int64_t j = 0; j < s->size && s->status == CDDP_OK; j++) {
        void *out[CDDP_MAX_FIELDS];
        for (int f = 0; f < l->nfields; f++)
            out[f] = (char *)s->data[f] + (size_t)j * l->field_bytes[f];
        s->indices[j] =
            l->all ? l->todo[first + j] : cddp__sampler_run_index(&l->rule, l->base + first + j);
        s->status = cddp_dataset_get(l->ds, s->indices[j], out, &s->err);
        if (s->status == CDDP_OK && has_transforms(&l->o))
            transform(l, out[l->o.image_field], l->base + first + j);
    }
}

/* Copies s's batch to the device on the loader's queue, once the step that read the slot last is
 * done there; failures become the batch's. */
static void upload(cddp_loader *l, slot *s) {
    if (!l->dev || s->status != CDDP_OK) return;
    cddp_error e = {0};
    int rc = cddp_queue_wait(l->queue, s->released, &e);
    for (int f = 0; rc == CDDP_OK && f < l->nfields; f++)
        rc = cddp_queue_upload(l->queue, s->dev_data[f], s->data[f],
                               l->field_bytes[f] * (size_t)s->size, &e);
    if (rc == CDDP_OK) rc = cddp_queue_record(l->queue, s->copied, &e);
    if (rc != CDDP_OK) {
        s->status = rc;
        s->err = e;
    }
}

/* Batch b into slot s, and onto the device: after the slot's last copy has read its host buffer. */
static void prepare(cddp_loader *l, slot *s, int64_t b) {
    cddp_error e = {0};
    if (l->dev && cddp_event_synchronize(s->copied, &e) != CDDP_OK) {
        s->index = b;
        s->size = 0;
        s->status = e.code;
        s->err = e;
        return;
    }
    fill(l, s, b);
    upload(l, s);
}

static void *worker(void *arg) {
    cddp_loader *l = arg;
    for (int64_t b = 0; b < l->nbatches; b++) {
        slot *s = &l->slots[b % l->nslots];
        pthread_mutex_lock(&l->mu);
        while (!l->stop && s->ready) pthread_cond_wait(&l->changed, &l->mu);
        bool stop = l->stop;
        pthread_mutex_unlock(&l->mu);
        if (stop) break;
        prepare(l, s, b);
        pthread_mutex_lock(&l->mu);
        s->ready = true;
        pthread_cond_broadcast(&l->changed);
        pthread_mutex_unlock(&l->mu);
        if (s->status != CDDP_OK) break; /* the caller reports it when it reaches this batch */
    }
    return NULL;
}

static void stop_worker(cddp_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = false;
    l->stop = false;
}

/* The options against the dataset and the sampler, refused in words; *img: the image field the
 * transforms work on (NULL without transforms). */
static int check_options(cddp_dataset *ds, cddp_sampler *sampler, const cddp_loader_options *o,
                         int nf, const cddp_field **img, cddp_error *err) {
    *img = NULL;
    if (o->batch_size < 0 || o->prefetch < 0 || o->random_crop_padding < 0) {
        return cddp_error_set(err, CDDP_EINVAL,
                              "loader: batch_size %lld, prefetch %d and "
                              "random_crop_padding %d must not be negative",
                              (long long)o->batch_size, o->prefetch, o->random_crop_padding);
    }
    if (sampler && cddp_sampler_dataset_len(sampler) != cddp_dataset_len(ds)) {
        return cddp_error_set(err, CDDP_EINVAL,
                              "loader: the sampler was made for %lld samples but the "
                              "dataset has %lld",
                              (long long)cddp_sampler_dataset_len(sampler),
                              (long long)cddp_dataset_len(ds));
    }
    if (has_transforms(o)) {
        *img = o->image_field >= 0 && o->image_field < nf ? cddp_dataset_field(ds, o->image_field)
                                                          : NULL;
        if (!*img || (*img)->dtype != CDDP_F32 || (*img)->ndim != 3) {
            return cddp_error_set(err, CDDP_EINVAL,
                                  "loader: transforms need field %d to be a float32 "
                                  "(C,H,W) image",
                                  o->image_field);
        }
        int nc = o->normalize_channels;
        if (nc != 0 && nc != 1 && nc != (*img)->shape[0]) {
            return cddp_error_set(err, CDDP_EINVAL,
                                  "loader: normalize_channels %d must be 0, 1 or the "
                                  "image's %lld channels",
                                  nc, (long long)(*img)->shape[0]);
        }
        for (int k = 0; k < nc && k < 4; k++)
            if (!(o->std[k] != 0.0f)) {
                return cddp_error_set(err, CDDP_EINVAL, "loader: std[%d] is 0", k);
            }
        if (nc > 4) {
            return cddp_error_set(err, CDDP_EINVAL, "loader: at most 4 normalised channels");
        }
    }
    return CDDP_OK;
}

cddp_loader *cddp_loader_create(cddp_dataset *ds, cddp_sampler *sampler,
                                const cddp_loader_options *opts, cddp_error *err) {
    cddp_loader_options o = *opts;
    if (o.batch_size == 0) o.batch_size = 1;
    int nf = cddp_dataset_num_fields(ds);
    const cddp_field *img = NULL;
    if (check_options(ds, sampler, &o, nf, &img, err) != CDDP_OK) return NULL;
    cddp_loader *l = cddp_calloc(1, sizeof *l);
    if (!l) goto oom;
    if (o.device && !cddp_device_host_accessible(o.device)) l->dev = o.device;
    l->ds = ds;
    l->sampler = sampler;
    l->o = o;
    l->nfields = nf;
    l->held = -1;
    l->own_epoch = -1;
    for (int f = 0; f < nf; f++) l->field_bytes[f] = cddp_field_bytes(cddp_dataset_field(ds, f));
    if (img) {
        l->image_c = img->shape[0];
        l->image_h = img->shape[1];
        l->image_w = img->shape[2];
        l->scratch = cddp_malloc(l->field_bytes[o.image_field]);
        if (!l->scratch) goto oom;
    }
    l->nslots = o.prefetch + 1;
    l->slots = cddp_calloc((size_t)l->nslots, sizeof *l->slots);
    if (!l->slots) goto oom;
    if (l->dev && !(l->queue = cddp_queue_create(l->dev, err))) goto failed;
    for (int k = 0; k < l->nslots; k++) {
        slot *s = &l->slots[k];
        s->indices = cddp_malloc(sizeof(int64_t) * (size_t)o.batch_size);
        if (!s->indices) goto oom;
        for (int f = 0; f < nf; f++) {
            size_t bytes = l->field_bytes[f] * (size_t)o.batch_size;
            if (!l->dev) {
                if (!(s->data[f] = cddp_aligned_alloc(bytes))) goto oom;
            } else if (!(s->data[f] = cddp_device_host_alloc(l->dev, bytes, err)) ||
                       !(s->dev_data[f] = cddp_device_alloc(l->dev, bytes, err))) {
                goto failed;
            }
        }
        if (l->dev && (!(s->copied = cddp_event_create(l->dev, err)) ||
                       !(s->released = cddp_event_create(l->dev, err))))
            goto failed;
    }
    if (sampler && !cddp__sampler_run_rule(sampler, &l->rule)) { /* a list: copied each epoch */
        int64_t n = cddp_sampler_len(sampler);
        if (!(l->all = cddp_malloc(sizeof(int64_t) * (size_t)(n ? n : 1)))) goto oom;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->changed, NULL);
    l->made = true;
    return l;
oom:
    cddp_loader_destroy(l);
    cddp_error_set(err, CDDP_ENOMEM, "loader: out of memory for %d batches of %lld samples",
                   o.prefetch + 1, (long long)o.batch_size);
    return NULL;
failed: /* the device said why */
    cddp_loader_destroy(l);
    if (err) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        cddp_error_set(err, err->code, "loader: %d batches of %lld samples on %s: %s",
                       o.prefetch + 1, (long long)o.batch_size, cddp_device_name(o.device), why);
    }
    return NULL;
}

void cddp_loader_destroy(cddp_loader *l) {
    if (!l) return;
    if (l->made) {
        stop_worker(l);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->changed);
    }
    cddp_queue_destroy(l->queue); /* its copies done */
    for (int k = 0; l->slots && k < l->nslots; k++) {
        slot *s = &l->slots[k];
        cddp_free(s->indices);
        for (int f = 0; f < l->nfields; f++) {
            if (!l->dev) {
                cddp_aligned_free(s->data[f]);
                continue;
            }
            cddp_device_host_free(l->dev, s->data[f]);
            cddp_device_free(l->dev, s->dev_data[f]); /* after the device's work with it */
        }
        cddp_event_destroy(s->copied);
        cddp_event_destroy(s->released);
    }
    cddp_free(l->slots);
    cddp_free(l->scratch);
    cddp_free(l->all);
    cddp_free(l);
}

/* The caller gives back the slot it holds: with a device, after the work queued so far on the
 * device's default queue (the step that read the batch). */
static void release_held(cddp_loader *l) {
    if (l->held < 0) return;
    if (l->dev && l->release_status == CDDP_OK)
        l->release_status = cddp_event_record(l->slots[l->held].released, &l->release_err);
    pthread_mutex_lock(&l->mu);
    l->slots[l->held].ready = false;
    l->held = -1;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->mu);
}

int64_t cddp_loader_begin(cddp_loader *l) {
    stop_worker(l);
    release_held(l);
    if (l->sampler) {
        l->count = cddp_sampler_begin(l->sampler);
        cddp_sampler_state st = cddp_sampler_get_state(l->sampler);
        l->epoch = st.epoch;
        l->base = st.consumed;
        if (l->all)
            cddp__sampler_run_indices(l->sampler, l->all);
        else
            cddp__sampler_run_rule(l->sampler, &l->rule);
    } else {
        l->epoch = ++l->own_epoch;
        l->base = 0;
        l->count = cddp_dataset_len(l->ds);
        l->rule = (cddp__sampler_run){.n = l->count, .stride = 1}; /* in order */
    }
    l->todo = l->all ? l->all + l->base : NULL;
    int64_t bs = l->o.batch_size;
    l->nbatches = l->o.drop_last ? l->count / bs : (l->count + bs - 1) / bs;
    l->next_batch = 0;
    l->held = -1;
    for (int k = 0; k < l->nslots; k++) l->slots[k].ready = false;
    if (l->o.prefetch > 0 && l->nbatches > 0) {
        if (pthread_create(&l->thread, NULL, worker, l) == 0)
            l->running = true;
        else
            cddp_log(CDDP_LOG_WARN, "data",
                     "loader: cannot start the prefetch thread; loading "
                     "on the caller's thread");
    }
    return l->nbatches;
}

int cddp_loader_next(cddp_loader *l, cddp_batch *batch, cddp_error *err) {
    double t0 = cddp_now_s();
    release_held(l); /* the previous batch's slot, to the worker */
    if (l->release_status != CDDP_OK) {
        if (err) *err = l->release_err;
        l->next_batch = l->nbatches;
        return l->release_status;
    }
    if (l->next_batch >= l->nbatches) return 0;
    int64_t b = l->next_batch;
    int k = (int)(b % l->nslots);
    slot *s = &l->slots[k];
    if (l->running) {
        pthread_mutex_lock(&l->mu);
        while (!s->ready) pthread_cond_wait(&l->changed, &l->mu);
        pthread_mutex_unlock(&l->mu);
    } else {
        prepare(l, s, b);
        s->ready = true;
    }
    l->wait_s += cddp_now_s() - t0;
    if (s->status != CDDP_OK) {
        if (err) *err = s->err;
        l->next_batch = l->nbatches; /* the epoch cannot go on past a failed sample */
        return s->status;
    }
    l->held = k;
    l->next_batch++;
    if (l->sampler) cddp__sampler_advance(l->sampler, s->size);
    *batch = (cddp_batch){.size = s->size,
                          .index = b,
                          .indices = s->indices,
                          .dataset = l->ds,
                          .device = l->dev,
                          .copied = s->copied};
    for (int f = 0; f < l->nfields; f++) {
        batch->data[f] = s->data[f];
        batch->device_data[f] = s->dev_data[f];
    }
    return 1;
}

double cddp_loader_wait_seconds(const cddp_loader *l) {
    return l->wait_s;
}

cddp_tensor *cddp_batch_tensor(cddp_ctx *ctx, const cddp_batch *batch, int f) {
    const cddp_field *fd = cddp_dataset_field(batch->dataset, f);
    int64_t shape[CDDP_MAX_DIMS] = {batch->size};
    for (int d = 0; d < fd->ndim; d++) shape[d + 1] = fd->shape[d];
    cddp_device *dev = cddp_ctx_device(ctx);
    if (!batch->device || batch->device != dev)
        return cddp_from_host(ctx, fd->dtype, fd->ndim + 1, shape, batch->data[f]);
    cddp_error e = {0};
    if (cddp_device_wait_event(dev, batch->copied, &e) != CDDP_OK) { /* the step after the copy */
        cddp_ctx_fail(ctx, e.code, "%s", e.msg);
        return NULL;
    }
    return cddp_wrap(ctx, fd->dtype, fd->ndim + 1, shape, batch->device_data[f]);
}
