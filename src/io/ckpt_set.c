/* ckpt_set.c: saving checkpoint sets (the format is in cddp/checkpoint.h).
 *
 * A save is three steps so that ranks can run them with their own group: rank 0 prepares the
 * folder (and hides a set saved there before by deleting its manifest), every rank writes its
 * shard atomically, and rank 0 commits: it checks the shards on disk against what the ranks
 * reported, writes the manifest atomically (the moment the set becomes complete), then removes
 * what is no longer wanted: other worlds' shards in the folder, sets beyond the newest `keep`
 * and sets that never got a manifest (saves that were killed). Removal deletes a set's manifest
 * first, so a set is never seen half-deleted.
 */
#include "cddp/checkpoint.h"
#include "io/internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int cddp_ckpt_set_path(const char *root, int64_t step, char *dir, size_t cap, cddp_error *err) {
    if (step < 0) return cddp_error_set(err, CDDP_EINVAL, "a set's step must be >= 0");
    int n = snprintf(dir, cap, "%s/step-%08" PRId64, root, step);
    if (n < 0 || (size_t)n >= cap)
        return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", root);
    return CDDP_OK;
}

int cddp_ckpt_set_prepare(const char *root, int64_t step, char *dir, size_t cap, cddp_error *err) {
    CDDP_TRY(cddp_ckpt_set_path(root, step, dir, cap, err));
    CDDP_TRY(cddp__make_dirs(dir, err));
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/" CDDP_CKPT_MANIFEST, dir);
    if (unlink(manifest) == 0) {
        sync_dir(dir);
        cddp_log(CDDP_LOG_INFO, "io", "%s: replacing the set saved there before", dir);
    } else if (errno != ENOENT) {
        return cddp_error_set(err, CDDP_EIO, "cannot remove %s: %s", manifest, strerror(errno));
    }
    return CDDP_OK;
}

/* The optimizer's state block (as the host reads it) over [lo, hi): a sharded optimizer holds its
 * shard's ranges one after another. */
static const float *state_at(const cddp_model *m, const cddp_optim *opt, const float *block,
                             int64_t lo, int64_t hi) {
    if (!cddp_optim_sharded(opt)) return block + lo;
    const int64_t *r;
    int n = cddp_model_shard(m, &r, NULL);
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        if (lo >= r[2 * k] && hi <= r[2 * k + 1]) return block + at + (lo - r[2 * k]);
        at += r[2 * k + 1] - r[2 * k];
    }
    return NULL;
}

/* {"<tensor name>": CRC-32 of its data, ...} (cJSON's text, the caller's to free). */
static char *crc_json(const cddp_st_tensor *list, int n) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < n; i++) {
        uint32_t c = cddp__crc32(0, list[i].data, (size_t)list[i].shape[0] * sizeof(float));
        cJSON_AddNumberToObject(o, list[i].name, (double)c);
    }
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    char *own = text ? cddp_strdup(text) : NULL;
    free(text);
    return own;
}

