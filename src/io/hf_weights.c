/* hf_weights.c: a model's parameters by name from Hugging Face's safetensors (cddp/checkpoint.h):
 * one file, a sharded checkpoint (its model.safetensors.index.json), or the model's folder, in
 * float32, bfloat16 or float16.
 *
 * For models whose parameters carry Hugging Face's own names and layout (the Llama of
 * src/nn/llama.c: nn.Linear's (out, in) weights, as transformers keeps them), loading is by name
 * and shape, nothing transposed. A tied parameter is found under any of its names (a tied
 * checkpoint stores one). Everything is read and checked before the model changes: a tensor
 * missing, of another shape, holding NaN or infinities, or a tensor the model has not (the
 * rotary frequencies some versions saved aside) refuses the file naming it. A cddp checkpoint
 * given instead (gpt_train's of a Llama) loads as cddp_checkpoint_load loads it. cddp_model_save_hf
 * writes the other way: every parameter under its name (a tied one once, as save_pretrained
 * does), metadata format "pt", which transformers requires.
 */
#include "io/internal.h"

#include "cddp/device.h"
#include "cddp/internal/device.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Parameter i's tensor in the files, under its name or one it is tied to. */
static const cddp_st_tensor *find_param(const cddp__st_files *f, const cddp_model *m, int i) {
    const cddp_tensor *p = cddp_model_param(m, i);
    const cddp_st_tensor *t = cddp__st_files_find(f, p->name, NULL);
    for (int k = 0; !t && k < cddp_model_num_ties(m); k++) {
        const char *name;
        if (cddp_model_tie(m, k, &name) == p) t = cddp__st_files_find(f, name, NULL);
    }
    return t;
}

/* Whether a file's tensor is one of the model's parameters (or a tied name of one), or a buffer
 * transformers saves but nothing reads. */
static bool known(const cddp_model *m, const char *name) {
    size_t n = strlen(name);
    if (n > 21 && !strcmp(name + n - 21, ".rotary_emb.inv_freq")) return true;
    if (cddp_model_find(m, name)) return true;
    return false;
}

/* Whether path is a cddp checkpoint (a file, a set or a folder of sets): its metadata says so. */
static bool cddp_checkpoint(const char *path) {
    char at[4096];
    cddp_error ignored = {0};
    if (cddp_checkpoint_resolve(path, at, sizeof at, &ignored) != CDDP_OK) return false;
    cddp_safetensors *f = cddp_checkpoint_metadata(at, &ignored);
    bool ours = f && cddp_safetensors_meta(f, "cddp_format");
    cddp_safetensors_destroy(f);
    return ours;
}

int cddp_model_load_hf(cddp_model *m, const char *path, cddp_error *err) {
    if (cddp_checkpoint(path)) return cddp_checkpoint_load(path, m, NULL, NULL, err);
    char file[4200];
    path = cddp__hf_weights_file(path, file, sizeof file);
    cddp__st_files f;
    CDDP_TRY(cddp__st_files_open(&f, path, -1, err));
    size_t numel = cddp_model_numel(m);
    float *flat = malloc(numel * sizeof(float) + 1);
    int rc = flat ? CDDP_OK : cddp_error_set(err, CDDP_ENOMEM, "out of memory for the weights");
    for (int i = 0; rc == CDDP_OK && i < cddp_model_num_params(m); i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        const cddp_st_tensor *t = find_param(&f, m, i);
        char a[64], b[64];
        if (!t) {
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s holds no %s (the model's %s)", path, p->name,
                                cddp_shape_str(p->ndim, p->shape, a, sizeof a));
        } else if (t->ndim != p->ndim ||
                   memcmp(t->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim)) {
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s: %s is %s, the model's %s", path, t->name,
                                cddp_shape_str(t->ndim, t->shape, a, sizeof a),
                                cddp_shape_str(p->ndim, p->shape, b, sizeof b));
        } else {
            float *dst = flat + cddp_model_param_offset(m, i);
            rc = cddp__st_files_read_f32(&f, t, dst, p->numel, err);
            if (rc == CDDP_OK) rc = cddp__check_finite(path, t->name, dst, p->numel, err);
        }
    }
    for (int i = 0; rc == CDDP_OK && i < cddp__st_files_count(&f); i++) {
        const char *name = cddp__st_files_at(&f, i, NULL)->name;
        if (!known(m, name))
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s holds %s, which the model has not (another model's weights, "
                                "or a larger one's?)",
                                path, name);
    }
    cddp__st_files_close(&f);
    cddp_device *dev = cddp_model_device(m);
    if (rc == CDDP_OK)
        rc = cddp_device_upload(dev, cddp_model_data(m), flat, numel * sizeof(float), err);
    free(flat);
    return rc;
}

int cddp_model_save_hf(const cddp_model *m, const char *dir, cddp_dtype dtype, cddp_error *err) {
    if (dtype != CDDP_F32 && dtype != CDDP_BF16 && dtype != CDDP_F16)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_model_save_hf: %s: Hugging Face's weights are float32, "
                              "bfloat16 or float16",
                              cddp_dtype_name(dtype));
    size_t numel = cddp_model_numel(m), width = cddp_dtype_size(dtype);
    int np = cddp_model_num_params(m);
    float *flat = malloc(numel * sizeof(float) + 1);
    uint8_t *out = dtype == CDDP_F32 ? (uint8_t *)flat : malloc(numel * width + 1);
    cddp_st_tensor *t = calloc((size_t)np + 1, sizeof *t);
    int rc = flat && out && t ? CDDP_OK
                              : cddp_error_set(err, CDDP_ENOMEM, "out of memory for the weights");
    if (rc == CDDP_OK)
        rc = cddp_device_download(cddp_model_device(m), flat, cddp_model_data(m),
                                  numel * sizeof(float), err);
    if (rc == CDDP_OK && dtype != CDDP_F32) /* rounded to nearest even, as PyTorch's .to() */
        cddp_device_to_half(cddp_device_cpu(), (uint16_t *)out, flat, numel, dtype == CDDP_F16);
    for (int i = 0; rc == CDDP_OK && i < np; i++) { /* a tied parameter once, by its own name */
        const cddp_tensor *p = cddp_model_param(m, i);
        t[i] = (cddp_st_tensor){.name = p->name,
                                .dtype = dtype,
                                .ndim = p->ndim,
                                .data = out + cddp_model_param_offset(m, i) * width};
        memcpy(t[i].shape, p->shape, sizeof t[i].shape);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static const char *const meta[] = {"format", "pt", NULL};
    if (rc == CDDP_OK) rc = cddp__make_dirs(dir, err);
    if (rc == CDDP_OK) rc = cddp_safetensors_write(path, t, np, meta, err);
    if (out != (uint8_t *)flat) free(out);
    free(flat);
    free(t);
    return rc;
}
