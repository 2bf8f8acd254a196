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

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_PREFIX "optim."

static cddp_st_tensor param_entry(const cddp_tensor *p, const char *name, const void *data) {
    cddp_st_tensor t = {.name = name, .dtype = CDDP_F32, .ndim = p->ndim, .data = data};
    memcpy(t.shape, p->shape, sizeof t.shape);
    return t;
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
    if (!list || !names || !meta) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < np; i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        list[i] = param_entry(p, p->name, p->data);
        for (int s = 0; s < ns; s++) {
            const char *sname;
            const float *block = cddp_optim_state(opt, s, &sname);
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
        list[np * (1 + ns) + i] = param_entry(b, b->name, b->data);
    }
    for (int i = 0; i < nt; i++) { /* a tied parameter under its second name too */
        const char *name;
        const cddp_tensor *p = cddp_model_tie(m, i, &name);
        list[np * (1 + ns) + nb + i] = param_entry(p, name, p->data);
    }
    int k = 0;
    meta[k++] = "cddp_format";
    meta[k++] = "checkpoint-1";
    if (opt) {
        snprintf(steps, sizeof steps, "%" PRId64, cddp_optim_steps(opt));
        snprintf(lr, sizeof lr, "%.9g", (double)cddp_optim_lr(opt));
        meta[k++] = "optimizer";
        meta[k++] = cddp_optim_name(opt);
        meta[k++] = "optimizer_steps";
        meta[k++] = steps;
        meta[k++] = "lr";
        meta[k++] = lr;
    }
    for (int i = 0; i < nmeta; i++) meta[k++] = metadata[i];
    meta[k] = NULL;
    rc = cddp_safetensors_write(path, list, n, meta, err);
out:
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

int cddp_checkpoint_load(const char *path, cddp_model *m, cddp_optim *opt, cddp_safetensors **file,
                         cddp_error *err) {
    if (file) *file = NULL;
    if (opt && cddp_optim_num_states(opt) > 0 && cddp_optim_state_numel(opt) != cddp_model_numel(m))
        return cddp_error_set(err, CDDP_ESTATE,
                              "%s: the optimizer's state is sharded across the ranks (ZeRO-1): "
                              "save and load it with cddp_ddp_save and cddp_ddp_load",
                              path);
    cddp_safetensors *f = cddp_safetensors_read(path, err);
    if (!f) return err ? err->code : CDDP_EFORMAT;
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
        if (ndiff == before && same_shape && memcmp(u->data, t->data, (size_t)p->numel * 4) != 0)
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
    if (ndiff) {
        cddp_error_set(err, CDDP_ESHAPE, "%s does not match the model (%d difference%s): %s", path,
                       ndiff, ndiff > 1 ? "s" : "", diff);
        cddp_safetensors_destroy(f);
        return CDDP_ESHAPE;
    }
    /* The optimizer's numbers, checked before anything changes. */
    int64_t nsteps = 0;
    double lr = -1;
    if (opt) {
        const char *lr_text = cddp_safetensors_meta(f, "lr");
        char what[300];
        snprintf(what, sizeof what, "%.240s: metadata optimizer_steps", path);
        int rc = cddp_parse_int(what, steps, 0, INT64_MAX, &nsteps, err);
        snprintf(what, sizeof what, "%.240s: metadata lr", path);
        if (rc == CDDP_OK && lr_text)
            rc = cddp_parse_double(what, lr_text, 0, 1e6, false, &lr, err);
        if (rc != CDDP_OK) {
            cddp_safetensors_destroy(f);
            if (err) err->code = CDDP_EFORMAT;
            return CDDP_EFORMAT;
        }
    }
    /* Everything matches: copy. */
    for (int i = 0; i < nb; i++) {
        cddp_tensor *b = cddp_model_buffer(m, i);
        memcpy(b->data, cddp_safetensors_find(f, b->name)->data, (size_t)b->numel * 4);
    }
    for (int i = 0; i < np; i++) {
        cddp_tensor *p = cddp_model_param(m, i);
        memcpy(p->data, cddp_safetensors_find(f, p->name)->data, (size_t)p->numel * 4);
        for (int s = 0; opt && s < cddp_optim_num_states(opt); s++) {
            const char *sn;
            float *block = cddp_optim_state(opt, s, &sn);
            snprintf(sname_buf, sizeof sname_buf, STATE_PREFIX "%s.%s", sn, p->name);
            memcpy(block + cddp_model_param_offset(m, i), cddp_safetensors_find(f, sname_buf)->data,
                   (size_t)p->numel * 4);
        }
    }
    if (opt) {
        cddp_optim_set_steps(opt, nsteps);
        if (lr >= 0) cddp_optim_set_lr(opt, (float)lr);
    }
    if (file)
        *file = f;
    else
        cddp_safetensors_destroy(f);
    return CDDP_OK;
}