int cddp_ckpt_set_write_shard(const char *dir, int rank, int world, const cddp_model *m,
                              cddp_optim *opt, int nranges, const int64_t *ranges,
                              cddp_ckpt_shard *info, cddp_error *err) {
    if (world < 1 || rank < 0 || rank >= world || nranges < 0)
        return cddp_error_set(err, CDDP_EINVAL, "shard of rank %d of %d: invalid", rank, world);
    int64_t total = (int64_t)cddp_model_numel(m);
    for (int k = 0; k < nranges; k++)
        if (ranges[2 * k] < (k ? ranges[2 * k - 1] : 0) || ranges[2 * k + 1] < ranges[2 * k] ||
            ranges[2 * k + 1] > total)
            return cddp_error_set(err, CDDP_EINVAL,
                                  "shard of rank %d: range %d [%" PRId64 ", %" PRId64
                                  ") is out of order or outside the %" PRId64 " elements",
                                  rank, k, ranges[2 * k], ranges[2 * k + 1], total);
    if (opt) CDDP_TRY(cddp_optim_sync_shard(opt, err));
    int ns = opt ? cddp_optim_num_states(opt) : 0, n = 0, rc = CDDP_OK;
    size_t cap = (size_t)nranges * (size_t)(1 + ns) + 1;
    cddp_st_tensor *list = cddp_calloc(cap, sizeof *list);
    char **names = cddp_calloc(cap, sizeof *names);
    cddp__host_model h = {0};
    if (!list || !names) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
        goto out;
    }
    CDDP_TRY_GOTO(cddp__host_model_get(m, opt, &h, err), out);
    for (int k = 0; k < nranges; k++) {
        int64_t lo = ranges[2 * k], hi = ranges[2 * k + 1];
        if (lo == hi) continue;
        for (int s = -1; s < ns; s++) {
            const char *sname = "";
            const float *data = h.params + lo;
            if (s >= 0) {
                cddp_optim_state(opt, s, &sname);
                if (!(data = state_at(m, opt, h.state[s], lo, hi))) {
                    rc = cddp_error_set(err, CDDP_EINVAL,
                                        "shard of rank %d: [%" PRId64 ", %" PRId64
                                        ") is not inside the optimizer's shard",
                                        rank, lo, hi);
                    goto out;
                }
            }
            char nm[160];
            if (s < 0)
                snprintf(nm, sizeof nm, "flat.%" PRId64, lo);
            else
                snprintf(nm, sizeof nm, "optim.%.64s.flat.%" PRId64, sname, lo);
            if (!(names[n] = cddp_strdup(nm))) {
                rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
                goto out;
            }
            list[n] = (cddp_st_tensor){
                .name = names[n], .dtype = CDDP_F32, .ndim = 1, .shape = {hi - lo}, .data = data};
            n++;
        }
    }
    char path[4200], r[16], w[16];
    snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", dir, rank, world);
    snprintf(r, sizeof r, "%d", rank);
    snprintf(w, sizeof w, "%d", world);
    /* Each tensor's CRC-32, which a reader checks on the ranges it reads (the manifest holds a
     * CRC-32 of this header, so a shard from another save is found too). */
    char *crcs = n ? crc_json(list, n) : cddp_strdup("{}");
    if (!crcs) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
        goto out;
    }
    const char *meta[] = {"cddp_format", "checkpoint-shard-1", "rank", r, "world", w, "crc32", crcs,
                          NULL};
    uint64_t bytes = 0;
    uint32_t crc = 0;
    rc = cddp__safetensors_write(path, list, n, meta, &bytes, &crc, err);
    cddp_free(crcs);
    if (rc == CDDP_OK && info) *info = (cddp_ckpt_shard){.bytes = (int64_t)bytes, .crc32 = crc};
out:
    cddp__host_model_free(&h);
    for (size_t i = 0; names && i < cap; i++) cddp_free(names[i]);
    cddp_free(names);
    cddp_free(list);
    return rc;
}

/* ---- the manifest -------------------------------------------------------------------------- */

static char *layout_json(const cddp_model *m, const cddp_optim *opt, const cddp_ckpt_shard *shards,
                         const uint32_t *headers, int world, const cddp__ckpt_layout *l,
                         int which) {
    cJSON *a = cJSON_CreateArray();
    if (!a) return NULL;
    if (which == 0) { /* the parameters: [name, offset, shape] */
        for (int i = 0; i < cddp_model_num_params(m); i++) {
            const cddp_tensor *p = cddp_model_param(m, i);
            cJSON *e = cJSON_CreateArray(), *shape = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateString(p->name));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)cddp_model_param_offset(m, i)));
            for (int d = 0; d < p->ndim; d++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
            cJSON_AddItemToArray(e, shape);
            cJSON_AddItemToArray(a, e);
        }
    } else if (which == 1) { /* the ties: [second name, parameter] */
        for (int i = 0; i < cddp_model_num_ties(m); i++) {
            const char *name;
            const cddp_tensor *p = cddp_model_tie(m, i, &name);
            cJSON *e = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateString(name));
            cJSON_AddItemToArray(e, cJSON_CreateString(p->name));
            cJSON_AddItemToArray(a, e);
        }
    } else if (which == 2) { /* the optimizer's states */
        for (int s = 0; opt && s < cddp_optim_num_states(opt); s++) {
            const char *name;
            cddp_optim_state(opt, s, &name);
            cJSON_AddItemToArray(a, cJSON_CreateString(name));
        }
    } else if (which == 3) { /* the shards: [bytes, crc32, the header's crc32] */
        for (int r = 0; r < world; r++) {
            cJSON *e = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)shards[r].bytes));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)shards[r].crc32));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)headers[r]));
            cJSON_AddItemToArray(a, e);
        }
    } else { /* the ranges: [shard, begin, end, file offset of the parameters, of each state] */
        int ns = opt ? cddp_optim_num_states(opt) : 0;
        for (int i = 0; i < l->n; i++) {
            const cddp__ckpt_range *g = &l->ranges[i];
            cJSON *e = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateNumber(g->shard));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)g->begin));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)g->end));
            for (int k = 0; k <= ns; k++)
                cJSON_AddItemToArray(e, cJSON_CreateNumber((double)g->at[k]));
            cJSON_AddItemToArray(a, e);
        }
    }
    char *text = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return text;
}

