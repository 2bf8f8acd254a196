/* st_files.c: one safetensors file, or Hugging Face's sharded checkpoint, read as one set of named
 * tensors whose data stays on disk (io/internal.h).
 *
 * A sharded checkpoint (save_pretrained past max_shard_size: model-00001-of-00002.safetensors,
 * ...) comes with model.safetensors.index.json, whose "weight_map" names the file that holds each
 * tensor. Each file named is opened once and its header read; every tensor of the map must be in
 * the file the map names, and no tensor may be in two files: a checkpoint half copied, or shards
 * of two saves mixed, is refused naming the tensor and the files, before anything is read.
 */
#include "io/internal.h"

#include "cddp/device.h"
#include "cddp/internal/device.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void cddp__st_files_close(cddp__st_files *f) {
    for (int k = 0; k < f->n; k++) {
        cddp_safetensors_destroy(f->index[k]);
        if (f->fd[k] >= 0) close(f->fd[k]);
        free(f->path[k]);
    }
    free(f->index);
    free(f->fd);
    free(f->data_start);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Adds the file at path (its header read; an open fd taken over when fd >= 0). */
static int add_file(cddp__st_files *f, const char *path, int fd, cddp_error *err) {
    int k = f->n;
    cddp_safetensors **index = realloc(f->index, (size_t)(k + 1) * sizeof *index);
    if (index) f->index = index;
    int *fds = index ? realloc(f->fd, (size_t)(k + 1) * sizeof *fds) : NULL;
    if (fds) f->fd = fds;
    uint64_t *starts = fds ? realloc(f->data_start, (size_t)(k + 1) * sizeof *starts) : NULL;
    if (starts) f->data_start = starts;
    char **paths = starts ? realloc(f->path, (size_t)(k + 1) * sizeof *paths) : NULL;
    if (paths) f->path = paths;
    if (!paths || !(f->path[k] = strdup(path))) {
        if (fd >= 0) close(fd);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    f->index[k] = NULL;
    f->fd[k] = fd >= 0 ? fd : open(path, O_RDONLY | O_CLOEXEC);
    f->n++;
    if (f->fd[k] < 0)
        return cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s",
                              path, strerror(errno));
    uint64_t size;
    f->index[k] = cddp__safetensors_index_fd(f->fd[k], path, &f->data_start[k], &size, err);
    return f->index[k] ? CDDP_OK : (err && err->code ? err->code : CDDP_EFORMAT);
}

static bool is_index(const char *path) {
    size_t n = strlen(path);
    return n >= 11 && strcmp(path + n - 11, ".index.json") == 0;
}

/* The shards an index.json names, each checked to hold the tensors the map gives it. */
static int open_index(cddp__st_files *f, const char *path, cddp_error *err) {
    cJSON *root;
    CDDP_TRY(cddp__json_read(path, 64 << 20, &root, err));
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = cJSON_IsObject(map) && map->child
                 ? CDDP_OK
                 : cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: no \"weight_map\" of tensors to files: not Hugging Face's "
                                  "index of a sharded checkpoint (or damaged)",
                                  path);
    const char *slash = strrchr(path, '/');
    int dir = slash ? (int)(slash - path + 1) : 0;
    for (const cJSON *e = rc ? NULL : map->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s: %s maps to no file name of its folder",
                                path, e->string);
            break;
        }
        char file[4200];
        snprintf(file, sizeof file, "%.*s%s", dir, path, e->valuestring);
        int k = 0;
        while (k < f->n && strcmp(f->path[k], file) != 0) k++;
        if (k == f->n && (rc = add_file(f, file, -1, err)) != CDDP_OK) {
            char why[CDDP_ERROR_MSG_MAX];
            snprintf(why, sizeof why, "%s", err ? err->msg : "");
            cddp_error_set(err, rc, "%s names %s for %s: %s (a shard missing?)", path,
                           e->valuestring, e->string, why);
            break;
        }
        if (!cddp_safetensors_find(f->index[k], e->string))
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s maps %s to %s, which does not hold it (shards of another "
                                "save, or one cut short?)",
                                path, e->string, file);
    }
    for (int k = 0; !rc && k < f->n; k++) /* no tensor in two shards */
        for (int i = 0; !rc && i < cddp_safetensors_count(f->index[k]); i++) {
            const char *name = cddp_safetensors_at(f->index[k], i)->name;
            for (int j = k + 1; !rc && j < f->n; j++)
                if (cddp_safetensors_find(f->index[j], name))
                    rc = cddp_error_set(err, CDDP_EFORMAT, "%s is in both %s and %s (%s)", name,
                                        f->path[k], f->path[j], path);
        }
    cJSON_Delete(root);
    return rc;
}

