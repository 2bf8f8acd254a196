/* dataset.c: the dataset interface and the built-in datasets (MNIST, in-memory arrays, shards).
 *
 * A cddp_dataset is a vtable, the implementation's state, and the field descriptions; the
 * built-ins are ordinary implementations of the same interface a user writes, so the loader
 * treats them all alike.
 */
#include "cddp/data.h"
#include "cddp/core.h"
#include "data/internal.h"

#include <string.h>

struct cddp_dataset {
    cddp_dataset_ops ops;
    void *self;
    int nfields;
    cddp_field fields[CDDP_MAX_FIELDS];
};

size_t cddp_field_bytes(const cddp_field *f) {
    size_t n = cddp_dtype_size(f->dtype);
    for (int d = 0; d < f->ndim; d++) n *= (size_t)f->shape[d];
    return n;
}

cddp_dataset *cddp_dataset_create(const cddp_dataset_ops *ops, void *self, int nfields,
                                  const cddp_field *fields, cddp_error *err) {
    int rc = CDDP_OK;
    if (!ops || !ops->length || !ops->get) {
        rc = cddp_error_set(err, CDDP_EINVAL, "a dataset needs length and get functions");
    } else if (nfields < 1 || nfields > CDDP_MAX_FIELDS) {
        rc = cddp_error_set(err, CDDP_EINVAL, "a dataset has 1 to %d fields, not %d",
                            CDDP_MAX_FIELDS, nfields);
    } else {
        for (int f = 0; f < nfields && !rc; f++) {
            if (fields[f].ndim < 0 || fields[f].ndim > CDDP_MAX_DIMS - 1)
                rc = cddp_error_set(err, CDDP_EINVAL, "field %d has %d dimensions (0..%d)", f,
                                    fields[f].ndim, CDDP_MAX_DIMS - 1);
            for (int d = 0; d < fields[f].ndim && !rc; d++)
                if (fields[f].shape[d] <= 0)
                    rc = cddp_error_set(err, CDDP_EINVAL, "field %d: dimension %d is %lld", f, d,
                                        (long long)fields[f].shape[d]);
        }
    }
    cddp_dataset *ds = rc ? NULL : cddp_calloc(1, sizeof *ds);
    if (!rc && !ds) rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory for a dataset");
    if (rc) {
        if (ops && ops->destroy) ops->destroy(self);
        return NULL;
    }
    ds->ops = *ops;
    ds->self = self;
    ds->nfields = nfields;
    memcpy(ds->fields, fields, sizeof(cddp_field) * (size_t)nfields);
    return ds;
}

void cddp_dataset_destroy(cddp_dataset *ds) {
    if (!ds) return;
    if (ds->ops.destroy) ds->ops.destroy(ds->self);
    cddp_free(ds);
}

int64_t cddp_dataset_len(const cddp_dataset *ds) {
    return ds->ops.length(ds->self);
}

int cddp_dataset_num_fields(const cddp_dataset *ds) {
    return ds->nfields;
}

const cddp_field *cddp_dataset_field(const cddp_dataset *ds, int f) {
    CDDP_CHECK(f >= 0 && f < ds->nfields, "field %d out of range (%d fields)", f, ds->nfields);
    return &ds->fields[f];
}

int cddp_dataset_get(cddp_dataset *ds, int64_t i, void *const *out, cddp_error *err) {
    int64_t n = cddp_dataset_len(ds);
    if (i < 0 || i >= n)
        return cddp_error_set(err, CDDP_ERANGE, "sample %lld is out of range for a dataset of %lld",
                              (long long)i, (long long)n);
    return ds->ops.get(ds->self, i, out, err);
}

/* MNIST: images as raw float pixels (the loader's transforms scale them), int64 labels. */

static int64_t mnist_len(void *self) {
    return ((cddp_mnist *)self)->n;
}

static int mnist_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    (void)err;
    const cddp_mnist *m = self;
    int64_t px = m->rows * m->cols;
    const uint8_t *src = m->images + i * px;
    float *dst = out[0];
    for (int64_t k = 0; k < px; k++) dst[k] = (float)src[k];
    *(int64_t *)out[1] = m->labels[i];
    return CDDP_OK;
}

static void mnist_destroy(void *self) {
    cddp_mnist_free(self);
    cddp_free(self);
}

