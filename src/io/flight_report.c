/* flight_report.c: reading a folder of flight records (cddp/flight.h) and saying where each rank
 * stands, who is behind, and which rank called something else.
 *
 * Only the first group's collectives (the job's group: the first a process made) are compared
 * across ranks; a rank's place is its last collective there that started (waiting in it until it
 * ends) and its last step mark. The records' clocks are each host's monotonic clock; each
 * record says what its clock and the wall clock read when it was written, which puts the
 * timeline's events of every host on one time axis.
 */
#include "cddp/flight.h"
#include "io/internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct rank_view {
    cJSON *root;
    int world, pid; /* (its rank is its index) */
    const char *host, *why;
    double now, wall;
    cJSON *last;       /* its last collective of group 0, or NULL */
    cJSON *device;     /* its last collective on a device's memory (cddp/dcomm.h), or NULL */
    const char *phase; /* its last mark, or NULL */
    int64_t step;      /* the mark's step */
    double phase_t;    /* when the mark was made */
    int64_t seq;       /* the last collective's sequence number, -1: none */
    bool waiting;      /* the last collective started and has not ended */
} rank_view;

static const char *str_of(const cJSON *o, const char *k, const char *dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

static double num_of(const cJSON *o, const char *k, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* A collective's call in words: "allreduce(mean, f32, count 1024)". */
static void call_words(const cJSON *e, char *out, size_t n) {
    const char *op = str_of(e, "op", "?"), *red = str_of(e, "reduce", NULL);
    const char *dt = str_of(e, "dtype", NULL);
    size_t at = (size_t)snprintf(out, n, "%s(", op);
    if (red && at < n) at += (size_t)snprintf(out + at, n - at, "%s, ", red);
    if (dt && at < n)
        at += (size_t)snprintf(out + at, n - at, "%s, count %.0f", dt, num_of(e, "count", 0));
    if (cJSON_GetObjectItemCaseSensitive(e, "root") && at < n)
        at += (size_t)snprintf(out + at, n - at, ", root %.0f", num_of(e, "root", 0));
    if (at >= 2 && at < n && out[at - 2] == ',') at -= 2;
    if (at < n) snprintf(out + at, n - at, ")");
}

/* "allreduce #12 (bucket 3: a .. b)" */
static void call_named(const cJSON *e, char *out, size_t n) {
    const char *label = str_of(e, "label", NULL);
    snprintf(out, n, "%s #%.0f%s%s%s", str_of(e, "op", "?"), num_of(e, "seq", 0), label ? " (" : "",
             label ? label : "", label ? ")" : "");
}

/* The ranks listed as "0-2, 5" into out. */
static void rank_list(const int *r, int n, char *out, size_t cap) {
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < n && at < cap; i++) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
        at += (size_t)(j > i ? snprintf(out + at, cap - at, "%s%d-%d", i ? ", " : "", r[i], r[j])
                             : snprintf(out + at, cap - at, "%s%d", i ? ", " : "", r[i]));
        i = j;
    }
}

static void view_of(rank_view *v) {
    v->seq = -1;
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(v->root, "events"), *e;
    cJSON_ArrayForEach(e, events) {
        const char *type = str_of(e, "type", "");
        if (!strcmp(type, "mark")) {
            v->phase = str_of(e, "phase", "?");
            v->step = (int64_t)num_of(e, "step", 0);
            v->phase_t = num_of(e, "t", 0);
        } else if (!strcmp(type, "collective") && str_of(e, "device", NULL)) {
            v->device = (cJSON *)e;
        } else if (!strcmp(type, "collective") && num_of(e, "group", 0) == 0 &&
                   cJSON_GetObjectItemCaseSensitive(e, "seq") &&
                   strcmp(str_of(e, "op", ""), "alloc") != 0) {
            v->last = (cJSON *)e; /* the last that started: queued ones have no place yet */
        }
    }
    if (v->last) {
        const char *st = str_of(v->last, "state", "");
        /* One that failed waited in it until the group failed: it is at the frontier too. */
        v->waiting = !strcmp(st, "started") || !strcmp(st, "failed");
        v->seq = (int64_t)num_of(v->last, "seq", -1);
    }
}

