/* ckpt_read.c: finding, opening, checking and reading checkpoint sets (format in
 * cddp/checkpoint.h).
 *
 * Opening reads the manifest alone (it says where each range of the flat block lies: which shard,
 * which byte offsets) and checks every shard's size; the data stays on disk until a range is
 * asked for, and then only the bytes of that range are read (pread), from whichever shards hold
 * it. That is what lets a set saved by N ranks load on M: each rank asks for the ranges it needs.
 * Nothing in a manifest is trusted: sizes, offsets, ranges and names are checked before any read.
 * The shards' own headers are read at commit (cddp__ckpt_index), which writes the ranges from
 * them, and the CRC-32s (cddp_ckpt_set_verify) tie every byte to the manifest.
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
#include <zlib.h>

struct cddp_ckpt_set {
    char dir[4096];
    cddp_safetensors *manifest;
    int world, nparams, nties, nstates;
    int64_t numel;
    cddp_st_tensor *params; /* names and shapes */
    int64_t *offsets;
    char **ties; /* second name, parameter, ... */
    char *states[CDDP__CKPT_MAX_STATES];
    cddp_ckpt_shard *shards;
    int64_t *header_crc; /* per shard, its header's CRC-32 (-1: a manifest from before) */
    cddp__ckpt_layout layout;
    int *fds; /* per shard, opened when first read */
};

/* ---- finding sets -------------------------------------------------------------------------- */

static bool exists(const char *path, bool dir) {
    struct stat st;
    return stat(path, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

/* "step-<digits>": the step, or -1. */
static int64_t set_step(const char *name) {
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    int64_t v = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*c - '0');
    }
    return v;
}

static int newest_first(const void *a, const void *b) {
    const cddp__ckpt_entry *x = a, *y = b;
    if (x->seq != y->seq) return x->seq > y->seq ? -1 : 1;
    return x->step > y->step ? -1 : x->step < y->step;
}

int cddp__ckpt_scan(const char *root, cddp__ckpt_entry **out) {
    *out = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t step = set_step(e->d_name);
        char path[4500];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (step < 0 || strlen(e->d_name) >= sizeof(*out)->name || !exists(path, true)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            cddp__ckpt_entry *grown = cddp_realloc(*out, sizeof **out * (size_t)cap);
            if (!grown) break;
            *out = grown;
        }
        cddp__ckpt_entry *s = &(*out)[n++];
        snprintf(s->name, sizeof s->name, "%s", e->d_name);
        s->step = step;
        s->seq = CDDP__CKPT_INCOMPLETE;
        snprintf(path, sizeof path, "%s/%s/" CDDP_CKPT_MANIFEST, root, e->d_name);
        if (!exists(path, false)) continue;
        uint64_t start, size;
        cddp_safetensors *f = cddp__safetensors_index(path, &start, &size, NULL);
        const char *v = f ? cddp_safetensors_meta(f, "cddp_seq") : NULL;
        int64_t seq;
        s->seq = v && cddp_parse_int("cddp_seq", v, 0, INT64_MAX, &seq, NULL) == CDDP_OK
                     ? seq
                     : CDDP__CKPT_UNREADABLE;
        cddp_safetensors_destroy(f);
    }
    closedir(d);
    if (n) qsort(*out, (size_t)n, sizeof **out, newest_first);
    return n;
}

/* ---- the shards' headers ------------------------------------------------------------------- */

