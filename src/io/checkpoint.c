/* checkpoint.c: model and optimizer state in a safetensors file.
 *
 * Layout: each parameter and each buffer under its own name (a tied parameter under each of its
 * names, cddp_module_tie, as PyTorch's state_dict holds it); with an optimizer, each state block
 * per parameter as "optim.<state>.<param>" (for example "optim.exp_avg.fc1.weight"), and in the
 * metadata "cddp_format" = "checkpoint-1", "optimizer", "optimizer_steps" and "lr". Loading checks
 * the whole file against the model before it copies anything, and reports every difference at once.
 */
#include "cddp/checkpoint.h"
#include "cddp/core.h"
#include "io/internal.h"

#include <inttypes.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_PREFIX "optim."

static cddp_st_tensor param_entry(const cddp_tensor *p, const char *name, const void *data) {
    cddp_st_tensor t = {.name = name, .dtype = CDDP_F32, .ndim = p->ndim, .data = data};
    memcpy(t.shape, p->shape, sizeof t.shape);
    return t;
}

int cddp__host_model_get(const cddp_model *m, const cddp_optim *opt, cddp__host_model *h,
                         cddp_error *err) {
    *h = (cddp__host_model){cddp_model_data(m), cddp_model_buffer_data(m), {NULL, NULL}, NULL};
    int ns = opt ? CDDP_MIN(cddp_optim_num_states(opt), CDDP__HOST_STATES) : 0;
    for (int s = 0; s < ns; s++) h->state[s] = cddp_optim_state(opt, s, NULL);
    cddp_device *dev = cddp_model_device(m);
    if (cddp_device_host_accessible(dev)) return CDDP_OK;
    size_t np = cddp_model_numel(m), nb = cddp_model_buffer_numel(m);
    size_t sn = opt ? cddp_optim_state_numel(opt) : 0, n = np + nb + sn * (size_t)ns;
    if (!(h->own = cddp_malloc(sizeof(float) * (n ? n : 1))))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for a copy of the model from %s",
                              cddp_device_name(dev));
    float *to = h->own;
    const float *from[2 + CDDP__HOST_STATES] = {h->params, h->bufs, h->state[0], h->state[1]};
    const float **view[2 + CDDP__HOST_STATES] = {&h->params, &h->bufs, &h->state[0], &h->state[1]};
    size_t len[2 + CDDP__HOST_STATES] = {np, nb, sn, sn};
    for (int k = 0; k < 2 + ns; k++) {
        int rc = cddp_device_download(dev, to, from[k], len[k] * sizeof(float), err);
        if (rc != CDDP_OK) {
            cddp__host_model_free(h);
            return rc;
        }
        *view[k] = to;
        to += len[k];
    }
    return CDDP_OK;
}

void cddp__host_model_free(cddp__host_model *h) {
    cddp_free(h->own);
    h->own = NULL;
}

const float *cddp__host_buffer(const cddp__host_model *h, const cddp_model *m, int i) {
    return h->bufs + ((const float *)cddp_model_buffer(m, i)->data - cddp_model_buffer_data(m));
}

int cddp__optim_meta(const cddp_optim *opt, const char **meta, int k, char steps[32], char lr[32]) {
    snprintf(steps, 32, "%" PRId64, cddp_optim_steps(opt));
    snprintf(lr, 32, "%.9g", (double)cddp_optim_lr(opt));
    meta[k++] = "optimizer";
    meta[k++] = cddp_optim_name(opt);
    meta[k++] = "optimizer_steps";
    meta[k++] = steps;
    meta[k++] = "lr";
    meta[k++] = lr;
    return k;
}