/* Whether e is rank's collective of group 0 that met the others (started or ended). */
static bool compared(const cJSON *e) {
    const char *op = str_of(e, "op", "");
    return !strcmp(str_of(e, "type", ""), "collective") && num_of(e, "group", -1) == 0 &&
           cJSON_GetObjectItemCaseSensitive(e, "seq") && strcmp(op, "send") && strcmp(op, "recv");
}

/* The first sequence number at which ranks called different collectives: the minority's. */
static bool mismatch(rank_view *v, int world, FILE *out) {
    int64_t lo = INT64_MAX, hi = -1;
    for (int r = 0; r < world; r++) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(v[r].root, "events")) {
            if (!compared(e)) continue;
            int64_t s = (int64_t)num_of(e, "seq", 0);
            lo = s < lo ? s : lo;
            hi = s > hi ? s : hi;
        }
    }
    if (hi < lo) return false;
    size_t span = (size_t)(hi - lo + 1);
    const cJSON **at = calloc(span * (size_t)world, sizeof *at); /* [rank][seq - lo] */
    if (!at) return false;
    for (int r = 0; r < world; r++) {
        const cJSON *e;
        cJSON_ArrayForEach(e,
                           cJSON_GetObjectItemCaseSensitive(v[r].root, "events")) if (compared(e))
            at[(size_t)r * span + (size_t)((int64_t)num_of(e, "seq", 0) - lo)] = e;
    }
    bool found = false;
    for (size_t s = 0; s < span && !found; s++) {
        char words[8][160];
        int ranks_of[8][64], count[8] = {0}, kinds = 0;
        for (int r = 0; r < world; r++) {
            const cJSON *e = at[(size_t)r * span + s];
            if (!e) continue;
            char w[160];
            call_words(e, w, sizeof w);
            int k = 0;
            while (k < kinds && strcmp(words[k], w)) k++;
            if (k == kinds && kinds < 8) memcpy(words[kinds++], w, sizeof w);
            if (k < kinds && count[k] < 64) ranks_of[k][count[k]++] = r;
        }
        if (kinds < 2) continue;
        found = true;
        int most = 0;
        for (int k = 1; k < kinds; k++) most = count[k] > count[most] ? k : most;
        for (int k = 0; k < kinds; k++) {
            if (k == most) continue;
            char who[256], others[256];
            rank_list(ranks_of[k], count[k], who, sizeof who);
            rank_list(ranks_of[most], count[most], others, sizeof others);
            fprintf(out,
                    "  MISMATCH at collective #%" PRId64 ": rank%s %s called %s where rank%s %s "
                    "called %s\n",
                    lo + (int64_t)s, count[k] > 1 ? "s" : "", who, words[k],
                    count[most] > 1 ? "s" : "", others, words[most]);
        }
    }
    free(at);
    return found;
}

static void where(const rank_view *v, char *out, size_t n) {
    size_t at = 0;
    if (v->phase)
        at = (size_t)snprintf(out, n, "in step %" PRId64 "'s %s (for %.1f s)", v->step, v->phase,
                              v->now - v->phase_t);
    else
        at = (size_t)snprintf(out, n, "before its first step mark");
    if (at >= n) return;
    if (v->last) {
        char c[200];
        call_named(v->last, c, sizeof c);
        at += (size_t)snprintf(out + at, n - at, "; its last collective %s, %s", c,
                               str_of(v->last, "state", ""));
    } else {
        at += (size_t)snprintf(out + at, n - at, "; it made no collective");
    }
    if (v->device && at < n) { /* "started": handed to the device, not known done yet */
        char c[200];
        call_named(v->device, c, sizeof c);
        const char *st = str_of(v->device, "state", "");
        snprintf(out + at, n - at, "; on %s (%s) its last collective %s, %s",
                 str_of(v->device, "device", "?"), str_of(v->device, "transport", "?"), c,
                 !strcmp(st, "started") ? "issued (in flight or not yet known done)" : st);
    }
}