static int by_begin(const void *a, const void *b) {
    const cddp__ckpt_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

void cddp__ckpt_layout_free(cddp__ckpt_layout *layout) {
    cddp_free(layout->ranges);
    layout->ranges = NULL;
    layout->n = 0;
}

/* A 1-D float32 tensor of len elements named name in f, or NULL. */
static const cddp_st_tensor *flat(const cddp_safetensors *f, const char *name, int64_t len) {
    const cddp_st_tensor *t = cddp_safetensors_find(f, name);
    return t && t->dtype == CDDP_F32 && t->ndim == 1 && t->shape[0] == len ? t : NULL;
}

static int index_shard(const char *dir, int r, int world, const cddp_ckpt_shard *expect,
                       int nstates, const char *const *states, cddp__ckpt_layout *l, int *cap,
                       cddp_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", dir, r, world);
    struct stat fs;
    if (stat(path, &fs) != 0)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: %s (the set is damaged; when the ranks run on several hosts, "
                              "the set's folder must be on a file system they all share)",
                              path, strerror(errno));
    if (expect && (uint64_t)fs.st_size != (uint64_t)expect->bytes)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s is %" PRIu64 " bytes but the set's manifest says %" PRId64
                              " (the set is damaged)",
                              path, (uint64_t)fs.st_size, expect->bytes);
    uint64_t start, size;
    cddp_safetensors *f = cddp__safetensors_index(path, &start, &size, err);
    if (!f) return err ? err->code : CDDP_EFORMAT;
    const char *crc_text = cddp_safetensors_meta(f, "crc32");
    cJSON *crcs = crc_text ? cJSON_Parse(crc_text) : NULL;
    int rc = CDDP_OK;
    if (crc_text && !cJSON_IsObject(crcs)) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: its crc32 metadata is not a JSON object", path);
        goto out;
    }
    for (int i = 0; i < cddp_safetensors_count(f); i++) {
        const cddp_st_tensor *t = cddp_safetensors_at(f, i);
        if (strncmp(t->name, "flat.", 5) != 0) continue;
        int64_t begin;
        if (cddp_parse_int(path, t->name + 5, 0, INT64_MAX, &begin, NULL) != CDDP_OK ||
            !flat(f, t->name, t->ndim == 1 ? t->shape[0] : -1) || t->shape[0] < 1 ||
            t->shape[0] > INT64_MAX - begin) {
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s: '%s' is not a range of the flat block (a 1-D float32 "
                                "tensor named flat.<first element>)",
                                path, t->name);
            goto out;
        }
        if (l->n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            cddp__ckpt_range *grown = cddp_realloc(l->ranges, sizeof *grown * (size_t)*cap);
            if (!grown) {
                rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            l->ranges = grown;
        }
        cddp__ckpt_range *g = &l->ranges[l->n++];
        *g = (cddp__ckpt_range){.begin = begin, .end = begin + t->shape[0], .shard = r};
        g->at[0] = start + cddp__st_offset(t);
        g->has_crc = crcs != NULL;
        for (int s = -1; s < nstates; s++) {
            char name[200];
            const cddp_st_tensor *st = t;
            if (s >= 0) {
                snprintf(name, sizeof name, "optim.%.64s.%s", states[s], t->name);
                if (!(st = flat(f, name, t->shape[0]))) {
                    rc = cddp_error_set(err, CDDP_EFORMAT,
                                        "%s: '%s' is missing (the optimizer's %s of that range)",
                                        path, name, states[s]);
                    goto out;
                }
                g->at[1 + s] = start + cddp__st_offset(st);
            }
            const cJSON *c = crcs ? cJSON_GetObjectItemCaseSensitive(crcs, st->name) : NULL;
            if (crcs && (!cJSON_IsNumber(c) || c->valuedouble < 0 || c->valuedouble > UINT32_MAX)) {
                rc = cddp_error_set(err, CDDP_EFORMAT, "%s: no CRC-32 of '%s' in its header", path,
                                    st->name);
                goto out;
            }
            if (c) g->crc[1 + s] = (uint32_t)c->valuedouble;
        }
    }
out:
    cJSON_Delete(crcs);
    cddp_safetensors_destroy(f);
    return rc;
}

static int check_cover(const char *dir, cddp__ckpt_layout *l, int64_t numel, cddp_error *err);