/* Removes a set: its manifest first, so that it is never seen half-deleted. */
static void remove_set(const char *root, const char *name) {
    char dir[4400], path[4500];
    snprintf(dir, sizeof dir, "%.4095s/%.255s", root, name);
    snprintf(path, sizeof path, "%s/" CDDP_CKPT_MANIFEST, dir);
    if (unlink(path) == 0) sync_dir(dir);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    if (rmdir(dir) != 0)
        cddp_log(CDDP_LOG_WARN, "io", "cannot remove %s: %s", dir, strerror(errno));
}

/* Removes from dir, once its manifest is committed, the shard files of other world sizes (a set
 * saved there before by more ranks) and every temporary: this save's shards are all in place, so
 * a temporary is a killed writer's (of an earlier save into this folder, of any world size and
 * host), which the writers' own sweep misses when its name is not theirs. */
static void remove_other_shards(const char *dir, int world) {
    DIR *d = opendir(dir);
    if (!d) return;
    char mine[64];
    snprintf(mine, sizeof mine, "-of-%05d.safetensors", world);
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name), ml = strlen(mine);
        bool temporary = strstr(e->d_name, ".tmp.") != NULL;
        if (temporary || (strncmp(e->d_name, "shard-", 6) == 0 &&
                          (len < ml || strcmp(e->d_name + len - ml, mine) != 0))) {
            if (temporary)
                cddp_log(CDDP_LOG_INFO, "io", "removed %s/%s, left by a writer that was killed",
                         dir, e->d_name);
            unlinkat(dirfd(d), e->d_name, 0);
        }
    }
    closedir(d);
}

/* Keeps the newest keep complete sets of root (sets: root as it was before this commit, newest
 * first), the one just committed (named current) counted first, and removes sets without a
 * manifest. */
static void prune(const char *root, const cddp__ckpt_entry *sets, int n, const char *current,
                  int keep) {
    int kept = 1; /* the current set */
    for (int i = 0; i < n; i++) {
        if (strcmp(sets[i].name, current) == 0) continue;
        if (sets[i].seq == CDDP__CKPT_UNREADABLE) continue; /* not ours to judge */
        if (sets[i].seq < 0 || (keep > 0 && kept >= keep)) {
            if (sets[i].seq < 0)
                cddp_log(CDDP_LOG_INFO, "io", "removing %s/%s (incomplete: a save that stopped)",
                         root, sets[i].name);
            else
                cddp_log(CDDP_LOG_INFO, "io", "removing %s/%s (keeping the newest %d)", root,
                         sets[i].name, keep);
            remove_set(root, sets[i].name);
        } else {
            kept++;
        }
    }
    sync_dir(root);
}