static void report(rank_view *v, int world, FILE *out) {
    int64_t top = -1;
    for (int r = 0; r < world; r++) top = v[r].seq > top ? v[r].seq : top;
    /* The ranks waiting at the frontier, by call. */
    int waiting[1024], nwait = 0;
    const cJSON *at_top = NULL;
    for (int r = 0; r < world && nwait < 1024; r++)
        if (v[r].root && v[r].waiting && v[r].seq == top) {
            waiting[nwait++] = r;
            if (!at_top) at_top = v[r].last;
        }
    bool any_mismatch = mismatch(v, world, out);
    if (any_mismatch) nwait = 0; /* they stopped there: no rank is behind the others */
    if (nwait > 0) {
        char who[512], c[200];
        rank_list(waiting, nwait, who, sizeof who);
        call_named(at_top, c, sizeof c);
        double longest = 0;
        for (int i = 0; i < nwait; i++) {
            const rank_view *w = &v[waiting[i]];
            double t = num_of(w->last, "started", num_of(w->last, "queued", w->now));
            double end = num_of(w->last, "ended", w->now);
            longest = end - t > longest ? end - t : longest;
        }
        fprintf(out, "  rank%s %s wait%s in %s, up to %.1f s\n", nwait > 1 ? "s" : "", who,
                nwait > 1 ? "" : "s", c, longest);
    }
    int behind = 0;
    for (int r = 0; r < world; r++) {
        const rank_view *x = &v[r];
        bool at_front = x->root && x->waiting && x->seq == top;
        if (at_front) continue;
        char w[700];
        if (!x->root) {
            fprintf(out,
                    "  rank %d left no record: it is stopped, killed, hung without answering "
                    "SIGUSR1, or never started%s\n",
                    r, nwait ? " (the ranks above wait for it)" : "");
            behind++;
            continue;
        }
        where(x, w, sizeof w);
        bool late = nwait > 0 && (x->seq < top || !x->waiting);
        fprintf(out, "  rank %d is %s%s\n", r, w, late ? "  <- BEHIND" : "");
        behind += late;
    }
    if (nwait > 0 && !behind && !any_mismatch)
        fprintf(out, "  every rank reached the same collective: none is behind\n");
}

static void timeline(rank_view *v, int world, const char *path, cddp_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) {
        cddp_error_set(err, CDDP_EIO, "cannot write %s", path);
        return;
    }
    fprintf(f, "[");
    bool first = true;
    for (int r = 0; r < world; r++) {
        if (!v[r].root) continue;
        double shift = v[r].wall - v[r].now; /* monotonic to wall-clock seconds */
        fprintf(f,
                "%s\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
                "{\"name\": \"rank %d\"}},\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": "
                "%d, \"tid\": 0, \"args\": {\"name\": \"training\"}},\n{\"name\": "
                "\"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": "
                "\"communication\"}}",
                first ? "" : ",", r, r, r, r);
        first = false;
        const cJSON *events = cJSON_GetObjectItemCaseSensitive(v[r].root, "events"), *e;
        const cJSON *mark = NULL;
        cJSON_ArrayForEach(e, events) {
            bool is_mark = !strcmp(str_of(e, "type", ""), "mark");
            if (is_mark || !e->next) { /* the previous mark ends here (the last at the dump) */
                if (mark) {
                    double t0 = num_of(mark, "t", 0);
                    double t1 = is_mark ? num_of(e, "t", t0) : v[r].now;
                    fprintf(f,
                            ",\n{\"name\": \"%s\", \"cat\": \"step\", \"ph\": \"X\", \"ts\": %.3f, "
                            "\"dur\": %.3f, \"pid\": %d, \"tid\": 0, \"args\": {\"step\": %.0f}}",
                            str_of(mark, "phase", "?"), (t0 + shift) * 1e6, (t1 - t0) * 1e6, r,
                            num_of(mark, "step", 0));
                }
                if (is_mark) mark = e;
            }
            if (is_mark) continue;
            double t0 = num_of(e, "started", num_of(e, "queued", 0));
            double t1 = num_of(e, "ended", v[r].now);
            fprintf(f,
                    ",\n{\"name\": \"%s #%.0f\", \"cat\": \"collective\", \"ph\": \"X\", "
                    "\"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": 1, \"args\": {\"call\": "
                    "\"%s\", \"state\": \"%s\", \"bytes\": %.0f}}",
                    str_of(e, "op", "?"), num_of(e, "seq", 0), (t0 + shift) * 1e6, (t1 - t0) * 1e6,
                    r, str_of(e, "label", ""), str_of(e, "state", ""), num_of(e, "bytes", 0));
        }
    }
    fprintf(f, "\n]\n");
    if (fclose(f) != 0) cddp_error_set(err, CDDP_EIO, "cannot write %s", path);
}