int cddp__ckpt_index(const char *dir, int world, const cddp_ckpt_shard *shards, int nstates,
                     const char *const *states, int64_t numel, cddp__ckpt_layout *l,
                     cddp_error *err) {
    *l = (cddp__ckpt_layout){0};
    if (nstates > CDDP__CKPT_MAX_STATES)
        return cddp_error_set(err, CDDP_EUNSUPPORTED, "%s: %d optimizer states (at most %d)", dir,
                              nstates, CDDP__CKPT_MAX_STATES);
    int cap = 0, rc = CDDP_OK;
    for (int r = 0; r < world && rc == CDDP_OK; r++)
        rc = index_shard(dir, r, world, shards ? &shards[r] : NULL, nstates, states, l, &cap, err);
    if (rc == CDDP_OK) rc = check_cover(dir, l, numel, err);
    if (rc != CDDP_OK) cddp__ckpt_layout_free(l);
    return rc;
}

/* Sorts the ranges, and checks that they cover [0, numel) once. */
static int check_cover(const char *dir, cddp__ckpt_layout *l, int64_t numel, cddp_error *err) {
    int rc = CDDP_OK;
    if (l->n) qsort(l->ranges, (size_t)l->n, sizeof *l->ranges, by_begin);
    int64_t at = 0;
    for (int i = 0; rc == CDDP_OK && i < l->n; i++) {
        const cddp__ckpt_range *g = &l->ranges[i];
        if (g->begin != at || g->end > numel)
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s: the shards' ranges do not cover the %" PRId64
                                " elements once: element %" PRId64 " %s",
                                dir, numel, g->begin < at ? g->begin : at,
                                g->begin < at ? "is in two shards" : "is in none");
        at = g->end;
    }
    if (rc == CDDP_OK && at != numel)
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: the shards hold %" PRId64 " of the %" PRId64 " elements", dir, at,
                            numel);
    return rc;
}

/* ---- opening ------------------------------------------------------------------------------- */

void cddp_ckpt_set_close(cddp_ckpt_set *s) {
    if (!s) return;
    for (int r = 0; s->fds && r < s->world; r++)
        if (s->fds[r] >= 0) close(s->fds[r]);
    for (int i = 0; s->params && i < s->nparams; i++) cddp_free((char *)s->params[i].name);
    for (int i = 0; s->ties && i < 2 * s->nties; i++) cddp_free(s->ties[i]);
    for (int i = 0; i < s->nstates; i++) cddp_free(s->states[i]);
    cddp_free(s->params);
    cddp_free(s->offsets);
    cddp_free(s->ties);
    cddp_free(s->shards);
    cddp_free(s->header_crc);
    cddp_free(s->fds);
    cddp__ckpt_layout_free(&s->layout);
    cddp_safetensors_destroy(s->manifest);
    cddp_free(s);
}

/* A JSON number that is an integer in [lo, hi], or -1. */
static int64_t json_int(const cJSON *v, int64_t lo, int64_t hi) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d) return -1;
    return (int64_t)d;
}