int cddp_ckpt_set_commit(const char *dir, int world, const cddp_model *m, const cddp_optim *opt,
                         const cddp_ckpt_shard *shards, const char *const *metadata, int keep,
                         cddp_error *err) {
    if (world < 1 || keep < 0)
        return cddp_error_set(err, CDDP_EINVAL, "%s: world %d, keep %d: invalid", dir, world, keep);
    char root[4096], name[4096];
    const char *slash = strrchr(dir, '/');
    snprintf(root, sizeof root, "%.*s", slash ? (int)(slash - dir) : 1, slash ? dir : ".");
    snprintf(name, sizeof name, "%s", slash ? slash + 1 : dir);
    /* The shards as the ranks wrote them: sizes, and ranges that cover the block once. */
    int ns = opt ? cddp_optim_num_states(opt) : 0;
    const char *states[CDDP__CKPT_MAX_STATES];
    for (int s = 0; s < ns && s < CDDP__CKPT_MAX_STATES; s++) cddp_optim_state(opt, s, &states[s]);
    cddp__ckpt_layout layout = {0};
    CDDP_TRY(cddp__ckpt_index(dir, world, shards, ns, states, (int64_t)cddp_model_numel(m), &layout,
                              err));

    cddp__ckpt_entry *sets = NULL; /* one scan: the commit number, then what to keep */
    int nsets = cddp__ckpt_scan(root, &sets);
    int64_t seq = 0;
    for (int i = 0; i < nsets; i++) seq = CDDP_MAX(seq, sets[i].seq);

    int nb = cddp_model_num_buffers(m), nmeta = 0, rc = CDDP_OK;
    while (metadata && metadata[nmeta]) nmeta++;
    cddp_st_tensor *bufs = cddp_calloc((size_t)nb + 1, sizeof *bufs);
    const char **meta = cddp_calloc((size_t)nmeta + 32, sizeof *meta);
    char *json[5] = {0};
    cddp__host_model h = {0};
    uint32_t *headers = cddp_calloc((size_t)world, sizeof *headers); /* each shard's header */
    for (int r = 0; headers && r < world && rc == CDDP_OK; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", dir, r, world);
        rc = cddp__shard_header_crc(path, &headers[r], err);
    }
    if (rc != CDDP_OK) goto out;
    for (int j = 0; headers && j < 5; j++)
        json[j] = layout_json(m, opt, shards, headers, world, &layout, j);
    if (!headers || !bufs || !meta || !json[0] || !json[1] || !json[2] || !json[3] || !json[4]) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
        goto out;
    }
    CDDP_TRY_GOTO(cddp__host_model_get(m, NULL, &h, err), out);
    for (int i = 0; i < nb; i++) {
        const cddp_tensor *b = cddp_model_buffer(m, i);
        bufs[i] = (cddp_st_tensor){.name = b->name,
                                   .dtype = CDDP_F32,
                                   .ndim = b->ndim,
                                   .data = cddp__host_buffer(&h, m, i)};
        memcpy(bufs[i].shape, b->shape, sizeof bufs[i].shape);
    }
    char w[16], total[32], seqs[32], steps[32], lr[32];
    snprintf(w, sizeof w, "%d", world);
    snprintf(total, sizeof total, "%zu", cddp_model_numel(m));
    snprintf(seqs, sizeof seqs, "%" PRId64, seq + 1);
    int k = 0;
    const char *pairs[] = {"cddp_format", "checkpoint-set-1",
                           "cddp_world",  w,
                           "cddp_numel",  total,
                           "cddp_seq",    seqs,
                           "cddp_params", json[0],
                           "cddp_ties",   json[1],
                           "cddp_states", json[2],
                           "cddp_shards", json[3],
                           "cddp_ranges", json[4]};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) meta[k++] = pairs[i];
    if (!strncmp(name, "step-", 5)) { /* the step the folder is named after */
        const char *digits = name + 5;
        while (digits[0] == '0' && digits[1]) digits++;
        meta[k++] = "cddp_step";
        meta[k++] = digits;
    }
    if (opt) k = cddp__optim_meta(opt, meta, k, steps, lr);
    for (int i = 0; i < nmeta; i++) meta[k++] = metadata[i];
    meta[k] = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/" CDDP_CKPT_MANIFEST, dir);
    rc = cddp_safetensors_write(path, bufs, nb, meta, err);
    if (rc == CDDP_OK) {
        remove_other_shards(dir, world);
        prune(root, sets, nsets, name, keep);
    }
out:
    cddp__host_model_free(&h);
    cddp_free(headers);
    for (int j = 0; j < 5; j++) cJSON_free(json[j]);
    cddp__ckpt_layout_free(&layout);
    cddp_free(sets);
    cddp_free(bufs);
    cddp_free(meta);
    return rc;
}