int cddp_checkpoint_save(const char *path, const cddp_model *m, const cddp_optim *opt,
                         const char *const *metadata, cddp_error *err) {
    if (opt && cddp_optim_num_states(opt) > 0 && cddp_optim_state_numel(opt) != cddp_model_numel(m))
        return cddp_error_set(err, CDDP_ESTATE,
                              "%s: the optimizer's state is sharded across the ranks (ZeRO-1): "
                              "save and load it with cddp_ddp_save and cddp_ddp_load",
                              path);
    int np = cddp_model_num_params(m), ns = opt ? cddp_optim_num_states(opt) : 0;
    int nb = cddp_model_num_buffers(m), nt = cddp_model_num_ties(m);
    int n = np * (1 + ns) + nb + nt, rc = CDDP_OK, nmeta = 0;
    cddp_st_tensor *list = cddp_calloc((size_t)n, sizeof *list);
    char **names = cddp_calloc((size_t)n, sizeof *names);
    while (metadata && metadata[nmeta]) nmeta++;
    const char **meta = cddp_calloc((size_t)nmeta + 10, sizeof *meta);
    char steps[32], lr[32];
    cddp__host_model h = {0};
    if (!list || !names || !meta) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    CDDP_TRY_GOTO(cddp__host_model_get(m, opt, &h, err), out);
    for (int i = 0; i < np; i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        list[i] = param_entry(p, p->name, h.params + cddp_model_param_offset(m, i));
        for (int s = 0; s < ns; s++) {
            const char *sname;
            cddp_optim_state(opt, s, &sname);
            const float *block = h.state[s];
            size_t len = strlen(STATE_PREFIX) + strlen(sname) + strlen(p->name) + 2;
            char *nm = names[np + s * np + i] = cddp_malloc(len);
            if (!nm) {
                rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            snprintf(nm, len, STATE_PREFIX "%s.%s", sname, p->name);
            list[np + s * np + i] = param_entry(p, nm, block + cddp_model_param_offset(m, i));
        }
    }
    for (int i = 0; i < nb; i++) {
        const cddp_tensor *b = cddp_model_buffer(m, i);
        list[np * (1 + ns) + i] = param_entry(b, b->name, cddp__host_buffer(&h, m, i));
    }
    for (int i = 0; i < nt; i++) { /* a tied parameter under its second name too */
        const char *name;
        const cddp_tensor *p = cddp_model_tie(m, i, &name);
        list[np * (1 + ns) + nb + i] =
            param_entry(p, name, h.params + cddp_model_param_offset(m, p->param_index));
    }
    int k = 0;
    meta[k++] = "cddp_format";
    meta[k++] = "checkpoint-1";
    if (opt) k = cddp__optim_meta(opt, meta, k, steps, lr);
    for (int i = 0; i < nmeta; i++) meta[k++] = metadata[i];
    meta[k] = NULL;
    rc = cddp_safetensors_write(path, list, n, meta, err);
out:
    cddp__host_model_free(&h);
    for (int i = 0; names && i < n; i++) cddp_free(names[i]);
    cddp_free(names);
    cddp_free(list);
    cddp_free(meta);
    return rc;
}

/* Appends one difference to the report; the report keeps the first ones that fit. */
static void report(char *buf, size_t cap, int *count, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report(char *buf, size_t cap, int *count, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 8 < cap) {
        if ((*count)++) len += (size_t)snprintf(buf + len, cap - len, "; ");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf + len, cap - len, fmt, ap);
        va_end(ap);
    } else {
        (*count)++;
    }
}

/* Checks one file tensor against a parameter's dtype and shape. */
static void compare(const cddp_st_tensor *t, const cddp_tensor *p, const char *name, char *buf,
                    size_t cap, int *count) {
    char a[64], b[64];
    if (!t) {
        report(buf, cap, count, "'%s' is missing from the file", name);
    } else if (t->dtype != CDDP_F32) {
        report(buf, cap, count, "'%s' is %s in the file but float32 in the model", name,
               cddp_dtype_name(t->dtype));
    } else if (t->ndim != p->ndim ||
               memcmp(t->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim)) {
        report(buf, cap, count, "'%s' has shape %s in the file but %s in the model", name,
               cddp_shape_str(t->ndim, t->shape, a, sizeof a),
               cddp_shape_str(p->ndim, p->shape, b, sizeof b));
    }
}