/* The manifest's JSON lists, checked. */
static int parse_lists(cddp_ckpt_set *s, cJSON *params, cJSON *ties, cJSON *states, cJSON *shards,
                       cJSON *ranges) {
    if (!cJSON_IsArray(params) || !cJSON_IsArray(ties) || !cJSON_IsArray(states) ||
        !cJSON_IsArray(shards) || cJSON_GetArraySize(shards) != s->world ||
        cJSON_GetArraySize(states) > CDDP__CKPT_MAX_STATES || !cJSON_IsArray(ranges))
        return -1;
    s->nparams = cJSON_GetArraySize(params);
    s->nties = cJSON_GetArraySize(ties);
    s->params = cddp_calloc((size_t)s->nparams + 1, sizeof *s->params);
    s->offsets = cddp_calloc((size_t)s->nparams + 1, sizeof *s->offsets);
    s->ties = cddp_calloc(2 * (size_t)s->nties + 1, sizeof *s->ties);
    s->shards = cddp_calloc((size_t)s->world, sizeof *s->shards);
    if (!s->params || !s->offsets || !s->ties || !s->shards) return -1;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, params) {
        const cJSON *name = cJSON_GetArrayItem(e, 0), *shape = cJSON_GetArrayItem(e, 2);
        int64_t off = json_int(cJSON_GetArrayItem(e, 1), 0, s->numel), n = 1;
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 3 || !cJSON_IsString(name) || off < 0 ||
            !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > CDDP_MAX_DIMS)
            return -1;
        cddp_st_tensor *t = &s->params[i];
        t->dtype = CDDP_F32;
        t->ndim = cJSON_GetArraySize(shape);
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = json_int(cJSON_GetArrayItem(shape, d), 0, s->numel);
            if (t->shape[d] < 0) return -1;
            n = t->shape[d] ? (n > s->numel / t->shape[d] ? s->numel + 1 : n * t->shape[d]) : 0;
        }
        if (n > s->numel - off || !(t->name = cddp_strdup(name->valuestring))) return -1;
        s->offsets[i++] = off;
    }
    i = 0;
    cJSON_ArrayForEach(e, ties) {
        const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsString(a) || !cJSON_IsString(b) ||
            !(s->ties[i++] = cddp_strdup(a->valuestring)) ||
            !(s->ties[i++] = cddp_strdup(b->valuestring)))
            return -1;
    }
    cJSON_ArrayForEach(e, states) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '.') ||
            !(s->states[s->nstates++] = cddp_strdup(e->valuestring)))
            return -1;
    }
    if (!(s->header_crc = cddp_calloc((size_t)s->world, sizeof *s->header_crc))) return -1;
    i = 0;
    cJSON_ArrayForEach(e, shards) { /* [bytes, crc32] or, since headers are bound, [.., header's] */
        int n = cJSON_GetArraySize(e);
        int64_t bytes = json_int(cJSON_GetArrayItem(e, 0), 0, INT64_MAX / 2),
                crc = json_int(cJSON_GetArrayItem(e, 1), 0, UINT32_MAX),
                head = n == 3 ? json_int(cJSON_GetArrayItem(e, 2), 0, UINT32_MAX) : -1;
        if (bytes < 0 || crc < 0 || (n != 2 && n != 3) || (n == 3 && head < 0)) return -1;
        s->header_crc[i] = head;
        s->shards[i++] = (cddp_ckpt_shard){.bytes = bytes, .crc32 = (uint32_t)crc};
    }
    /* The ranges: [shard, begin, end, offsets], every byte inside its shard's file. */
    s->layout.n = cJSON_GetArraySize(ranges);
    if (!(s->layout.ranges = cddp_calloc((size_t)s->layout.n + 1, sizeof *s->layout.ranges)))
        return -1;
    i = 0;
    cJSON_ArrayForEach(e, ranges) {
        cddp__ckpt_range *g = &s->layout.ranges[i++];
        int64_t shard = json_int(cJSON_GetArrayItem(e, 0), 0, s->world - 1);
        g->begin = json_int(cJSON_GetArrayItem(e, 1), 0, s->numel);
        g->end = json_int(cJSON_GetArrayItem(e, 2), 0, s->numel);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 4 + s->nstates || shard < 0 ||
            g->begin < 0 || g->end <= g->begin)
            return -1;
        g->shard = (int)shard;
        int64_t bytes = s->shards[shard].bytes, len = 4 * (g->end - g->begin);
        for (int k = 0; k <= s->nstates; k++) {
            int64_t at = json_int(cJSON_GetArrayItem(e, 3 + k), 8, bytes);
            if (at < 8 || len > bytes - at) return -1;
            g->at[k] = (uint64_t)at;
        }
    }
    return 0;
}

