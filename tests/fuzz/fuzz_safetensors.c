/* fuzz_safetensors.c: the safetensors reader and the checkpoint loader on any bytes: a clear
 * error, or a file whose every tensor and metadata value can be read (and, when it fits, a model
 * and its AdamW state loaded from it). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_as_file(data, size);
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(path, &err);
    if (!f) {
        if (!err.msg[0]) abort();
        return 0;
    }
    for (int i = 0; i < cddp_safetensors_count(f); i++) {
        const cddp_st_tensor *t = cddp_safetensors_at(f, i);
        size_t bytes = cddp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) bytes *= (size_t)t->shape[d];
        for (size_t b = 0; b < bytes; b++) fuzz_sink ^= ((const uint8_t *)t->data)[b];
        if (cddp_safetensors_find(f, t->name) != t) abort();
    }
    const char *keys[] = {"epoch", "step", "lr", "optim", "data_position", "zero"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const char *v = cddp_safetensors_meta(f, keys[k]);
        if (v) fuzz_sink ^= (uint8_t)strlen(v);
    }
    cddp_safetensors_destroy(f);
    /* The checkpoint loader, into the model of tests/fuzz/corpus/safetensors/ckpt. */
    cddp_optim *optim;
    cddp_model *model = fuzz_small_model(&optim);
    cddp_safetensors *meta = NULL;
    if (cddp_checkpoint_load(path, model, optim, &meta, &err) == CDDP_OK)
        cddp_safetensors_destroy(meta);
    else if (!err.msg[0])
        abort();
    return 0;
}
