/* cpus.c: the CPUs of the ranks on a host. Each rank tells the others on its host which CPUs it
 * may run on (its affinity: a launcher's binding); from their sets it learns how many ranks share
 * its CPUs, and so how many cores it may count as its own: for its math threads (group.c), how
 * long a wait spins (group.c) and where DDP reduces its buckets (ddp/wrap.c).
 */
#include "comm/internal.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

int cddp__cpu_sharers(const cpu_set_t *sets, int n, int me) {
    if (CPU_COUNT(&sets[me]) == 0) return 0;
    int k = 0;
    for (int r = 0; r < n; r++) {
        cpu_set_t both;
        CPU_AND(&both, &sets[r], &sets[me]);
        k += CPU_COUNT(&both) > 0 || CPU_COUNT(&sets[r]) == 0;
    }
    return k;
}

void cddp__comm_set_cpus(cddp_comm *c, const cpu_set_t *sets, int n, int me) {
    c->own_cpus = CPU_COUNT(&sets[me]);
    c->cpu_sharers = cddp__cpu_sharers(sets, n, me);
}

int cddp_comm_local_cores(const cddp_comm *c) {
    if (c->own_cpus > 0 && c->cpu_sharers > 0) return c->own_cpus / c->cpu_sharers;
    return cddp_num_cores() / CDDP_MAX(c->local_world, 1);
}

void cddp__cpus_text(char *out) {
    cpu_set_t s;
    out[0] = '\0';
    if (sched_getaffinity(0, sizeof s, &s) != 0) return;
    const unsigned char *b = (const unsigned char *)&s;
    for (size_t i = 0; i < sizeof s; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

void cddp__cpus_parse(const char *t, cpu_set_t *s) {
    CPU_ZERO(s);
    unsigned char b[sizeof *s];
    if (strlen(t) != 2 * sizeof *s) return;
    for (size_t i = 0; i < sizeof *s; i++) {
        unsigned v;
        if (sscanf(t + 2 * i, "%2x", &v) != 1) return;
        b[i] = (unsigned char)v;
    }
    memcpy(s, b, sizeof b);
}