/* Opens the set in folder dir (no search). */
static cddp_ckpt_set *open_set(const char *dir, cddp_error *err) {
    cddp_ckpt_set *s = cddp_calloc(1, sizeof *s);
    if (!s) {
        cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
        return NULL;
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/" CDDP_CKPT_MANIFEST, dir);
    if (!exists(path, false)) {
        cddp_error_set(err, CDDP_ENOENT,
                       "%s has no " CDDP_CKPT_MANIFEST ": an incomplete checkpoint set (its save "
                       "did not finish), or not a set",
                       dir);
        goto fail;
    }
    if (!(s->manifest = cddp_safetensors_read(path, err))) goto fail;
    const char *format = cddp_safetensors_meta(s->manifest, "cddp_format");
    const char *w = cddp_safetensors_meta(s->manifest, "cddp_world");
    const char *n = cddp_safetensors_meta(s->manifest, "cddp_numel");
    int64_t world = 0;
    if (!format || strcmp(format, "checkpoint-set-1") != 0 || !w || !n ||
        cddp_parse_int(path, w, 1, 1 << 20, &world, NULL) != CDDP_OK ||
        cddp_parse_int(path, n, 0, INT64_MAX / 16, &s->numel, NULL) != CDDP_OK) {
        cddp_error_set(err, CDDP_EFORMAT,
                       "%s is not a cddp set manifest (cddp_format checkpoint-set-1 with "
                       "cddp_world and cddp_numel)",
                       path);
        goto fail;
    }
    s->world = (int)world;
    const char *keys[] = {"cddp_params", "cddp_ties", "cddp_states", "cddp_shards", "cddp_ranges"};
    cJSON *lists[5] = {0};
    for (int k = 0; k < 5; k++) {
        const char *v = cddp_safetensors_meta(s->manifest, keys[k]);
        lists[k] = v ? cJSON_Parse(v) : NULL;
    }
    int bad = parse_lists(s, lists[0], lists[1], lists[2], lists[3], lists[4]);
    for (int k = 0; k < 5; k++) cJSON_Delete(lists[k]);
    if (bad) {
        cddp_error_set(err, CDDP_EFORMAT,
                       "%s: cddp_params, cddp_ties, cddp_states, cddp_shards or cddp_ranges is "
                       "missing or malformed",
                       path);
        goto fail;
    }
    if (check_cover(dir, &s->layout, s->numel, err) != CDDP_OK) goto fail;
    /* Every shard there with its size (its data is read only when asked for). */
    for (int r = 0; r < s->world; r++) {
        struct stat fs;
        snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", dir, r, s->world);
        if (stat(path, &fs) != 0) {
            cddp_error_set(err, CDDP_EFORMAT, "%s: %s (the set is damaged)", path, strerror(errno));
            goto fail;
        }
        if ((int64_t)fs.st_size != s->shards[r].bytes) {
            cddp_error_set(err, CDDP_EFORMAT,
                           "%s is %" PRId64 " bytes but the set's manifest says %" PRId64
                           " (the set is damaged)",
                           path, (int64_t)fs.st_size, s->shards[r].bytes);
            goto fail;
        }
    }
    if (!(s->fds = cddp_malloc(sizeof *s->fds * (size_t)s->world))) {
        cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", dir);
        goto fail;
    }
    for (int r = 0; r < s->world; r++) s->fds[r] = -1;
    return s;
fail:
    cddp_ckpt_set_close(s);
    return NULL;
}

/* The first complete set of root's sets[from..n) (newest commit first) into out: 1, or 0 when
 * none is (*incomplete and *damaged counting the others, why the first damage), or a status. */
static int first_complete(const char *root, const cddp__ckpt_entry *sets, int n, int from,
                          char *out, size_t cap, int *incomplete, int *damaged, char why[600],
                          cddp_error *err) {
    for (int i = from; i < n; i++) {
        char dir[4500];
        snprintf(dir, sizeof dir, "%s/%s", root, sets[i].name);
        if (sets[i].seq < 0) {
            (*incomplete)++;
            continue;
        }
        cddp_error e = {0};
        cddp_ckpt_set *s = open_set(dir, &e);
        if (!s) {
            cddp_log(CDDP_LOG_WARN, "io", "skipping the set %s: %s", dir, e.msg);
            if (!(*damaged)++) snprintf(why, 600, "%s", e.msg);
            continue;
        }
        cddp_ckpt_set_close(s);
        if ((size_t)snprintf(out, cap, "%s", dir) >= cap)
            return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", dir);
        return 1;
    }
    return 0;
}

int cddp_checkpoint_resolve_before(const char *set, char *out, size_t cap, cddp_error *err) {
    char root[4096], why[600] = "";
    const char *slash = strrchr(set, '/');
    snprintf(root, sizeof root, "%.*s", slash ? (int)(slash - set) : 1, slash ? set : ".");
    cddp__ckpt_entry *sets = NULL;
    int n = cddp__ckpt_scan(root, &sets), i = 0, incomplete = 0, damaged = 0;
    while (i < n && strcmp(sets[i].name, slash ? slash + 1 : set) != 0) i++;
    int found = first_complete(root, sets, n, i + 1, out, cap, &incomplete, &damaged, why, err);
    cddp_free(sets);
    if (found) return found > 0 ? CDDP_OK : found;
    return cddp_error_set(err, CDDP_ENOENT, "%s holds no complete set committed before %s", root,
                          slash ? slash + 1 : set);
}

int cddp_checkpoint_resolve(const char *path, char *out, size_t cap, cddp_error *err) {
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/" CDDP_CKPT_MANIFEST, path);
    if (!exists(path, true) || exists(manifest, false)) {
        if ((size_t)snprintf(out, cap, "%s", path) >= cap)
            return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", path);
        return CDDP_OK;
    }
    cddp__ckpt_entry *sets = NULL;
    int n = cddp__ckpt_scan(path, &sets), incomplete = 0, damaged = 0;
    char why[600] = "";
    int found = first_complete(path, sets, n, 0, out, cap, &incomplete, &damaged, why, err);
    cddp_free(sets);
    if (found) return found > 0 ? CDDP_OK : found;
    const char *base = strrchr(path, '/');
    if (n == 0) { /* a run's output folder: its folder of sets, else its one file */
        char inner[4500];
        snprintf(inner, sizeof inner, "%s/checkpoints", path);
        if (exists(inner, true)) return cddp_checkpoint_resolve(inner, out, cap, err);
        snprintf(inner, sizeof inner, "%s/checkpoint.safetensors", path);
        if (exists(inner, false)) {
            if ((size_t)snprintf(out, cap, "%s", inner) >= cap)
                return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", inner);
            return CDDP_OK;
        }
    }
    if (n == 0 && set_step(base ? base + 1 : path) >= 0)
        return cddp_error_set(err, CDDP_ENOENT,
                              "%s has no " CDDP_CKPT_MANIFEST ": an incomplete checkpoint set (its "
                              "save did not finish); its folder's other sets may be complete",
                              path);
    if (damaged)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s holds no complete checkpoint set: %d damaged (the newest: %s), "
                              "%d without a manifest",
                              path, damaged, why, incomplete);
    return cddp_error_set(err, CDDP_ENOENT,
                          "%s holds no complete checkpoint set (%d set folder%s without a "
                          "manifest: saves that did not finish)",
                          path, incomplete, incomplete == 1 ? "" : "s");
}

