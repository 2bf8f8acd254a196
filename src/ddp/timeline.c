/* timeline.c: DistributedDataParallel's step statistics and its Chrome-trace timeline.
 *
 * Every synchronised step measures the forward (from the model's forward event to the start of
 * backward), the backward's walk, each bucket's collective and the wait after the walk; overlap
 * is the share of communication that ran while backward still computed. CDDP_DDP_STATS=1 prints
 * them on rank 0 every CDDP_DDP_STATS_EVERY steps. CDDP_TIMELINE=FILE records every step's
 * events and, at destroy, each rank appends its own to one JSON array under a file lock, which
 * Perfetto opens as one trace with a row per rank and thread.
 */
#include "ddp/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define MAX_EVENTS ((size_t)1 << 20)

void cddp__ddp_record(cddp_ddp *d, const char *name, int b, int tid, double t0, double t1) {
    if (!d->timeline || d->nevents >= MAX_EVENTS) return;
    if (d->nevents == d->cap_events) {
        size_t cap = d->cap_events ? d->cap_events * 2 : 1024;
        event *e = cddp_realloc(d->events, cap * sizeof *e);
        if (!e) return; /* the timeline loses events rather than the step failing */
        d->events = e;
        d->cap_events = cap;
    }
    d->events[d->nevents++] = (event){name, b, tid, t0, t1};
}

void cddp__ddp_report_stats(cddp_ddp *d, double t_walk_end, double t_done, double t_backward0) {
    cddp_ddp_stats *s = &d->stats;
    s->steps = ++d->steps;
    s->forward_s = d->t_forward > 0 && d->t_forward < t_backward0 ? t_backward0 - d->t_forward : 0;
    s->backward_s = t_walk_end - t_backward0;
    s->wait_s = t_done - t_walk_end;
    s->comm_s = 0;
    for (int k = 0; k < d->nbuckets; k++) s->comm_s += d->buckets[k].t_end - d->buckets[k].t_start;
    s->overlap = s->comm_s > 0 && !d->inline_comm ? 1.0 - s->wait_s / s->comm_s : 0;
    if (s->overlap < 0) s->overlap = 0;
    s->buckets = d->nbuckets;
    s->bytes = d->alone ? 0
               : d->o.hook == CDDP_DDP_HOOK_POWERSGD
                   ? d->step_bytes
                   : cddp_model_numel(d->model) * (d->o.hook ? 2 : 4);
    d->step_bytes = 0;
    s->comm_inline = d->inline_comm;
    if (d->t_forward > 0 && d->t_forward < t_backward0)
        cddp__ddp_record(d, "forward", -1, 0, d->t_forward, t_backward0);
    cddp__ddp_record(d, "backward", -1, 0, t_backward0, t_walk_end);
    cddp__ddp_record(d, "wait for buckets", -1, 0, t_walk_end, t_done);
    d->t_forward = 0;
    if (d->print_stats && d->rank == 0 && d->steps % d->stats_every == 0)
        printf("[cddp ddp] step %" PRId64 ": forward %.2f ms, backward %.2f ms, allreduce %.2f ms "
               "in %d buckets (%.1f MB%s), waited %.2f ms after backward, overlap %.0f%%\n",
               s->steps, s->forward_s * 1e3, s->backward_s * 1e3, s->comm_s * 1e3, s->buckets,
               (double)s->bytes / 1e6, d->inline_comm ? ", inline in backward" : "",
               s->wait_s * 1e3, s->overlap * 100);
}

/* ---- statistics and timeline ------------------------------------------------------------- */

/* Appends this rank's events to the shared trace file, under a lock, keeping the file one valid
 * JSON array (rank 0 created it as "[\n]\n" when wrapping). */
void cddp__ddp_timeline_write(cddp_ddp *d) {
    int fd = open(d->timeline, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        cddp_log(CDDP_LOG_WARN, "ddp", "cannot write the timeline %s: %s", d->timeline,
                 strerror(errno));
        return;
    }
    flock(fd, LOCK_EX);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    off_t end = lseek(fd, 0, SEEK_END);
    if (f) {
        fprintf(f, "%s", end > 4 ? ",\n" : "");
        fprintf(f,
                "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
                "\"rank %d\"}},\n"
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": "
                "{\"name\": \"training\"}},\n"
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": "
                "{\"name\": \"communication\"}}",
                d->rank, d->rank, d->rank, d->rank);
        for (size_t i = 0; i < d->nevents; i++) {
            const event *e = &d->events[i];
            fprintf(f,
                    ",\n{\"name\": \"%s%s\", \"cat\": \"ddp\", \"ph\": \"X\", \"ts\": %.3f, "
                    "\"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                    e->name, e->bucket >= 0 ? " bucket" : "", e->t0 * 1e6, (e->t1 - e->t0) * 1e6,
                    d->rank, e->tid);
            if (e->bucket >= 0) fprintf(f, ", \"args\": {\"bucket\": %d}", e->bucket);
            fprintf(f, "}");
        }
        fprintf(f, "\n]\n");
        fclose(f);
    }
    if (text && pwrite(fd, text, len, end > 4 ? end - 3 : (end >= 2 ? 2 : 0)) != (ssize_t)len)
        cddp_log(CDDP_LOG_WARN, "ddp", "writing the timeline %s failed", d->timeline);
    free(text);
    flock(fd, LOCK_UN);
    close(fd);
}

int cddp__ddp_timeline_open(cddp_ddp *d, cddp_error *err) {
    const char *tl = cddp_knob_str(CDDP_KNOB_TIMELINE);
    if (!*tl || strcmp(tl, "off") == 0) return CDDP_OK;
    if (!(d->timeline = cddp_strdup(tl))) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    if (d->rank == 0) { /* before wrap's first collective, which no rank passes before rank 0 */
        FILE *f = fopen(tl, "w");
        if (!f || fputs("[\n]\n", f) < 0) cddp_log(CDDP_LOG_WARN, "ddp", "cannot write %s", tl);
        if (f) fclose(f);
    }
    return CDDP_OK;
}