cddp_dataset *cddp_dataset_mnist(const char *dir, bool train, cddp_error *err) {
    return cddp_dataset_mnist_first(dir, train, -1, err);
}

cddp_dataset *cddp_dataset_mnist_first(const char *dir, bool train, int64_t n, cddp_error *err) {
    cddp_mnist *m = cddp_calloc(1, sizeof *m);
    if (!m) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    if (cddp__mnist_load(dir, train, n, m, err) != CDDP_OK) {
        cddp_free(m);
        return NULL;
    }
    static const cddp_dataset_ops ops = {mnist_len, mnist_get, mnist_destroy};
    cddp_field fields[2] = {
        {.name = "image", .dtype = CDDP_F32, .ndim = 3, .shape = {1, m->rows, m->cols}},
        {.name = "label", .dtype = CDDP_I64, .ndim = 0},
    };
    return cddp_dataset_create(&ops, m, 2, fields, err);
}

/* In-memory arrays, copied. */

typedef struct arrays {
    int64_t n;
    int nfields;
    size_t bytes[CDDP_MAX_FIELDS];
    uint8_t *data[CDDP_MAX_FIELDS];
} arrays;

static int64_t arrays_len(void *self) {
    return ((arrays *)self)->n;
}

static int arrays_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    (void)err;
    const arrays *a = self;
    for (int f = 0; f < a->nfields; f++)
        memcpy(out[f], a->data[f] + (size_t)i * a->bytes[f], a->bytes[f]);
    return CDDP_OK;
}

static void arrays_destroy(void *self) {
    arrays *a = self;
    for (int f = 0; f < a->nfields; f++) cddp_free(a->data[f]);
    cddp_free(a);
}

cddp_dataset *cddp_dataset_from_arrays(int64_t n, int nfields, const cddp_field *fields,
                                       const void *const *data, cddp_error *err) {
    if (n < 0 || nfields < 1 || nfields > CDDP_MAX_FIELDS) {
        cddp_error_set(err, CDDP_EINVAL, "arrays dataset: %lld samples of %d fields", (long long)n,
                       nfields);
        return NULL;
    }
    arrays *a = cddp_calloc(1, sizeof *a);
    if (!a) goto oom;
    a->n = n;
    a->nfields = nfields;
    for (int f = 0; f < nfields; f++) {
        a->bytes[f] = cddp_field_bytes(&fields[f]);
        a->data[f] = cddp_malloc(a->bytes[f] * (size_t)n);
        if (!a->data[f]) goto oom;
        memcpy(a->data[f], data[f], a->bytes[f] * (size_t)n);
    }
    static const cddp_dataset_ops ops = {arrays_len, arrays_get, arrays_destroy};
    return cddp_dataset_create(&ops, a, nfields, fields, err);
oom:
    if (a) arrays_destroy(a);
    cddp_error_set(err, CDDP_ENOMEM, "out of memory copying %lld samples", (long long)n);
    return NULL;
}

/* Shards: a strided view. */

typedef struct shard {
    cddp_dataset *base;
    int num_shards, shard_id;
} shard;

static int64_t shard_len(void *self) {
    const shard *s = self;
    int64_t n = cddp_dataset_len(s->base);
    return n > s->shard_id ? (n - s->shard_id + s->num_shards - 1) / s->num_shards : 0;
}

static int shard_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    const shard *s = self;
    return cddp_dataset_get(s->base, s->shard_id + i * s->num_shards, out, err);
}

static void shard_destroy(void *self) {
    cddp_dataset_destroy(((shard *)self)->base);
    cddp_free(self);
}

cddp_dataset *cddp_dataset_shard(cddp_dataset *ds, int num_shards, int shard_id, cddp_error *err) {
    if (num_shards < 1 || shard_id < 0 || shard_id >= num_shards) {
        cddp_error_set(err, CDDP_EINVAL,
                       "shard_id %d is out of range for num_shards %d (want 0 <= shard_id < "
                       "num_shards)",
                       shard_id, num_shards);
        cddp_dataset_destroy(ds);
        return NULL;
    }
    shard *s = cddp_calloc(1, sizeof *s);
    if (!s) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        cddp_dataset_destroy(ds);
        return NULL;
    }
    *s = (shard){ds, num_shards, shard_id};
    static const cddp_dataset_ops ops = {shard_len, shard_get, shard_destroy};
    return cddp_dataset_create(&ops, s, ds->nfields, ds->fields, err);
}