cddp_ckpt_set *cddp_ckpt_set_open(const char *path, cddp_error *err) {
    char dir[4096];
    if (cddp_checkpoint_resolve(path, dir, sizeof dir, err) != CDDP_OK) return NULL;
    if (!exists(dir, true)) {
        cddp_error_set(err, exists(dir, false) ? CDDP_EINVAL : CDDP_ENOENT,
                       "%s is not a checkpoint set (a folder)", dir);
        return NULL;
    }
    return open_set(dir, err);
}

cddp_safetensors *cddp_checkpoint_metadata(const char *path, cddp_error *err) {
    char at[4096], manifest[4200];
    if (cddp_checkpoint_resolve(path, at, sizeof at, err) != CDDP_OK) return NULL;
    if (!exists(at, true)) { /* a file: its header, not its data */
        uint64_t start, size;
        cddp_safetensors *f = cddp__safetensors_index(at, &start, &size, err);
        if (f) cddp__safetensors_forget_data(f);
        return f;
    }
    snprintf(manifest, sizeof manifest, "%s/" CDDP_CKPT_MANIFEST, at);
    return cddp_safetensors_read(manifest, err);
}

cddp_safetensors *cddp__ckpt_set_take_manifest(cddp_ckpt_set *s) {
    cddp_safetensors *m = s->manifest;
    s->manifest = NULL;
    return m;
}