const char *cddp__hf_weights_file(const char *path, char *file, size_t cap) {
    static const char *const names[] = {"model.safetensors.index.json", "model.safetensors"};
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return path;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        snprintf(file, cap, "%s/%s", path, names[k]);
        if (access(file, F_OK) == 0) return file;
    }
    return path;
}

int cddp__st_files_open(cddp__st_files *f, const char *path, int fd, cddp_error *err) {
    memset(f, 0, sizeof *f);
    int rc = is_index(path) ? open_index(f, path, err) : add_file(f, path, fd, err);
    if (is_index(path) && fd >= 0) close(fd);
    if (rc != CDDP_OK) cddp__st_files_close(f);
    return rc;
}

const cddp_st_tensor *cddp__st_files_find(const cddp__st_files *f, const char *name, int *file) {
    for (int k = 0; k < f->n; k++) {
        const cddp_st_tensor *t = cddp_safetensors_find(f->index[k], name);
        if (t) {
            if (file) *file = k;
            return t;
        }
    }
    return NULL;
}

int cddp__st_files_count(const cddp__st_files *f) {
    int n = 0;
    for (int k = 0; k < f->n; k++) n += cddp_safetensors_count(f->index[k]);
    return n;
}

const cddp_st_tensor *cddp__st_files_at(const cddp__st_files *f, int i, int *file) {
    for (int k = 0; k < f->n; i -= cddp_safetensors_count(f->index[k]), k++)
        if (i < cddp_safetensors_count(f->index[k])) {
            if (file) *file = k;
            return cddp_safetensors_at(f->index[k], i);
        }
    return NULL;
}

int cddp__st_files_read(const cddp__st_files *f, const cddp_st_tensor *t, void *dst, size_t bytes,
                        cddp_error *err) {
    for (int k = 0; k < f->n; k++)
        if (cddp_safetensors_find(f->index[k], t->name) == t)
            return cddp__pread_all(f->fd[k], dst, bytes, f->data_start[k] + cddp__st_offset(t),
                                   f->path[k], err);
    return cddp_error_set(err, CDDP_EINVAL, "%s is in none of the files read", t->name);
}

int cddp__st_files_read_f32(const cddp__st_files *f, const cddp_st_tensor *t, float *dst, int64_t n,
                            cddp_error *err) {
    if (t->dtype == CDDP_F32) return cddp__st_files_read(f, t, dst, (size_t)n * 4, err);
    if (t->dtype != CDDP_BF16 && t->dtype != CDDP_F16)
        return cddp_error_set(err, CDDP_EFORMAT, "%s is %s, not floating point", t->name,
                              cddp_dtype_name(t->dtype));
    uint16_t *h = malloc((size_t)n * 2 + 1);
    if (!h) return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %s", t->name);
    int rc = cddp__st_files_read(f, t, h, (size_t)n * 2, err);
    if (rc == CDDP_OK) /* every 16-bit float is a float32 exactly */
        cddp_device_from_half(cddp_device_cpu(), dst, h, (size_t)n, t->dtype == CDDP_F16, 1.0f);
    free(h);
    return rc;
}

int cddp__check_finite(const char *path, const char *name, const float *x, int64_t n,
                       cddp_error *err) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) bad++, first = first < 0 ? i : first;
    if (!bad) return CDDP_OK;
    return cddp_error_set(err, CDDP_EFORMAT,
                          "%s: %s holds %" PRId64 " value%s that %s NaN or infinite "
                          "(the first, %s, at element %" PRId64 " of %" PRId64 "): the file is "
                          "damaged, or was saved from a run that diverged; nothing can train "
                          "from it",
                          path, name, bad, bad > 1 ? "s" : "", bad > 1 ? "are" : "is",
                          isnan(x[first]) ? "NaN"
                          : x[first] > 0  ? "+inf"
                                          : "-inf",
                          first, n);
}