/* Whether two tensors of an indexed file hold the same n bytes (false when unreadable). */
static bool same_bytes(int fd, const char *path, uint64_t start, const cddp_st_tensor *a,
                       const cddp_st_tensor *b, size_t n) {
    char *x = cddp_malloc(2 * n + 1);
    bool same = x && !cddp__pread_all(fd, x, n, start + cddp__st_offset(a), path, NULL) &&
                !cddp__pread_all(fd, x + n, n, start + cddp__st_offset(b), path, NULL) &&
                !memcmp(x, x + n, n);
    cddp_free(x);
    return same;
}

/* Reads from an indexed (and checked) file what this process keeps: every parameter and buffer,
 * and the optimizer's state over its shard (the whole block when it is not sharded), the bytes of
 * those ranges only. Then copies them in: nothing changes unless every read succeeded. */
static int read_needed(int fd, const char *path, uint64_t start, const cddp_safetensors *f,
                       cddp_model *m, cddp_optim *opt, cddp_error *err) {
    size_t numel = cddp_model_numel(m), nbuf = cddp_model_buffer_numel(m);
    size_t sn = opt ? cddp_optim_state_numel(opt) : 0;
    int np = cddp_model_num_params(m), nb = cddp_model_num_buffers(m);
    int ns = opt ? cddp_optim_num_states(opt) : 0, rc = CDDP_OK;
    const int64_t *shard = NULL, whole[2] = {0, (int64_t)numel};
    int nr = opt && cddp_optim_sharded(opt) ? cddp_model_shard(m, &shard, NULL) : 0;
    if (!nr) nr = 1, shard = whole;
    float *params = cddp_malloc(sizeof(float) * (numel + nbuf + sn * (size_t)ns + 1));
    if (!params) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    float *bufs = params + numel, *state = bufs + nbuf;
#define AT(name) (start + cddp__st_offset(cddp_safetensors_find(f, name)))
    for (int i = 0; i < np && rc == CDDP_OK; i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        rc = cddp__pread_all(fd, params + cddp_model_param_offset(m, i), (size_t)p->numel * 4,
                             AT(p->name), path, err);
    }
    size_t at = 0;
    for (int i = 0; i < nb && rc == CDDP_OK; at += (size_t)cddp_model_buffer(m, i++)->numel)
        rc = cddp__pread_all(fd, bufs + at, (size_t)cddp_model_buffer(m, i)->numel * 4,
                             AT(cddp_model_buffer(m, i)->name), path, err);
    for (int s = 0; s < ns && rc == CDDP_OK; s++)
        for (int i = 0; i < np && rc == CDDP_OK; i++) {
            const char *sname;
            char name[512];
            const cddp_tensor *p = cddp_model_param(m, i);
            cddp_optim_state(opt, s, &sname);
            snprintf(name, sizeof name, STATE_PREFIX "%s.%s", sname, p->name);
            int64_t off = (int64_t)cddp_model_param_offset(m, i), base = 0;
            for (int r = 0; r < nr && rc == CDDP_OK; base += shard[2 * r + 1] - shard[2 * r], r++) {
                int64_t lo = CDDP_MAX(shard[2 * r], off),
                        hi = CDDP_MIN(shard[2 * r + 1], off + p->numel);
                if (lo < hi)
                    rc = cddp__pread_all(fd, state + sn * (size_t)s + base + (lo - shard[2 * r]),
                                         (size_t)(hi - lo) * 4, AT(name) + (uint64_t)(lo - off) * 4,
                                         path, err);
            }
        }
#undef AT
    cddp_device *dev = cddp_model_device(m);
    if (rc == CDDP_OK) rc = cddp_device_upload(dev, cddp_model_data(m), params, numel * 4, err);
    at = 0;
    for (int i = 0; i < nb && rc == CDDP_OK; at += (size_t)cddp_model_buffer(m, i++)->numel)
        rc = cddp_device_upload(dev, cddp_model_buffer(m, i)->data, bufs + at,
                                (size_t)cddp_model_buffer(m, i)->numel * 4, err);
    for (int s = 0; s < ns && rc == CDDP_OK; s++)
        rc = cddp_device_upload(dev, cddp_optim_state(opt, s, NULL), state + sn * (size_t)s,
                                sn * sizeof(float), err);
    cddp_free(params);
    return rc;
}