const char *cddp_ckpt_set_dir(const cddp_ckpt_set *s) {
    return s->dir;
}
const cddp_safetensors *cddp_ckpt_set_manifest(const cddp_ckpt_set *s) {
    return s->manifest;
}
int cddp_ckpt_set_world(const cddp_ckpt_set *s) {
    return s->world;
}
int64_t cddp_ckpt_set_numel(const cddp_ckpt_set *s) {
    return s->numel;
}
int cddp_ckpt_set_num_params(const cddp_ckpt_set *s) {
    return s->nparams;
}
const cddp_st_tensor *cddp_ckpt_set_param(const cddp_ckpt_set *s, int i, int64_t *offset) {
    CDDP_CHECK(i >= 0 && i < s->nparams, "parameter %d of %d", i, s->nparams);
    if (offset) *offset = s->offsets[i];
    return &s->params[i];
}
int cddp_ckpt_set_num_ties(const cddp_ckpt_set *s) {
    return s->nties;
}
const char *cddp_ckpt_set_tie(const cddp_ckpt_set *s, int i, const char **param) {
    CDDP_CHECK(i >= 0 && i < s->nties, "tie %d of %d", i, s->nties);
    if (param) *param = s->ties[2 * i + 1];
    return s->ties[2 * i];
}
int cddp_ckpt_set_num_states(const cddp_ckpt_set *s) {
    return s->nstates;
}
const char *cddp_ckpt_set_state(const cddp_ckpt_set *s, int i) {
    CDDP_CHECK(i >= 0 && i < s->nstates, "state %d of %d", i, s->nstates);
    return s->states[i];
}

/* ---- reading ------------------------------------------------------------------------------- */

/* The manifest's ranges of shard r against the shard's own header: the same ranges at the same
 * offsets, or the set is refused (a manifest that points elsewhere would read wrong numbers). */
static int check_shard(cddp_ckpt_set *s, int r, const char *path, cddp_error *err) {
    cddp__ckpt_layout own = {0};
    int cap = 0, mine = 0,
        rc = index_shard(s->dir, r, s->world, &s->shards[r], s->nstates,
                         (const char *const *)s->states, &own, &cap, err);
    uint32_t head = 0;
    if (rc == CDDP_OK && s->header_crc[r] >= 0 &&
        (rc = cddp__shard_header_crc(path, &head, err)) == CDDP_OK && head != s->header_crc[r])
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s is not the shard this set's manifest recorded (its header's "
                            "CRC-32 is %08x, the manifest's %08x): a shard from another save?",
                            path, (unsigned)head, (unsigned)s->header_crc[r]);
    for (int i = 0; rc == CDDP_OK && i < s->layout.n; i++) {
        cddp__ckpt_range *g = &s->layout.ranges[i];
        if (g->shard != r) continue;
        int j = 0;
        while (j < own.n && (own.ranges[j].begin != g->begin || own.ranges[j].end != g->end ||
                             memcmp(own.ranges[j].at, g->at, sizeof g->at) != 0))
            j++;
        mine += j < own.n ? 1 : own.n + 1; /* a range the header lacks: never equal */
        if (j < own.n) { /* the header's CRC-32s of the range, checked as it is read */
            memcpy(g->crc, own.ranges[j].crc, sizeof g->crc);
            g->has_crc = own.ranges[j].has_crc;
        }
    }
    if (rc == CDDP_OK && mine != own.n)
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: its header and the set's manifest disagree on where the ranges "
                            "lie (the set is damaged)",
                            path);
    cddp__ckpt_layout_free(&own);
    return rc;
}

