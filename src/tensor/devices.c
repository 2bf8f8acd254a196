/* devices.c: the list of device kinds, and finding a device by its name.
 *
 * Adding a kind of device is its folder (src/tensor/<kind>/: memory, queue and kernels) and one
 * line in `kinds` below. */
#include "tensor/device.h"

#include <stdio.h>
#include <string.h>

#ifndef CDDP_HAVE_CUDA
/* A build without the toolkit still knows the name, to say why there is no GPU. */
static int no_cuda(cddp_error *err) {
    return cddp_error_set(err, CDDP_EUNSUPPORTED,
                          "no CUDA device: this cddp was built without the CUDA toolkit (no nvcc "
                          "when it was configured); install the toolkit and build again");
}

static cddp_device *never(int index, cddp_error *err) {
    (void)index;
    no_cuda(err);
    return NULL;
}

static const cddp__device_kind_ops cddp__cuda_kind = {"cuda", CDDP_DEVICE_CUDA, no_cuda, never};
#endif

static const cddp__device_kind_ops *const kinds[] = {
    &cddp__cpu_kind,
    &cddp__emu_kind,
    &cddp__cuda_kind,
};

cddp_device *cddp_device_cpu(void) {
    cddp_device *d = cddp__cpu_kind.open(0, NULL);
    CDDP_CHECK(d, "the CPU device could not be made");
    return d;
}

static const cddp__device_kind_ops *kind_named(const char *name, size_t len) {
    for (size_t i = 0; i < CDDP_ARRAY_LEN(kinds); i++)
        if (strlen(kinds[i]->name) == len && !strncmp(kinds[i]->name, name, len)) return kinds[i];
    return NULL;
}

static void list_kinds(char *buf, size_t n) {
    buf[0] = '\0';
    for (size_t i = 0; i < CDDP_ARRAY_LEN(kinds); i++) {
        size_t at = strlen(buf);
        snprintf(buf + at, n - at, "%s%s", i ? ", " : "", kinds[i]->name);
    }
}

cddp_device *cddp_device_get(const char *spec, cddp_error *err) {
    const char *colon = spec ? strchr(spec, ':') : NULL;
    size_t len = spec ? (colon ? (size_t)(colon - spec) : strlen(spec)) : 0;
    const cddp__device_kind_ops *k = spec ? kind_named(spec, len) : NULL;
    char names[128];
    list_kinds(names, sizeof names);
    if (!k) {
        cddp_error_set(err, CDDP_EINVAL,
                       "'%s' is not a device (the devices: %s, with :N for the "
                       "N-th of a kind)",
                       spec ? spec : "(null)", names);
        return NULL;
    }
    int64_t index = 0;
    if (colon && cddp_parse_int("the device index in", colon + 1, 0, 1 << 20, &index, err))
        return NULL;
    int n = k->count(err);
    if (n < 0) return NULL;
    if (index >= n) {
        cddp_error_set(err, CDDP_ERANGE, "%s: this machine has %d %s device%s (indices 0..%d)",
                       spec, n, k->name, n == 1 ? "" : "s", n - 1);
        return NULL;
    }
    return k->open((int)index, err);
}

int cddp_device_count(cddp_device_kind kind) {
    for (size_t i = 0; i < CDDP_ARRAY_LEN(kinds); i++)
        if (kinds[i]->kind == kind) {
            cddp_error err = {0};
            int n = kinds[i]->count(&err);
            return n > 0 ? n : 0;
        }
    return 0;
}

cddp_device *cddp_device_for_rank(const char *spec, cddp_error *err) {
    const cddp__device_kind_ops *k =
        spec && !strchr(spec, ':') ? kind_named(spec, strlen(spec)) : NULL;
    if (!k || k->kind == CDDP_DEVICE_CPU) return cddp_device_get(spec, err);
    int n = k->count(err);
    if (n < 0) return NULL;
    if (n == 0) {
        cddp_error_set(err, CDDP_ERANGE, "%s: this machine has no %s device", spec, k->name);
        return NULL;
    }
    long local = cddp_env_int("LOCAL_RANK");
    return k->open((int)((local > 0 ? local : 0) % n), err);
}
