/* placement.c: where each rank's device is, gathered across a group: what AUTO's choice of a
 * transport (dcomm.c) and NCCL's one-rank-per-GPU check (nccl.c) read. */
#include "dcomm/internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int64_t hash_of(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return (int64_t)h;
}

void cddp__placement_where(cddp_device *dev, char *out, size_t n) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    snprintf(out, n, "%s %s", name, cddp_device_bus_id(dev));
}

int cddp__placement_gather(cddp_comm *group, cddp_device *dev, const int64_t *offers,
                           cddp__placement *all, cddp_error *err) {
    char where[320];
    cddp__placement_where(dev, where, sizeof where);
    cddp__placement mine = {.kind = cddp_device_kind_of(dev),
                            .card = hash_of(where),
                            .host = cddp_device_host_accessible(dev)};
    snprintf(mine.device, sizeof mine.device, "%s", cddp_device_name(dev));
    if (offers) memcpy(mine.offer, offers, sizeof mine.offer);
    _Static_assert(sizeof mine % 8 == 0, "a placement travels as int64s");
    return cddp_comm_allgather(group, &mine, all, (int64_t)(sizeof mine / 8), CDDP_COMM_I64, -1,
                               err);
}

bool cddp__placement_shared(const cddp__placement *all, int world, int *a, int *b) {
    for (int i = 0; i < world; i++)
        for (int j = i + 1; j < world; j++)
            if (all[i].card == all[j].card) {
                *a = i, *b = j;
                return true;
            }
    return false;
}