/* The optimizer's step count and learning rate (-1 when absent) from a file's metadata. */
static int optim_numbers(const cddp_safetensors *f, const char *path, int64_t *steps, double *lr,
                         cddp_error *err) {
    const char *text = cddp_safetensors_meta(f, "optimizer_steps");
    const char *lr_text = cddp_safetensors_meta(f, "lr");
    char what[300];
    snprintf(what, sizeof what, "%.240s: metadata optimizer_steps", path);
    int rc = cddp_parse_int(what, text ? text : "", 0, INT64_MAX, steps, err);
    snprintf(what, sizeof what, "%.240s: metadata lr", path);
    *lr = -1;
    if (rc == CDDP_OK && lr_text) rc = cddp_parse_double(what, lr_text, 0, 1e6, false, lr, err);
    if (rc != CDDP_OK && err) err->code = CDDP_EFORMAT;
    return rc == CDDP_OK ? CDDP_OK : CDDP_EFORMAT;
}

int cddp_checkpoint_load(const char *path, cddp_model *m, cddp_optim *opt, cddp_safetensors **file,
                         cddp_error *err) {
    if (file) *file = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return cddp__ckpt_set_load(path, m, opt, file, err);
    int fd = open(path, O_RDONLY | O_CLOEXEC); /* one file for the header and the data */
    if (fd < 0)
        return cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s",
                              path, strerror(errno));
    uint64_t start = 0, size = 0;
    cddp_safetensors *f = cddp__safetensors_index_fd(fd, path, &start, &size, err);
    if (!f) {
        close(fd);
        return err && err->code ? err->code : CDDP_EFORMAT;
    }
    char diff[CDDP_ERROR_MSG_MAX - 128] = "";
    char sname_buf[512];
    int ndiff = 0, np = cddp_model_num_params(m);
    int nb = cddp_model_num_buffers(m);
    for (int i = 0; i < np + nb; i++) {
        const cddp_tensor *p = i < np ? cddp_model_param(m, i) : cddp_model_buffer(m, i - np);
        compare(cddp_safetensors_find(f, p->name), p, p->name, diff, sizeof diff, &ndiff);
    }
    for (int i = 0; i < cddp_model_num_ties(m); i++) { /* a second name, when present, agrees */
        const char *name;
        const cddp_tensor *p = cddp_model_tie(m, i, &name);
        const cddp_st_tensor *t = cddp_safetensors_find(f, name),
                             *u = cddp_safetensors_find(f, p->name);
        if (!t || !u) continue;
        int before = ndiff;
        compare(t, p, name, diff, sizeof diff, &ndiff);
        bool same_shape = u->dtype == t->dtype && u->ndim == t->ndim &&
                          !memcmp(u->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        if (ndiff == before && same_shape &&
            !same_bytes(fd, path, start, t, u, (size_t)p->numel * 4))
            report(diff, sizeof diff, &ndiff, "'%s' is tied to '%s' but they differ in the file",
                   name, p->name);
    }
    for (int i = 0; i < cddp_safetensors_count(f); i++) {
        const char *name = cddp_safetensors_at(f, i)->name;
        if (strncmp(name, STATE_PREFIX, strlen(STATE_PREFIX)) != 0 && !cddp_model_find(m, name) &&
            !cddp_model_find_buffer(m, name))
            report(diff, sizeof diff, &ndiff, "'%s' is in the file but not in the model", name);
    }
    const char *kind = cddp_safetensors_meta(f, "optimizer");
    const char *steps = cddp_safetensors_meta(f, "optimizer_steps");
    if (opt) {
        if (!kind || !steps) {
            report(diff, sizeof diff, &ndiff,
                   "the file has no optimizer state (saved without "
                   "an optimizer?)");
        } else if (strcmp(kind, cddp_optim_name(opt)) != 0) {
            report(diff, sizeof diff, &ndiff, "the file holds %s state but the optimizer is %s",
                   kind, cddp_optim_name(opt));
        } else {
            for (int s = 0; s < cddp_optim_num_states(opt); s++)
                for (int i = 0; i < np; i++) {
                    const char *sn;
                    const cddp_tensor *p = cddp_model_param(m, i);
                    cddp_optim_state(opt, s, &sn);
                    snprintf(sname_buf, sizeof sname_buf, STATE_PREFIX "%s.%s", sn, p->name);
                    compare(cddp_safetensors_find(f, sname_buf), p, sname_buf, diff, sizeof diff,
                            &ndiff);
                }
        }
    }
    int rc = CDDP_OK;
    if (ndiff)
        rc = cddp_error_set(err, CDDP_ESHAPE, "%s does not match the model (%d difference%s): %s",
                            path, ndiff, ndiff > 1 ? "s" : "", diff);
    /* The optimizer's numbers, checked before anything changes. */
    int64_t nsteps = 0;
    double lr = -1;
    if (rc == CDDP_OK && opt) {
        rc = optim_numbers(f, path, &nsteps, &lr, err);
        if (rc == CDDP_OK) rc = cddp_optim_sync_shard(opt, err);
    }
    if (rc == CDDP_OK) rc = read_needed(fd, path, start, f, m, opt, err);
    close(fd);
    if (rc == CDDP_OK && opt) {
        cddp_optim_set_steps(opt, nsteps);
        if (lr >= 0) cddp_optim_set_lr(opt, (float)lr);
    }
    if (rc == CDDP_OK && file) {
        cddp__safetensors_forget_data(f);
        *file = f;
    } else {
        cddp_safetensors_destroy(f);
    }
    return rc;
}

