/* lt.c: opens cuBLASLt (lt.h) once, by name, and keeps its functions and a handle. */
#include "tensor/cuda/lt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static cddp__cuda_lt lt;
static int status;
static char why[300];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    void *h = NULL;
    for (size_t i = 0; i < CDDP_ARRAY_LEN(names) && !h; i++) h = dlopen(names[i], RTLD_NOW);
    if (!h) {
        snprintf(why, sizeof why,
                 "the CUDA device needs cuBLASLt, and libcublasLt.so.13 cannot be loaded (%s): "
                 "install the CUDA toolkit's libraries or put them on LD_LIBRARY_PATH",
                 dlerror());
        status = CDDP_EUNSUPPORTED;
        return;
    }
#define LT_LOAD(name)                                                                              \
    if (!(*(void **)&lt.name = dlsym(h, #name))) {                                                 \
        snprintf(why, sizeof why, "cuBLASLt has no %s (too old?)", #name);                         \
        status = CDDP_EUNSUPPORTED;                                                                \
        return;                                                                                    \
    }
    CDDP__LT_FUNCTIONS(LT_LOAD)
#undef LT_LOAD
    cublasStatus_t s = lt.cublasLtCreate(&lt.handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cuBLASLt does not start (status %d)", (int)s);
        status = CDDP_EIO;
    }
}

int cddp__cuda_lt_init(cddp_error *err) {
    pthread_once(&once, load);
    return status ? cddp_error_set(err, status, "%s", why) : CDDP_OK;
}

const cddp__cuda_lt *cddp__cuda_lt_get(void) {
    pthread_once(&once, load);
    return status ? NULL : &lt;
}