static int shard_fd(cddp_ckpt_set *s, int r, char *path, size_t cap, cddp_error *err) {
    snprintf(path, cap, "%s/shard-%05d-of-%05d.safetensors", s->dir, r, s->world);
    if (s->fds[r] >= 0) return CDDP_OK;
    CDDP_TRY(check_shard(s, r, path, err));
    if ((s->fds[r] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return cddp_error_set(err, CDDP_EIO, "cannot open %s: %s", path, strerror(errno));
    return CDDP_OK;
}

/* Elements [a, b) of range g's tensor `which` into dst, the whole range read and its CRC-32
 * checked (a part of it needs the rest read too: at most two ranges per call, at its ends). */
static int read_checked(cddp_ckpt_set *s, const cddp__ckpt_range *g, int which, const char *path,
                        int64_t a, int64_t b, float *dst, cddp_error *err) {
    int64_t n = g->end - g->begin;
    bool whole = a == g->begin && b == g->end;
    float *buf = whole ? dst : cddp_malloc((size_t)n * sizeof(float));
    if (!buf) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    char what[160];
    snprintf(what, sizeof what, "elements %" PRId64 "..%" PRId64 " of the %s", g->begin, g->end - 1,
             which ? s->states[which - 1] : "parameters");
    int rc = cddp__pread_crc(s->fds[g->shard], buf, (size_t)n * sizeof(float), g->at[which],
                             g->crc[which], path, what, err);
    if (rc == CDDP_OK && !whole) memcpy(dst, buf + (a - g->begin), (size_t)(b - a) * sizeof(float));
    if (!whole) cddp_free(buf);
    return rc;
}

int cddp_ckpt_set_read(cddp_ckpt_set *s, const char *state, int64_t begin, int64_t end, float *dst,
                       cddp_error *err) {
    int which = 0;
    if (state) {
        while (which < s->nstates && strcmp(s->states[which], state) != 0) which++;
        if (which == s->nstates)
            return cddp_error_set(err, CDDP_ENOENT, "%s holds no optimizer state '%s'", s->dir,
                                  state);
        which++;
    }
    if (begin < 0 || end < begin || end > s->numel)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s: elements [%" PRId64 ", %" PRId64 ") of %" PRId64, s->dir, begin,
                              end, s->numel);
    int lo = 0, hi = s->layout.n; /* the first range that ends after begin */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->layout.ranges[mid].end <= begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int i = lo; i < s->layout.n && s->layout.ranges[i].begin < end; i++) {
        const cddp__ckpt_range *g = &s->layout.ranges[i];
        int64_t a = CDDP_MAX(begin, g->begin), b = CDDP_MIN(end, g->end);
        char path[4200];
        CDDP_TRY(shard_fd(s, g->shard, path, sizeof path, err));
        CDDP_TRY(g->has_crc /* a set from before shards held CRC-32s: what is needed alone */
                     ? read_checked(s, g, which, path, a, b, dst + (a - begin), err)
                     : cddp__pread_all(
                           s->fds[g->shard], dst + (a - begin), (size_t)(b - a) * sizeof(float),
                           g->at[which] + (uint64_t)(a - g->begin) * sizeof(float), path, err));
    }
    return CDDP_OK;
}

int cddp_ckpt_set_verify(cddp_ckpt_set *s, cddp_error *err) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = cddp_malloc(CHUNK);
    if (!buf) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = CDDP_OK;
    for (int r = 0; r < s->world && rc == CDDP_OK; r++) {
        char path[4200];
        if ((rc = shard_fd(s, r, path, sizeof path, err)) != CDDP_OK) break;
        uLong crc = crc32(0L, Z_NULL, 0);
        int64_t total = 0;
        for (ssize_t k; (k = pread(s->fds[r], buf, CHUNK, (off_t)total)) != 0; total += k) {
            if (k < 0) {
                rc = cddp_error_set(err, CDDP_EIO, "reading %s: %s", path, strerror(errno));
                break;
            }
            crc = crc32(crc, buf, (uInt)k);
        }
        if (rc == CDDP_OK && (total != s->shards[r].bytes || (uint32_t)crc != s->shards[r].crc32))
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s: %" PRId64 " bytes with CRC-32 %08x, but the manifest says "
                                "%" PRId64 " bytes with %08x (the file changed after the save)",
                                path, total, (unsigned)crc, s->shards[r].bytes,
                                (unsigned)s->shards[r].crc32);
    }
    cddp_free(buf);
    return rc;
}