/* ---- sets ---------------------------------------------------------------------------------- */

/* The set against the model and optimizer: every difference in diff. */
static void compare_set(const cddp_ckpt_set *s, const cddp_model *m, const cddp_optim *opt,
                        char *diff, size_t cap, int *ndiff) {
    int np = cddp_model_num_params(m), first = *ndiff;
    for (int pass = 0; pass < 2 && *ndiff == first;
         pass++) /* shapes, then (if all agree) offsets */
        for (int i = 0; i < np; i++) {
            const cddp_tensor *p = cddp_model_param(m, i);
            const cddp_st_tensor *t = NULL;
            int64_t off = -1;
            for (int j = 0; j < cddp_ckpt_set_num_params(s) && !t; j++)
                if (!strcmp(cddp_ckpt_set_param(s, j, &off)->name, p->name))
                    t = cddp_ckpt_set_param(s, j, &off);
            if (pass == 0)
                compare(t, p, p->name, diff, cap, ndiff);
            else if (off != (int64_t)cddp_model_param_offset(m, i))
                report(diff, cap, ndiff,
                       "'%s' starts at element %" PRId64 " of the set's flat block but at %zu in "
                       "the model's (parameters declared in another order)",
                       p->name, off, cddp_model_param_offset(m, i));
        }
    for (int j = 0; j < cddp_ckpt_set_num_params(s); j++) {
        const char *name = cddp_ckpt_set_param(s, j, NULL)->name;
        if (!cddp_model_find(m, name))
            report(diff, cap, ndiff, "'%s' is in the set but not in the model", name);
    }
    const cddp_safetensors *man = cddp_ckpt_set_manifest(s);
    for (int i = 0; i < cddp_model_num_buffers(m); i++) {
        const cddp_tensor *b = cddp_model_buffer(m, i);
        compare(cddp_safetensors_find(man, b->name), b, b->name, diff, cap, ndiff);
    }
    if (!opt) return;
    const char *kind = cddp_safetensors_meta(man, "optimizer");
    if (!kind) {
        report(diff, cap, ndiff, "the set has no optimizer state (saved without an optimizer?)");
        return;
    }
    if (strcmp(kind, cddp_optim_name(opt)) != 0) {
        report(diff, cap, ndiff, "the set holds %s state but the optimizer is %s", kind,
               cddp_optim_name(opt));
        return;
    }
    for (int k = 0; k < cddp_optim_num_states(opt); k++) {
        const char *name;
        cddp_optim_state(opt, k, &name);
        int j = 0;
        while (j < cddp_ckpt_set_num_states(s) && strcmp(cddp_ckpt_set_state(s, j), name) != 0) j++;
        if (j == cddp_ckpt_set_num_states(s))
            report(diff, cap, ndiff, "the set has no optimizer state '%s'", name);
    }
}