int cddp_flight_report(const char *dir, int world, FILE *out, const char *timeline_path,
                       cddp_error *err) {
    DIR *d = opendir(dir);
    if (!d) return cddp_error_set(err, CDDP_ENOENT, "cannot open %s: no flight records", dir);
    enum { MAX_RANKS = 4096 };
    rank_view *v = calloc(MAX_RANKS, sizeof *v);
    if (!v) {
        closedir(d);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    int found = 0, top_world = world;
    struct dirent *de;
    while ((de = readdir(d))) {
        int r = -1, used = 0;
        if (sscanf(de->d_name, "rank-%d.json%n", &r, &used) != 1 || de->d_name[used] || r < 0 ||
            r >= MAX_RANKS)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        cJSON *root = NULL;
        if (stat(path, &st) != 0 ||
            cddp__json_read(path, (size_t)st.st_size, &root, NULL) != CDDP_OK ||
            num_of(root, "cddp_flight", 0) != 1) {
            fprintf(out, "  %s is not a flight record (skipped)\n", path);
            cJSON_Delete(root);
            continue;
        }
        rank_view *x = &v[r];
        x->root = root;
        x->world = (int)num_of(root, "world", 0);
        x->pid = (int)num_of(root, "pid", 0);
        x->host = str_of(root, "host", "?");
        x->why = str_of(root, "why", "");
        x->now = num_of(root, "now", 0);
        x->wall = num_of(root, "wall", 0);
        view_of(x);
        if (x->world > top_world && world <= 0) top_world = x->world;
        if (r + 1 > top_world && world <= 0) top_world = r + 1;
        found++;
    }
    closedir(d);
    int rc = CDDP_OK;
    if (!found) {
        rc = cddp_error_set(err, CDDP_ENOENT, "%s holds no flight record (rank-N.json)", dir);
    } else {
        if (top_world > MAX_RANKS) top_world = MAX_RANKS;
        fprintf(out, "flight records in %s: %d of %d rank%s\n", dir, found, top_world,
                top_world > 1 ? "s" : "");
        for (int r = 0; r < top_world; r++)
            if (v[r].root)
                fprintf(out, "  rank %d (pid %d on %s) wrote it: %s\n", r, v[r].pid, v[r].host,
                        v[r].why);
        fprintf(out, "where each rank stands:\n");
        report(v, top_world, out);
        if (timeline_path) {
            timeline(v, top_world, timeline_path, err);
            if (err && err->code) rc = err->code;
        }
    }
    for (int r = 0; r < MAX_RANKS; r++) cJSON_Delete(v[r].root);
    free(v);
    return rc;
}