int cddp__ckpt_set_load(const char *path, cddp_model *m, cddp_optim *opt, cddp_safetensors **file,
                        cddp_error *err) {
    cddp_ckpt_set *s = cddp_ckpt_set_open(path, err);
    if (!s) return err ? err->code : CDDP_EFORMAT;
    char diff[CDDP_ERROR_MSG_MAX - 128] = "";
    int ndiff = 0, rc = CDDP_OK, ns = opt ? cddp_optim_num_states(opt) : 0;
    const char *dir = cddp_ckpt_set_dir(s);
    int64_t numel = (int64_t)cddp_model_numel(m), nsteps = 0;
    double lr = -1;
    compare_set(s, m, opt, diff, sizeof diff, &ndiff);
    if (!ndiff && cddp_ckpt_set_numel(s) != numel)
        report(diff, sizeof diff, &ndiff,
               "the set's flat block has %" PRId64 " elements but the "
               "model's %" PRId64,
               cddp_ckpt_set_numel(s), numel);
    if (ndiff) {
        cddp_error_set(err, CDDP_ESHAPE, "%s does not match the model (%d difference%s): %s", dir,
                       ndiff, ndiff > 1 ? "s" : "", diff);
        cddp_ckpt_set_close(s);
        return CDDP_ESHAPE;
    }
    if (opt && (optim_numbers(cddp_ckpt_set_manifest(s), dir, &nsteps, &lr, err) != CDDP_OK ||
                cddp_optim_sync_shard(opt, err) != CDDP_OK)) {
        cddp_ckpt_set_close(s);
        return err ? err->code : CDDP_EFORMAT;
    }
    /* Everything is read before anything changes: the parameters whole, the state over this
     * process's shard of it (the whole block when the optimizer is not sharded). */
    const int64_t *shard = NULL, whole[2] = {0, numel};
    int nr = opt && cddp_optim_sharded(opt) ? cddp_model_shard(m, &shard, NULL) : 0;
    if (!nr) nr = 1, shard = whole;
    size_t state_numel = opt ? cddp_optim_state_numel(opt) : 0;
    float *params = cddp_malloc(sizeof(float) * (size_t)(numel ? numel : 1));
    float *state = cddp_malloc(sizeof(float) * (state_numel * (size_t)ns + 1));
    if (!params || !state) rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
    if (rc == CDDP_OK) rc = cddp_ckpt_set_read(s, NULL, 0, numel, params, err);
    for (int k = 0; k < ns && rc == CDDP_OK; k++) {
        const char *name;
        cddp_optim_state(opt, k, &name);
        float *to = state + state_numel * (size_t)k;
        for (int r = 0; r < nr && rc == CDDP_OK; r++) {
            rc = cddp_ckpt_set_read(s, name, shard[2 * r], shard[2 * r + 1], to, err);
            to += shard[2 * r + 1] - shard[2 * r];
        }
    }
    cddp_device *dev = cddp_model_device(m);
    if (rc == CDDP_OK)
        rc =
            cddp_device_upload(dev, cddp_model_data(m), params, sizeof(float) * (size_t)numel, err);
    for (int i = 0; i < cddp_model_num_buffers(m) && rc == CDDP_OK; i++) {
        cddp_tensor *b = cddp_model_buffer(m, i);
        rc = cddp_device_upload(dev, b->data,
                                cddp_safetensors_find(cddp_ckpt_set_manifest(s), b->name)->data,
                                (size_t)b->numel * 4, err);
    }
    for (int k = 0; k < ns && rc == CDDP_OK; k++)
        rc = cddp_device_upload(dev, cddp_optim_state(opt, k, NULL),
                                state + state_numel * (size_t)k, sizeof(float) * state_numel, err);
    if (rc == CDDP_OK) {
        if (opt) {
            cddp_optim_set_steps(opt, nsteps);
            if (lr >= 0) cddp_optim_set_lr(opt, (float)lr);
        }
        if (file) *file = cddp__ckpt_set_take_manifest(s);
    }
    cddp_free(params);
    cddp_free(state);
    cddp_ckpt_set_close(s);
    return rc;
}
